"""Where one sender's time goes: py-spy samples of a sender draining N no-op posts.

N posts over K containers are queued with `queue_many`, then one `Sender` (run_outbox's loop at
its defaults, in this process: `once`, so that it returns when nothing is left) drains them
through the connector that delivers nowhere (bench/connectors.py), while py-spy samples this
process (`pip install py-spy`; it attaches to the process, which needs ptrace rights: root, or
kernel.yama.ptrace_scope 0).

Two views:

- `--mode gil` (the default): the samples of whichever thread holds the GIL, the loop's or a
  send thread's: the Python per post, which the load of the machine does not inflate much (a
  thread waiting for the database or for the GIL holds no sample);
- `--mode wall`: the loop thread's every sample, waiting included: where a turn's wall time
  goes (the database round trips, the waits for the GIL and for the next result).

It prints the drain's posts/s (py-spy slows it a little), the turns, the process's CPU time
per post (every thread, the client's side of the database calls included), and the functions with the
most samples, each in microseconds per post: `own` in the function itself, `total` with what
it called. (cProfile cannot tell: since Python 3.12 it hears every thread's calls through
sys.monitoring, and folds them into one stack.)

    .venv/bin/python bench/sender_profile.py                      # N=20000 K=1000, top 25
    .venv/bin/python bench/sender_profile.py --mode wall --top 40 --sort total
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from common import drain_arguments, reset_tables, setup

LOOP_THREAD = "MainThread"


def queue(n: int, k: int) -> None:
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    with transaction.atomic():
        for first in range(0, n, 1000):
            outbox.queue_many(
                dict(post_id=f"p{i:07d}", workspace_id="W", container_id=f"C{i % k}", body={"i": i})
                for i in range(first, min(first + 1000, n))
            )


def spy(output: Path, rate: int, mode: str) -> subprocess.Popen[bytes]:
    """py-spy recording this process until it is sent SIGINT (raw stacks, by function)."""
    executable = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if executable is None:
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    command = [executable, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--format", "raw"]
    command += ["--function", "--threads", "--nonblocking", "--output", str(output)]
    command += ["--gil"] if mode == "gil" else ["--idle"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached (it samples nothing of the drain before this)
    if process.poll() is not None:
        raise SystemExit(
            f"py-spy could not attach: {process.stderr.read().decode() if process.stderr else ''}"
        )
    return process


def read_stacks(path: Path, mode: str) -> tuple[Counter[str], Counter[str], int]:
    """Samples per function: in the function itself, anywhere in the stack; and in all."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, _, frames = stack.partition(";")
        if mode == "wall" and not thread.endswith(LOOP_THREAD):
            continue
        n = int(count)
        samples += n
        functions = [short(frame) for frame in frames.split(";")] if frames else ["(no Python frame)"]
        own[functions[-1]] += n
        for function in set(functions):
            total[function] += n
    return own, total, samples


def short(frame: str) -> str:
    """`function (file:line)` with the file's path cut to its package."""
    name, _, where = frame.partition(" (")
    for marker in ("site-packages/", "django_connector_outbox/", "python3.12/"):
        if marker in where:
            where = where[where.index(marker) :]
    return f"{name} ({where}" if where else name


def main() -> None:
    parser = drain_arguments(__doc__)
    parser.add_argument("--mode", choices=["gil", "wall"], default="gil", help="what is sampled (gil)")
    parser.add_argument("--rate", type=int, default=250, help="samples per second (250)")
    parser.add_argument("--top", type=int, default=25, help="functions to print (25)")
    parser.add_argument("--sort", choices=["own", "total"], default="own", help="order (own)")
    args = parser.parse_args()
    setup(args.database_url)

    from django_connector_outbox.models import Post
    from django_connector_outbox.sender import Sender

    reset_tables()
    queue(args.n, args.k)
    sender = Sender(["bench"], once=True)
    with tempfile.TemporaryDirectory() as directory:
        output = Path(directory) / "stacks.txt"
        spying = spy(output, args.rate, args.mode)
        started, cpu_started = time.perf_counter(), time.process_time()
        sender.run()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        spying.send_signal(signal.SIGINT)
        spying.wait(timeout=60)
        own, total, samples = read_stacks(output, args.mode)
    posted = Post.objects.filter(state="posted").count()
    reset_tables()
    if posted != args.n:
        raise SystemExit(f"FAILED: {posted}/{args.n} posted")
    per_post = 1e6 / args.rate / args.n  # µs of one sample, per post
    print(f"N={args.n:,} K={args.k:,}: {args.n / elapsed:,.0f} posts/s under py-spy, {sender._turns:,} turns")
    print(
        f"the sender's process CPU time (every thread, user and system): {cpu * 1e6 / args.n:,.1f} µs per post"
    )
    view = (
        "the thread holding the GIL"
        if args.mode == "gil"
        else f"the loop thread ({LOOP_THREAD}), waits included"
    )
    print(f"samples of {view}: {samples:,} at {args.rate}/s, {samples * per_post:,.1f} µs per post in all")
    print(f"{'own µs/post':>12} {'total µs/post':>14}  function")
    ranked = own if args.sort == "own" else total
    for function, _ in ranked.most_common(args.top):
        print(f"{own[function] * per_post:12.1f} {total[function] * per_post:14.1f}  {function}")


if __name__ == "__main__":
    main()
