"""Run the schedule explorer (tests/simulation) for as many schedules as asked.

    python bench/simulate.py --schedules 10000 [--seed S] [--database-url URL]
    python bench/simulate.py --seed S --events 0,3,5     # replay one (shrunk) schedule
    python bench/simulate.py --threads ...                # worlds where some posts are replies

Seeds S, S+1, ... are played on a test database of URL (created if needed, kept: test_<name>;
SQLite: a temporary file of this run), each failure is shrunk and printed with its replay
command, and a summary line ends the run:
schedules, events, posts, sends, failures found, runtime. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--events", help="replay only these events of --seed (comma-separated indices)")
    parser.add_argument("--trace", action="store_true", help="with --events: print what each event did")
    parser.add_argument(
        "--strict", action="store_true", help="fail on known defects too (see KNOWN_DEFECTS in explorer.py)"
    )
    parser.add_argument(
        "--threads", action="store_true", help="worlds where some posts are replies (thread_of)"
    )
    parser.add_argument("--database-url", default="sqlite://")
    args = parser.parse_args()

    setup(args.database_url)
    from tests.simulation.explorer import KNOWN_DEFECTS, explore, replay_command, run_schedule

    tolerate = () if args.strict else tuple(KNOWN_DEFECTS)
    if args.events is not None:
        result = run_schedule(
            args.seed, [int(n) for n in args.events.split(",") if n], tolerate, trace=args.trace,
            threads=args.threads,
        )  # fmt: skip
        print("\n".join(result.trace))
        print(f"{replay_command(result)}: {result.failure or 'passed'}")
        return 1 if result.failure else 0
    summary = explore(range(args.seed, args.seed + args.schedules), tolerate=tolerate, threads=args.threads)
    print("exercised: " + ", ".join(f"{name}={count}" for name, count in sorted(summary.stats.items())))
    print(summary.line())
    return 1 if summary.failures else 0


def setup(database_url: str) -> None:
    """Django with the test settings on a test database of `database_url` (kept between runs)."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    # Each run its own SQLite file: two runs at once must not share tables.
    sqlite = tempfile.NamedTemporaryFile(prefix="simulate-", suffix=".sqlite3")  # noqa: SIM115 - lives with the process
    atexit.register(sqlite.close)
    os.environ["SQLITE_TEST_NAME"] = sqlite.name
    sys.path.insert(0, str(ROOT))
    import django
    from django.db import connection

    django.setup()
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=True)


if __name__ == "__main__":
    sys.exit(main())
