"""Wake-up latency of an idle sender: from the queueing transaction's commit to the send's start.

An idle `run_outbox` process (PostgreSQL) serves one source whose connector is the test
gate (tests/proof_connectors.py): every send connects to this program's unix socket, so
`accept()` returning is "the send started". For each of N posts this program waits until the
sender is idle again (its "post posted" log line, then a random pause), queues one post in a
transaction, notes the time just before COMMIT, and measures until the send connects.

Two senders are measured one after the other:

- notify: LISTEN/NOTIFY on, POLL_INTERVAL 30 s (polling cannot explain a fast wake-up);
- poll: the listener switched off in that process, POLL_INTERVAL as given (default 1 s), to
  show what the NOTIFY saves. Its pauses are drawn over a whole poll interval, so that the
  queueing falls at a random phase of the poll.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/outbox_bench_latency python bench/latency.py
        [--posts 50] [--poll 1.0]

The database is created if needed, migrated and emptied. Figures are printed in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench_latency"


def configure(database_url: str, outbox_settings: dict) -> None:
    import json

    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.proof_settings"
    os.environ["OUTBOX_PROOF_SETTINGS"] = json.dumps(outbox_settings)
    import django

    django.setup()


def create_database(database_url: str) -> None:
    import psycopg

    url = urlparse(database_url)
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [url.path[1:]]).fetchone():
            conn.execute(f'CREATE DATABASE "{url.path[1:]}"')


def serve_polling() -> None:
    """run_outbox with its NOTIFY listener switched off (this process only): it can only poll."""
    import django

    django.setup()
    from django.core.management import call_command

    from django_connector_outbox.wakeup import Wakeup

    Wakeup.start = lambda self: None  # type: ignore[method-assign]
    call_command("run_outbox", *sys.argv[2:])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(senders, config, gate, *, mode: str, posts: int, poll: float, rng: random.Random) -> list[float]:
    from django.db import transaction

    from django_connector_outbox import Outbox
    from django_connector_outbox.models import Lane, Post

    Post.objects.all().delete()
    Lane.objects.all().delete()
    if mode == "notify":
        sender = senders.start(config, "-v", "2", name="notify")
        sender.wait_for_line("listening for wake-ups")
        pause = (0.05, 0.3)
    else:
        program = [sys.executable, str(Path(__file__).resolve()), "serve-polling"]
        sender = senders.start(config, "-v", "2", "--poll", str(poll), name="poll", program=program)
        sender.wait_for_line("sender started")
        pause = (0.0, poll)
    outbox = Outbox("gate")
    latencies = []
    try:
        for n in range(posts):
            time.sleep(rng.uniform(*pause))  # the sender idles; a random phase of its poll
            post_id = f"{mode}-{n}"
            with transaction.atomic():
                outbox.queue(post_id, workspace_id="T1", container_id="C1", body={"n": n})
                committing = time.perf_counter()
            got, conn, started = gate.accept(timeout=poll + 30)
            assert got == post_id, (got, post_id)
            latencies.append(started - committing)
            mark = len(sender.lines)
            gate.answer(conn, b"D")
            sender.wait_for_line(rf"post posted post_id={post_id} ", start=mark)
    finally:
        code = sender.stop()
    assert code == 0, sender.stderr
    return latencies


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve-polling":
        sys.path.insert(0, str(ROOT))
        serve_polling()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_URL))
    parser.add_argument("--posts", type=int, default=50)
    parser.add_argument("--poll", type=float, default=1.0, help="POLL_INTERVAL of the polling sender (1.0)")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    if not options.database_url.startswith("postgres"):
        parser.error("NOTIFY wake-ups need PostgreSQL: give a postgres:// --database-url")

    with tempfile.TemporaryDirectory() as tmp:
        address = str(Path(tmp) / "gate.sock")
        config = {
            "CONNECTORS": {
                "gate": {"BACKEND": "tests.proof_connectors.GateConnector", "OPTIONS": {"address": address}}
            },
            "POLL_INTERVAL": 30,
        }
        create_database(options.database_url)
        configure(options.database_url, config)
        from django.core.management import call_command
        from django.db import connection

        from tests.proof_connectors import Gate, Senders

        call_command("migrate", verbosity=0)
        gate = Gate(address)
        senders = Senders(connection.settings_dict["NAME"])
        rng = random.Random(options.seed)
        results = {}
        try:
            for mode in ("notify", "poll"):
                results[mode] = measure(
                    senders, config, gate, mode=mode, posts=options.posts, poll=options.poll, rng=rng
                )
        finally:
            senders.close()
            gate.close()

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"commit -> send start, {options.posts} posts each, PostgreSQL, load average {load}")
    print(f"{'wake-up':<28} {'median':>8} {'p95':>8} {'max':>8} {'mean':>8}  (ms)")
    labels = {"notify": "LISTEN/NOTIFY (poll 30 s)", "poll": f"polling only (poll {options.poll:g} s)"}
    for mode, values in results.items():
        ms = [v * 1000 for v in values]
        print(
            f"{labels[mode]:<28} {statistics.median(ms):8.1f} {percentile(ms, 0.95):8.1f} "
            f"{max(ms):8.1f} {statistics.fmean(ms):8.1f}"
        )


if __name__ == "__main__":
    main()
