"""One outcome vocabulary (posts.Outcome): each outcome has one spelling, from the history to
the metrics.

A scan of the package fails when an outcome word is written as a bare string outside posts.py
(and the migrations, which keep the words of their day); the sender's run through each outcome
shows that the history, the summary line, the log line, the signal and the metrics' label all
spell it alike. On PostgreSQL the history rows of retry, hold and settle are written by the SQL
store's FINISH statement, whose outcome words are thereby held to the enum (and, on every
database, every word quoted in that store's SQL is one of posts' vocabularies).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_connector_outbox import Outbox, signals
from django_connector_outbox.conf import NOTIFY_CHANNEL
from django_connector_outbox.connectors import connectors
from django_connector_outbox.models import Attempt
from django_connector_outbox.posts import HISTORY_OUTCOMES, RECORDED, Action, Kind, Outcome, Scope, State
from django_connector_outbox.sender import REPORTS, SUMMARY_COUNTERS, Sender, held_counter
from django_connector_outbox.store import postgres

PACKAGE = Path(__file__).resolve().parent.parent / "django_connector_outbox"
# The words of outcomes that are not also a post's state or an action (those are checked in
# collections only), the summary's counters of wider holds, and the spellings retired.
OUTCOME_WORDS = (
    (set(Outcome.values) - set(State.values) - set(Action.values))
    | {held_counter(scope) for scope in Scope}
    | {"lost", "lost_replies"}
)
# The same word meaning something else, each allowed as many times as listed.
ALLOWED = {
    ("admin.py", "held"): 1,  # GateAdmin.list_display: the column of Gate.held (until when)
    ("management/commands/outbox_status.py", "held"): 1,  # --json: how many posts are held
}


def strings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node


def collections_of_outcomes(tree: ast.AST) -> Iterator[ast.AST]:
    """Tuples, lists, sets and dicts whose items (a dict's keys) hold two outcome words or more."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        else:
            continue
        words = [i.value for i in items if isinstance(i, ast.Constant) and i.value in Outcome.values]
        if len(words) >= 2:
            yield node


def package_files() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "posts.py" and "migrations" not in path.relative_to(PACKAGE).parts
    ]


def test_no_outcome_is_spelled_as_a_bare_string_outside_posts():
    found: dict[tuple[str, str], list[int]] = {}
    for path in package_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        name = path.relative_to(PACKAGE).as_posix()
        for node in strings(tree):
            # A word, or the head of an f-string that adds to one (f"held_{scope}").
            word = node.value[:-1] if node.value.endswith("_") else node.value
            if node.value in OUTCOME_WORDS or (word in OUTCOME_WORDS and word != node.value):
                found.setdefault((name, node.value), []).append(node.lineno)
        for node in collections_of_outcomes(tree):
            found.setdefault((name, "a collection of outcome words"), []).append(node.lineno)
    misspelled = {key: lines for key, lines in found.items() if len(lines) != ALLOWED.get(key)}
    assert misspelled == {}, "use posts.Outcome"


def test_the_scan_finds_a_bare_outcome_word_and_a_list_of_them():
    # The scan itself: what it must catch (a mutation of the package, without touching it).
    spelled = ast.parse('stats["lost_reply"] += 1\nkey = f"held_{scope}"\nHANDLED = ("posted", "failed")')
    assert [node.value for node in strings(spelled) if node.value in OUTCOME_WORDS] == ["lost_reply"]
    assert "held_" in [node.value for node in strings(spelled)]
    assert len(list(collections_of_outcomes(spelled))) == 1


def test_every_outcome_has_one_report_and_the_reported_ones_one_signal_and_summary_counter():
    assert set(REPORTS) == set(Outcome)
    assert set(RECORDED.values()) | {Outcome.FAILED, Outcome.UNCERTAIN} == set(Outcome)  # settle: its state
    reported = {report.counter for report in REPORTS.values()}
    # Found is reported as posted; a claim given back and a retract's delete dropped are the
    # sender's counters only (nothing happened on the platform).
    assert reported == set(signals.OUTCOME_SIGNALS) | {Outcome.GIVEN_BACK, Outcome.DROPPED}
    assert reported <= set(SUMMARY_COUNTERS)
    assert [value for value, _ in Attempt._meta.get_field("outcome").choices] == list(HISTORY_OUTCOMES)


