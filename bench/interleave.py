"""Run the interleaving explorer (tests/simulation/interleave.py) for as many seeds as asked.

    python bench/interleave.py --interleavings 200 [--seed S] [--database-url URL] [--store orm]
    python bench/interleave.py --seed S --schedule 3,1,t31,0 [--ops 0,2,5]   # replay one

Seeds S, S+1, ... are played on a test database of URL (created if needed, kept: test_<name>;
SQLite: a temporary file of this run), each failure is shrunk and printed with its replay
command, and a summary line ends the run: interleavings, steps, lock waits seen, failures (by
invariant), runtime. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from simulate import setup  # noqa: E402 - after the path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interleavings", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--seconds", type=float, help="stop starting new interleavings after this long")
    parser.add_argument("--schedule", help="replay this schedule of --seed (comma-separated choices)")
    parser.add_argument("--ops", help="with --schedule: only these operations of the world")
    parser.add_argument("--trace", action="store_true", help="with --schedule: print each step granted")
    parser.add_argument("--store", choices=("auto", "orm"), default="auto", help="PostgreSQL: the store")
    parser.add_argument("--no-order", action="store_true", help="do not check queue order")
    parser.add_argument(
        "--reversed-batches", action="store_true", help="queue_many lists in descending id order (hole 1)"
    )
    parser.add_argument(
        "--mixed-transactions",
        action="store_true",
        help="a producer's transaction may queue into several containers",
    )
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first failure")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--database-url", default="sqlite://")
    args = parser.parse_args()

    os.environ["OUTBOX_STORE"] = args.store
    setup(args.database_url)
    from tests.simulation.interleave import explore, replay_command, run_interleaving

    options = {
        "check_order": not args.no_order,
        "reversed_batches": args.reversed_batches,
        "mixed_transactions": args.mixed_transactions,
    }
    if args.schedule is not None:
        ops = None if args.ops is None else [int(n) for n in args.ops.split(",") if n]
        result = run_interleaving(
            args.seed, [c for c in args.schedule.split(",") if c], ops, trace=args.trace, **options
        )
        print("\n".join(result.trace))
        print(f"steps={result.steps} lock_waits={result.lock_waits} {dict(result.stats)}")
        print(f"{replay_command(result, **options)}: {result.failure or 'passed'}")
        return 1 if result.failure else 0
    deadline = time.monotonic() + args.seconds if args.seconds else None
    summary = explore(
        range(args.seed, args.seed + args.interleavings),
        deadline=deadline,
        stop_at_first=args.stop_at_first,
        shrink_budget=0 if args.no_shrink else 150,
        **options,
    )
    print("exercised: " + ", ".join(f"{name}={count}" for name, count in sorted(summary.stats.items())))
    if summary.first_failure_at is not None:
        print(f"first failure found at interleaving {summary.first_failure_at}")
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
