"""The sender keeps its promises with real processes: `python -m django run_outbox`.

The platform is a file outside the senders (tests/proof_connectors.py), so what reached it
survives any kill; the gate connector turns "a send started" into an event the test awaits.
Sender processes connect to this test's database through TEST_DATABASE_NAME.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import close_old_connections, connection, connections, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.housekeeping import Housekeeper
from django_connector_outbox.models import QUEUE_ORDER, Post
from tests.proof_connectors import ROOT, Gate, Senders, file_platform, gate, platform_lines

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

needs_row_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite serializes writers with one database lock: several senders add nothing to test "
    "there; run with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
)
session_locks = pytest.mark.skipif(
    connection.vendor == "sqlite",
    reason="SQLite has no session locks (one machine's file, writers serialized): every sender gets "
    "the housekeeping turn; run with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
)
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL (DATABASE_URL=postgres://...)"
)


@pytest.fixture
def the_gate(tmp_path):
    opened = Gate(tmp_path / "gate.sock")
    yield opened
    opened.close()


def outbox_settings(connectors, **values):
    return {"CONNECTORS": connectors, **values}


def states() -> dict[str, tuple[str, int, str]]:
    """post id -> (state, attempts, last_error), read afresh."""
    return {
        p: (s, a, e)
        for p, s, a, e in Post.objects.with_claim().values_list(
            "post_id", "current_state", "current_attempts", "last_error"
        )
    }


def wait_until_final(total: int, deadline: float, senders: Senders) -> None:
    """Poll the database until no post is queued or sending (the state to wait for has no event)."""
    while Post.objects.active().exists():
        if time.monotonic() > deadline:
            left = Counter(Post.objects.values_list("state", flat=True))
            raise AssertionError(f"posts left unfinished: {dict(left)} of {total}\n{senders.stderr()}")
        time.sleep(0.1)


def queue_order() -> dict[str, list[str]]:
    """container -> its post ids in queue order, (queued_at, id)."""
    order: dict[str, list[str]] = defaultdict(list)
    for container, post_id in Post.objects.order_by(*QUEUE_ORDER).values_list("container_id", "post_id"):
        order[container].append(post_id)
    return order


def assert_created_in_queue_order(lines, order: dict[str, list[str]]) -> None:
    creates = [line for line in lines if line["op"] == "create"]
    for container, expected in order.items():
        got = [line["post_id"] for line in creates if line["container"] == container]
        present = set(got)
        assert got == [post_id for post_id in expected if post_id in present], (
            f"container {container} out of order"
        )


# -- end to end, on every backend -----------------------------------------------------------------


def test_once_delivers_a_mixed_batch_in_order_per_container(senders, tmp_path):
    path = tmp_path / "platform.jsonl"
    config = outbox_settings({"file": file_platform(path)})
    with override_settings(CONNECTOR_OUTBOX=config):
        outbox = Outbox("file")
        for seq in range(4):
            for container in ("C1", "C2", "C3"):
                outbox.queue(
                    f"{container}-m{seq}",
                    workspace_id="T1",
                    container_id=container,
                    body={"seq": seq, "text": "hi"},
                )
            if seq == 1:
                outbox.set_status("C1-status", workspace_id="T1", container_id="C1", body={"text": "working"})
                outbox.queue(
                    "C2-reaction", workspace_id="T1", container_id="C2", kind="reaction",
                    body={"name": "eyes", "timestamp": "1.2"},
                )  # fmt: skip
                outbox.queue(
                    "C3-ephemeral", workspace_id="T1", container_id="C3", kind="ephemeral",
                    body={"user": "U1", "text": "only you"},
                )  # fmt: skip
        # Changed twice before it is sent: only the latest body goes out, once.
        outbox.set_status("C1-status", workspace_id="T1", container_id="C1", body={"text": "still working"})
        outbox.set_status("C1-status", workspace_id="T1", container_id="C1", body={"text": "done"})
    order = queue_order()

    sender = senders.start(config, "--once")
    assert sender.wait(60) == 0, sender.stderr

    assert {state for state, _, _ in states().values()} == {"posted"}, sender.stderr
    lines = platform_lines(path)
    assert Counter(line["post_id"] for line in lines) == Counter({post_id: 1 for post_id in states()})
    assert {line["op"] for line in lines} == {"create"}
    [status] = [line for line in lines if line["post_id"] == "C1-status"]
    assert (status["kind"], status["rev"]) == ("status", 2)
    assert_created_in_queue_order(lines, order)
    assert Post.objects.get(post_id="C1-status").body == {"text": "done"}
    assert "summary worker=" in sender.stderr


# -- slow sends against a short lease (issue 9, hole 1) --------------------------------------------


@needs_row_locks
def test_slow_sends_under_a_short_lease_reach_the_platform_once(senders, tmp_path):
    # Sends of 0.6 s under a 1 s lease. A sender used to claim more than it could start
    # (--concurrency 1 --batch 6: seven claims), and sent the waiting ones after their lease
    # had ended, while a second sender took them back, looked them up, and sent them too. A
    # sender now claims only what it starts at once, and never starts a claim past its lease.
    path = tmp_path / "platform.jsonl"
    config = outbox_settings({"file": file_platform(path, latency=0.6)}, LEASE=1)
    with override_settings(CONNECTOR_OUTBOX=config):
        outbox = Outbox("file")
        for n in range(8):
            outbox.queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"seq": n})
    first = senders.start(config, "--concurrency", "1", "--batch", "6")
    deadline = time.monotonic() + 20
    while not Post.objects.in_state("sending").exists():
        assert time.monotonic() < deadline and first.alive(), first.stderr
        time.sleep(0.05)
    second = senders.start(config, "--concurrency", "2", "--batch", "6")
    wait_until_final(8, time.monotonic() + 60, senders)
    for process in (first, second):
        assert process.stop() == 0, process.stderr

    creates = Counter(line["post_id"] for line in platform_lines(path) if line["op"] == "create")
    assert creates == Counter({f"p{n}": 1 for n in range(8)})
    assert {state for state, _, _ in states().values()} == {"posted"}


# -- several sources, one sender (issue 9, hole 9) -----------------------------------------------


def test_a_quiet_sources_post_is_not_starved_by_a_busy_sources_backlog(senders, tmp_path):
    # Both sources write to one platform file, so its lines give the order of the sends.
    path = tmp_path / "platform.jsonl"
    platform = file_platform(path, latency=0.02)
    config = outbox_settings({"busy": platform, "quiet": platform})
    with override_settings(CONNECTOR_OUTBOX=config):
        Outbox("busy").queue_many(
            dict(post_id=f"b{n:03d}", workspace_id="T1", container_id=f"C{n}", body={"seq": n})
            for n in range(300)
        )
        sender = senders.start(config, "--concurrency", "2", "--batch", "2")
        deadline = time.monotonic() + 20
        while Post.objects.filter(state="posted").count() < 10:  # the sender is busy with "busy"
            assert time.monotonic() < deadline and sender.alive(), sender.stderr
            time.sleep(0.02)
        Outbox("quiet").queue("q1", workspace_id="T1", container_id="Q", body={"seq": 0})
        sent_before = len(platform_lines(path))
    wait_until_final(301, time.monotonic() + 60, senders)
    assert sender.stop() == 0, sender.stderr

    order = [line["post_id"] for line in platform_lines(path) if line["op"] == "create"]
    # Sent within a few turns of being queued, not after the busy source's 290-post backlog.
    assert order.index("q1") < sent_before + 10, order.index("q1") - sent_before


# -- crash test: senders killed at random while they deliver 3,000 posts ---------------------------

CRASH_POSTS = 3000
CRASH_CONTAINERS = 30
CRASH_SENDERS = 3
CRASH_KILLS = 12


def queue_crash_posts(outbox: Outbox, rng: random.Random) -> None:
    """100 posts per container, queued in rounds across containers; ~5% ephemeral, ~5%
    reactions, ~3% status posts (some set twice), the rest messages."""
    per_container = CRASH_POSTS // CRASH_CONTAINERS
    for round_ in range(0, per_container, 10):
        batch = []
        for c in range(CRASH_CONTAINERS):
            container = f"c{c:02d}"
            for seq in range(round_, round_ + 10):
                post_id = f"{container}-{seq:03d}"
                roll = rng.random()
                if roll < 0.03:
                    outbox.queue_many(batch)  # keeps the queue order of the rows before it
                    batch = []
                    outbox.set_status(
                        post_id, workspace_id="W", container_id=container, body={"seq": seq, "v": 1}
                    )
                    if rng.random() < 0.5:
                        outbox.set_status(
                            post_id, workspace_id="W", container_id=container, body={"seq": seq, "v": 2}
                        )
                    continue
                kind = "ephemeral" if roll < 0.08 else "reaction" if roll < 0.13 else "message"
                batch.append(
                    dict(
                        post_id=post_id,
                        workspace_id="W",
                        container_id=container,
                        kind=kind,
                        body={"seq": seq},
                    )
                )
        outbox.queue_many(batch)
    assert Post.objects.count() == CRASH_POSTS


@pytest.mark.budget
@needs_row_locks
def test_senders_killed_at_random_lose_nothing_and_send_nothing_twice(senders, tmp_path):
    path = tmp_path / "platform.jsonl"
    config = outbox_settings(
        {"file": file_platform(path, lose_rate=0.03, rate_limit_rate=0.03, seed=11, latency=0.002)},
        LEASE=1, POLL_INTERVAL=0.2, MAX_ATTEMPTS=10,
    )  # fmt: skip
    rng = random.Random(2026)
    with override_settings(CONNECTOR_OUTBOX=config):
        queue_crash_posts(Outbox("file"), rng)
    order = queue_order()
    kinds = dict(Post.objects.values_list("post_id", "kind"))
    args = ("--concurrency", "4", "--batch", "10")

    # The chaos schedule: SIGKILL a random sender (one past its start-up) at random moments and
    # start a new one. A moment is a random point of the run's progress (how many posts are
    # final), so that every kill lands while posts are moving however fast the machine is.
    kill_at = sorted(rng.uniform(0.02, 0.85) * CRASH_POSTS for _ in range(CRASH_KILLS))
    started = time.monotonic()
    live = [senders.start(config, *args) for _ in range(CRASH_SENDERS)]
    kills = 0
    # A hang detector, not a speed target: a stranded post never finishes; a loaded machine
    # (MariaDB took 42-50 s here with other work running) only takes longer.
    deadline = started + 120
    # Polls the database for the end: there is no event for "all posts final".
    while active := Post.objects.filter(state__in=("queued", "sending")).count():
        now = time.monotonic()
        if now > deadline:
            left = Counter(Post.objects.values_list("state", flat=True))
            raise AssertionError(f"unfinished after {now - started:.0f}s: {dict(left)}\n{senders.stderr()}")
        for process in live:
            assert process.alive(), f"a sender died on its own\n{process.stderr}"
        working = [process for process in live if any("sender started" in line for line in process.lines)]
        if kills < CRASH_KILLS and CRASH_POSTS - active >= kill_at[kills] and working:
            victim = working[rng.randrange(len(working))]
            live.remove(victim)
            victim.kill()
            kills += 1
            live.append(senders.start(config, *args))
        time.sleep(0.05)
    duration = time.monotonic() - started
    for process in live:
        assert process.stop() == 0, process.stderr

    final = states()
    lines = platform_lines(path)
    creates = Counter(line["post_id"] for line in lines if line["op"] == "create")
    by_state = Counter(state for state, _, _ in final.values())
    lost = sum(1 for line in lines if line.get("lost"))
    rate_limits = sum(1 for line in lines if line["op"] == "rate_limited")
    uncertain_sent = sum(1 for p, (s, _, _) in final.items() if s == "uncertain" and creates[p])
    print(
        f"\ncrash test on {connection.vendor}: posts={len(final)} posted={by_state['posted']} "
        f"uncertain={by_state['uncertain']} (of which reached the platform: {uncertain_sent}) kills={kills} "
        f"lost_replies={lost} rate_limits={rate_limits} edits={sum(1 for x in lines if x['op'] == 'edit')} "
        f"senders_started={len(senders.started)} duration={duration:.1f}s"
    )

    # Every post is final, posted or uncertain; nothing lost.
    assert set(by_state) <= {"posted", "uncertain"}, (dict(by_state), senders.stderr())
    assert by_state["posted"] + by_state["uncertain"] == CRASH_POSTS
    # Only what cannot be looked up may be uncertain.
    assert {kinds[p] for p, (s, _, _) in final.items() if s == "uncertain"} <= {"ephemeral"}
    # Nothing was created twice; whatever was posted is in the platform exactly once.
    assert [p for p, n in creates.items() if n > 1] == []
    assert [p for p, (s, _, _) in final.items() if s == "posted" and creates[p] != 1] == []
    # Status posts are created once, then only edited.
    edits = {line["post_id"] for line in lines if line["op"] == "edit"}
    assert {kinds[p] for p in edits} <= {"status"}
    # Per container, the platform got the posts in queue order.
    assert_created_in_queue_order(lines, order)
    # The run did exercise the paths it is meant to.
    assert kills == CRASH_KILLS and lost and rate_limits


# -- stopping ---------------------------------------------------------------------------------------


def queue_gate_posts(config, count: int) -> None:
    with override_settings(CONNECTOR_OUTBOX=config):
        outbox = Outbox("gate")
        for n in range(count):
            outbox.queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"seq": n})


def test_sigterm_finishes_the_send_in_flight_and_claims_nothing_more(senders, the_gate):
    config = outbox_settings({"gate": gate(the_gate.address)}, LEASE=60)
    queue_gate_posts(config, 8)
    sender = senders.start(config, "--concurrency", "1", "--batch", "5")

    in_flight, conn, _ = the_gate.accept(timeout=20)
    # A sender claims no more than it can start (one send slot: one claim), so that no claim
    # waits while its lease runs; the other posts were never taken.
    during = states()
    assert during[in_flight][0] == "sending"
    assert all(during[p] == ("queued", 0, "") for p in during if p != in_flight), during
    sender.signal(signal.SIGTERM)
    line = sender.wait_for_line(r"sender stopping .*given_back=\d+")
    assert line.endswith("in_flight=1 given_back=0")

    the_gate.answer(conn, b"D")
    assert sender.wait(20) == 0, sender.stderr
    after = states()
    assert after[in_flight][:2] == ("posted", 0)
    assert all(after[p] == ("queued", 0, "") for p in after if p != in_flight), after
    assert "forced=False" in sender.stderr


def test_a_second_sigterm_exits_at_once_while_a_send_blocks(senders, the_gate):
    config = outbox_settings({"gate": gate(the_gate.address)}, LEASE=60)
    queue_gate_posts(config, 2)
    sender = senders.start(config, "--concurrency", "1", "--batch", "1")

    in_flight, conn, _ = the_gate.accept(timeout=20)
    sender.signal(signal.SIGTERM)
    sender.wait_for_line("sender stopping")  # the first signal was handled
    sender.signal(signal.SIGTERM)
    code = sender.wait(5)  # promptly, while the send still blocks
    assert code == 128 + signal.SIGTERM, sender.stderr
    assert "second signal: exiting now" in sender.stderr
    # Left sending: after its lease it is looked up, never resent blind.
    assert states()[in_flight][0] == "sending"
    conn.close()


# -- the database goes away and comes back ------------------------------------------------------------


def postgresql_cluster() -> tuple[str, str] | None:
    """(version, name) of the local cluster serving the test database, if this user can restart it."""
    if not shutil.which("pg_ctlcluster") or os.geteuid() != 0:
        return None
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=False).stdout
    port = str(connection.settings_dict.get("PORT") or 5432)
    for row in listing.splitlines():
        fields = row.split()
        if len(fields) >= 3 and fields[2] == port:
            return fields[0], fields[1]
    return None


def pg_ctl(cluster: tuple[str, str], action: str, *options: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, action, *options],
        check=True, timeout=60, capture_output=True,
    )  # fmt: skip


def pg_online(cluster: tuple[str, str]) -> bool:
    status = subprocess.run(["pg_ctlcluster", *cluster, "status"], capture_output=True, check=False)
    return status.returncode == 0


def restart_postgresql(cluster: tuple[str, str], sender, while_down=lambda: None) -> None:
    """Stop PostgreSQL, do `while_down`, wait until `sender` has seen the database go, start it."""
    connection.close()  # ours would be cut by the stop anyway
    try:
        mark = len(sender.lines)
        pg_ctl(cluster, "stop", "-m", "fast")
        while_down()
        sender.wait_for_line("database unavailable", start=mark)
    finally:
        if not pg_online(cluster):
            pg_ctl(cluster, "start")
    close_old_connections()
    connection.close()


@postgresql_only
def test_the_sender_survives_a_database_restart(senders, tmp_path):
    cluster = postgresql_cluster()
    if cluster is None:
        pytest.skip("restarting PostgreSQL needs root and a local pg_ctlcluster cluster on the test port")
    path = tmp_path / "platform.jsonl"
    config = outbox_settings({"file": file_platform(path)}, LEASE=5, POLL_INTERVAL=0.5)

    def queue(start: int) -> None:
        with override_settings(CONNECTOR_OUTBOX=config):
            outbox = Outbox("file")
            outbox.queue_many(
                dict(post_id=f"p{n:02d}", workspace_id="T1", container_id=f"C{n % 3}", body={"seq": n})
                for n in range(start, start + 10)
            )

    queue(0)
    sender = senders.start(config)
    wait_until_final(10, time.monotonic() + 20, senders)

    restart_postgresql(cluster, sender)

    queue(10)
    wait_until_final(20, time.monotonic() + 30, senders)
    assert sender.alive(), sender.stderr
    assert {state for state, _, _ in states().values()} == {"posted"}
    creates = Counter(line["post_id"] for line in platform_lines(path) if line["op"] == "create")
    assert creates == Counter({f"p{n:02d}": 1 for n in range(20)})
    assert sender.stop() == 0, sender.stderr
    assert "listening for wake-ups" in sender.stderr


IN_FLIGHT = 2_000


def wait_for_creates(path, count: int, deadline: float, senders: Senders) -> None:
    """Poll the platform's file until it holds `count` creates (a send's arrival has no event
    the test could await across the process boundary)."""
    while sum(line["op"] == "create" for line in platform_lines(path)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} sends reached the platform\n{senders.stderr()}")
        time.sleep(0.1)


@postgresql_only
def test_a_platform_that_stops_answering_with_2000_sends_in_flight_then_a_database_restart_lose_nothing(
    senders, tmp_path
):
    # One sender, 2,000 coroutine sends in flight on a platform that has them all and answers
    # none; PostgreSQL stops while they wait, the platform answers, PostgreSQL comes back. Every
    # result waits in memory for the database; every post ends posted, each created once.
    cluster = postgresql_cluster()
    if cluster is None:
        pytest.skip("restarting PostgreSQL needs root and a local pg_ctlcluster cluster on the test port")
    path, stall = tmp_path / "platform.jsonl", tmp_path / "stall"
    stall.touch()
    platform = {
        "BACKEND": "tests.proof_connectors.StallingPlatformConnector",
        "OPTIONS": {"path": str(path), "stall": str(stall), "timeout": 60},
    }
    config = outbox_settings({"file": platform}, LEASE=180, POLL_INTERVAL=0.5)
    with override_settings(CONNECTOR_OUTBOX=config):
        Outbox("file").queue_many(
            dict(post_id=f"p{n:04d}-{k}", workspace_id="T1", container_id=f"C{n}", body={"seq": k})
            for n in range(IN_FLIGHT)
            for k in range(2)
        )
    sender = senders.start(config, f"--concurrency={IN_FLIGHT}")
    wait_for_creates(path, IN_FLIGHT, time.monotonic() + 60, senders)
    assert Post.objects.in_states(("sending",)).count() == IN_FLIGHT  # every container's head, waiting

    restart_postgresql(cluster, sender, while_down=stall.unlink)  # the platform answers meanwhile

    wait_until_final(2 * IN_FLIGHT, time.monotonic() + 120, senders)
    assert sender.alive(), sender.stderr
    assert Counter(state for state, _, _ in states().values()) == Counter({"posted": 2 * IN_FLIGHT})
    creates = Counter(line["post_id"] for line in platform_lines(path) if line["op"] == "create")
    assert creates == Counter({f"p{n:04d}-{k}": 1 for n in range(IN_FLIGHT) for k in range(2)})
    assert sender.stop() == 0, sender.stderr


@postgresql_only
def test_the_sender_survives_its_connections_being_terminated(senders, tmp_path):
    # pg_terminate_backend, as an operator or a failover does: the raw psycopg cursor of the
    # claim path raised psycopg's own OperationalError, which the sender did not take for a
    # database error, and run_outbox exited 1.
    path = tmp_path / "platform.jsonl"
    config = outbox_settings({"file": file_platform(path)}, LEASE=5, POLL_INTERVAL=0.5)

    def queue(start: int) -> None:
        with override_settings(CONNECTOR_OUTBOX=config):
            Outbox("file").queue_many(
                dict(post_id=f"p{n:02d}", workspace_id="T1", container_id=f"C{n % 3}", body={"seq": n})
                for n in range(start, start + 10)
            )

    queue(0)
    sender = senders.start(config)
    wait_until_final(10, time.monotonic() + 20, senders)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        [(terminated,)] = cursor.fetchall()
    assert terminated >= 1

    queue(10)
    wait_until_final(20, time.monotonic() + 30, senders)
    assert sender.alive(), sender.stderr
    creates = Counter(line["post_id"] for line in platform_lines(path) if line["op"] == "create")
    assert creates == Counter({f"p{n:02d}": 1 for n in range(20)})
    assert sender.stop() == 0, sender.stderr


# -- wake-up latency ---------------------------------------------------------------------------------


@postgresql_only
def test_an_idle_sender_wakes_on_notify_not_on_the_poll(senders, the_gate):
    # A 30-second poll: only the NOTIFY of the queueing transaction can explain a quick send.
    config = outbox_settings({"gate": gate(the_gate.address)}, POLL_INTERVAL=30)
    sender = senders.start(config)
    sender.wait_for_line("listening for wake-ups")

    with override_settings(CONNECTOR_OUTBOX=config):
        with transaction.atomic():
            Outbox("gate").queue("p1", workspace_id="T1", container_id="C1", body={"text": "wake up"})
            committing = time.perf_counter()
        post_id, conn, started = the_gate.accept(timeout=20)
    the_gate.answer(conn, b"D")
    latency = started - committing
    print(f"\ncommit -> send start: {latency * 1000:.1f} ms")
    assert post_id == "p1"
    assert latency < 1.0, sender.stderr
    assert sender.stop() == 0, sender.stderr


# -- housekeeping: one sender at a time ----------------------------------------------------------------


def turn_in_another_connection() -> bool:
    """Housekeeper.turn() on this thread's own connection (connections are per thread)."""
    result: list[bool] = []

    def take() -> None:
        try:
            with Housekeeper([], "default").turn() as mine:
                result.append(mine)
        finally:
            connections.close_all()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(20)
    return result[0]


HOLDER = """
import sys, django
django.setup()
from django_connector_outbox.housekeeping import Housekeeper
with Housekeeper([], "default").turn() as mine:
    print("mine" if mine else "not mine", flush=True)
    sys.stdin.read()
"""


@session_locks
def test_housekeeping_is_one_senders_turn_at_a_time():
    housekeeper = Housekeeper([], "default")
    with housekeeper.turn() as mine:
        assert mine is True
        assert turn_in_another_connection() is False
    assert turn_in_another_connection() is True


@session_locks
def test_a_killed_holder_frees_the_housekeeping_turn(senders):
    env = senders.env(
        outbox_settings({"memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}})
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "mine", holder.stderr.read() if holder.stderr else ""
        housekeeper = Housekeeper([], "default")
        with housekeeper.turn() as mine:
            assert mine is False
        holder.kill()
        holder.wait(10)
        # The server frees the lock when it notices the session ended: wait for that state.
        deadline = time.monotonic() + 10
        while True:
            with housekeeper.turn() as mine:
                if mine:
                    break
            assert time.monotonic() < deadline, "the dead holder's lock was never freed"
            time.sleep(0.05)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
        for stream in (holder.stdin, holder.stdout, holder.stderr):
            if stream is not None:
                stream.close()