def test_the_postgresql_store_quotes_only_words_of_the_vocabularies():
    # Its statements write outcomes ('retried', 'held' into the history), states and actions
    # as SQL literals: each one must be a word of posts, so a misspelling ('lost') fails here.
    vocabulary = {*Action.values, *State.values, *Kind.values, *Scope.values, *Outcome.values, NOTIFY_CHANNEL}
    quoted = {
        name: set(re.findall(r"'([a-z_]+)'", sql))
        for name, sql in vars(postgres).items()
        if name.isupper() and isinstance(sql, str)
    }
    assert {"retried", "held"} <= set().union(*quoted.values())
    assert {name: words - vocabulary for name, words in quoted.items() if words - vocabulary} == {}


# -- one spelling along the whole way ------------------------------------------------------------------

LEASE = 120  # the default


def queue(clock: Any, kind: str = Kind.MESSAGE) -> None:
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("p1", workspace_id="T1", container_id="C1", kind=kind, body={"text": "p1"})


def run(clock: Any) -> Sender:
    sender = Sender(["memory"], once=True, clock=clock, worker="w1")
    sender.run()
    return sender


def lost_then(clock: Any, kind: str = Kind.MESSAGE) -> Sender:
    """A reply lost, then the post taken back after its lease and looked up."""
    queue(clock, kind)
    connectors["memory"].lose_next_reply()
    run(clock)
    clock.advance(LEASE)
    return run(clock)


def once(script: Callable[[Any], None]) -> Callable[[Any], Sender]:
    def scenario(clock: Any) -> Sender:
        queue(clock)
        script(connectors["memory"])
        return run(clock)

    return scenario


# (the outcome recorded, as the words spell it; the outcome reported; how to get there)
SCENARIOS = {
    "posted": ("posted", "posted", once(lambda platform: None)),
    "found": ("found", "posted", lost_then),
    "retried": ("retried", "retried", once(lambda platform: platform.fail_next("HTTP 503"))),
    "held": ("held", "held", once(lambda platform: platform.rate_limit_next(30, scope=Scope.WORKSPACE))),
    "failed": ("failed", "failed", once(lambda platform: platform.fail_next("nope", permanent=True))),
    # An ephemeral post leaves no trace: after a lost reply, it cannot be looked up.
    "uncertain": ("uncertain", "uncertain", lambda clock: lost_then(clock, Kind.EPHEMERAL)),
    "lost_reply": ("lost_reply", "lost_reply", once(lambda platform: platform.lose_next_reply())),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", SCENARIOS)
def test_each_outcome_is_spelled_alike_in_the_history_summary_log_signal_and_metrics(
    name: str, clock: Any, package_log: Any
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from django_connector_outbox import metrics  # noqa: F401  (connects the counters)

    recorded, reported, scenario = SCENARIOS[name]

    def counted() -> float:
        labels = {"source": "memory", "outcome": reported}
        return prometheus_client.REGISTRY.get_sample_value("connector_outbox_outcomes_total", labels) or 0.0

    signalled: list[str] = []

    def receiver(**kwargs: Any) -> None:
        signalled.append(kwargs["claim"].post_id)

    before = counted()
    signals.OUTCOME_SIGNALS[Outcome(reported)].connect(receiver)
    try:
        sender = scenario(clock)
    finally:
        signals.OUTCOME_SIGNALS[Outcome(reported)].disconnect(receiver)

    # The run that ended in it reported it once, under its one word, everywhere.
    assert sender.stats[reported] == 1
    summary = [r.getMessage() for r in package_log.records if r.msg.startswith("summary ")][-1]
    assert f" {reported}=1 " in summary
    assert counted() == before + 1
    assert signalled == ["p1"]
    [line] = [r for r in package_log.records if r.getMessage().startswith(f"post {reported} post_id=p1 ")]
    assert line.outcome == reported
    history = list(Attempt.objects.order_by("pk").values_list("outcome", flat=True))
    if Outcome(recorded) in HISTORY_OUTCOMES:
        assert history[-1] == recorded
    if name == "held":
        assert sender.stats["held_workspace"] == 1
