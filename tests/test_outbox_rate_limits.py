"""Scoped holds and pacing through the Outbox, on every backend, with the test clock.

A hold of the workspace (or the source) keeps every container of it from being claimed until
it ends, for every claimer; its posts keep their place and attempts. A pace lets at most
`count` claims of a container (workspace, source) through per `seconds`, as a token bucket.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Gate, Post
from django_connector_outbox.posts import Action, Finish

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def paced(pace):
    """The memory source with this PACE."""
    connectors = dict(settings.CONNECTOR_OUTBOX["CONNECTORS"])
    connectors["memory"] = {**connectors["memory"], "PACE": pace}
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": connectors})


def queue(outbox, post_id, container_id="C1", workspace_id="T1"):
    return outbox.queue(post_id, workspace_id=workspace_id, container_id=container_id, body={"text": post_id})


def claimed(outbox, limit=None):
    return sorted(c.post_id for c in outbox.claim(limit))


# -- scoped holds ---------------------------------------------------------------------------------------


def test_a_workspace_hold_keeps_every_container_of_the_workspace_until_it_ends(outbox, clock):
    queue(outbox, "a1", "C1")
    clock.advance(1)
    queue(outbox, "a2", "C2")
    queue(outbox, "b1", "C3", workspace_id="T2")
    [first] = outbox.claim(1)
    assert first.post_id == "a1"
    assert outbox.hold(first, 30, "429 from chat.postMessage", scope="workspace") is True

    assert claimed(outbox) == ["b1"]  # the other workspace goes on
    clock.advance(29)
    assert claimed(outbox) == []
    clock.advance(1)
    assert claimed(outbox) == ["a1", "a2"]
    a2 = Post.objects.with_claim().get(post_id="a2")
    assert (a2.current_attempts, a2.queued_at) == (1, clock.now - timedelta(seconds=30))


def test_a_held_post_keeps_its_attempt_and_its_neighbours_keep_their_place(outbox, clock):
    queue(outbox, "a1", "C1")
    queue(outbox, "a2", "C2")
    first, second = outbox.claim()
    outbox.posted(second)
    clock.advance(1)
    queue(outbox, "a3", "C2")
    assert outbox.hold(first, 10, scope="workspace") is True
    before = {
        p.post_id: (p.current_attempts, p.queued_at, p.next_at)
        for p in Post.objects.with_claim().filter(post_id="a3")
    }
    clock.advance(10)
    assert {
        p.post_id: (p.current_attempts, p.queued_at, p.next_at)
        for p in Post.objects.with_claim().filter(post_id="a3")
    } == before
    assert Post.objects.with_claim().get(post_id="a1").current_attempts == 0
    assert claimed(outbox) == ["a1", "a3"]


def test_a_source_hold_keeps_the_whole_source_and_no_other(outbox, clock):
    other = Outbox("other", clock=clock)
    queue(outbox, "a1", "C1")
    queue(outbox, "b1", "C9", workspace_id="T9")
    queue(other, "o1", "C1")
    first, _ = outbox.claim()
    outbox.hold(first, 60, "global rate limit", scope="source")
    outbox.posted(_)
    queue(outbox, "b2", "C9", workspace_id="T9")

    assert claimed(outbox) == []
    assert outbox.next_due() == clock.now + timedelta(seconds=60)
    assert claimed(other) == ["o1"]
    clock.advance(60)
    assert claimed(outbox) == ["a1", "b2"]


def test_the_later_of_two_holds_stands_with_its_reason(outbox, clock):
    queue(outbox, "a1", "C1")
    queue(outbox, "a2", "C2")
    first, second = outbox.claim()
    outbox.hold(first, 50, "long", scope="workspace")
    outbox.hold(second, 5, "short", scope="workspace")
    gate = Gate.objects.get(source="memory", scope="workspace", workspace_id="T1")
    assert (gate.held_until, gate.hold_reason) == (clock.now + timedelta(seconds=50), "long")
    clock.advance(5)
    assert claimed(outbox) == []


def test_a_hold_of_a_claim_taken_back_holds_nothing(outbox, clock):
    queue(outbox, "a1", "C1")
    [first] = outbox.claim()
    clock.advance(121)
    outbox.claim()  # taken back stale
    assert outbox.hold(first, 60, scope="source") is False
    assert not Gate.objects.exists()


def test_a_hold_with_an_unknown_scope_is_a_value_error_and_changes_nothing(outbox, clock):
    queue(outbox, "a1", "C1")
    [first] = outbox.claim()
    with pytest.raises(ValueError, match="scope is one of container, workspace, source, not 'team'"):
        outbox.hold(first, 60, scope="team")
    assert Post.objects.with_claim().get(post_id="a1").current_state == "sending"
    assert not Gate.objects.exists()


def test_a_wait_announced_with_a_success_holds_the_container_after_it(outbox, clock):
    queue(outbox, "a1", "C1")
    queue(outbox, "a2", "C1")
    queue(outbox, "b1", "C2")
    first, other = outbox.claim()
    posted = Finish(
        first.post_id, first.lease_token, Action.POSTED, wait=2.5, reason="bucket empty", scope="container"
    )
    [recorded] = outbox.finish_many([(first, posted)])
    assert recorded is not None and recorded.action == "posted"
    outbox.posted(other)
    queue(outbox, "b2", "C2")
    assert claimed(outbox) == ["b2"]
    clock.advance(2.5)
    assert claimed(outbox) == ["a2"]


# -- pacing ---------------------------------------------------------------------------------------------


def test_a_container_pace_lets_one_claim_through_per_interval(outbox, clock):
    with paced({"container": (1, 10.0)}):
        for n in range(3):
            queue(outbox, f"a{n}", "C1")
        queue(outbox, "b0", "C2")
        claims = {c.post_id: c for c in outbox.claim()}
        assert sorted(claims) == ["a0", "b0"]
        outbox.posted(claims["a0"])
        assert claimed(outbox) == []  # a1 is due, but C1's pace waits
        assert outbox.next_due() == clock.now + timedelta(seconds=10)
        clock.advance(10)
        assert claimed(outbox) == ["a1"]


def test_a_source_pace_is_a_token_bucket(outbox, clock):
    with paced({"source": (2, 1.0)}):
        for n in range(6):
            queue(outbox, f"p{n}", f"C{n}")
        assert len(outbox.claim(10)) == 2  # a burst of count after a quiet spell
        assert outbox.claim(10) == []
        clock.advance(0.5)
        assert len(outbox.claim(10)) == 1  # refilled at count per seconds
        clock.advance(1)
        assert len(outbox.claim(10)) == 2
        assert outbox.claim(10) == []


def test_a_workspace_pace_holds_each_workspace_to_its_own_count(outbox, clock):
    with paced({"workspace": (1, 1.0)}):
        for w in ("T1", "T2"):
            for c in ("C1", "C2"):
                queue(outbox, f"{w}{c}", c, workspace_id=w)
        assert claimed(outbox) == ["T1C1", "T2C1"]
        assert claimed(outbox) == []
        clock.advance(1)
        assert claimed(outbox) == ["T1C2", "T2C2"]


def test_the_next_due_time_waits_for_the_workspace_pace(outbox, clock):
    with paced({"workspace": (2, 4.0)}):
        for c in ("C1", "C2", "C3"):
            queue(outbox, c, c)
        queue(outbox, "other", "C9", workspace_id="T2")
        clock.advance(1)
        assert claimed(outbox) == ["C1", "C2", "other"]
        # C3's head is due, but T1 has spent its burst: its next slot is 2 s after the claims.
        assert outbox.next_due() == clock.now + timedelta(seconds=2)
        clock.advance(2)
        assert claimed(outbox) == ["C3"]


def test_two_outboxes_share_one_pace(outbox, clock):
    with paced({"source": (3, 1.0)}):
        twin = Outbox("memory", clock=clock)
        for n in range(6):
            queue(outbox, f"p{n}", f"C{n}")
        assert len(outbox.claim(2)) + len(twin.claim(10)) == 3


def test_a_post_waiting_for_its_pace_keeps_its_place_and_attempts(outbox, clock):
    with paced({"source": (1, 5.0)}):
        queue(outbox, "p0", "C0")
        queue(outbox, "p1", "C1")
        assert claimed(outbox) == ["p0"]
        waiting = Post.objects.with_claim().get(post_id="p1")
        clock.advance(5)
        assert claimed(outbox) == ["p1"]
        after = Post.objects.with_claim().get(post_id="p1")
        assert (after.queued_at, after.current_attempts) == (waiting.queued_at, 1)


def test_a_pace_changed_by_override_settings_applies_to_the_next_claim(outbox, clock):
    with paced({"source": (1, 60.0)}):
        for n in range(4):
            queue(outbox, f"p{n}", f"C{n}")
            clock.advance(1)  # due one after the other: claimed oldest first
        assert claimed(outbox) == ["p0"]
        assert claimed(outbox) == []
        with paced({}):
            assert claimed(outbox, 2) == ["p1", "p2"]
        assert claimed(outbox) == []  # the pace is back
        clock.advance(60)
        assert claimed(outbox) == ["p3"]


def test_pacing_off_claims_everything_due(outbox, clock):
    with paced({}):
        for n in range(5):
            queue(outbox, f"p{n}", f"C{n}")
        assert len(outbox.claim(10)) == 5


# -- the operators' view: Outbox.gate_holds ---------------------------------------------------------------


def hold_each(outbox, holds):
    """Queue and claim one post per (workspace, container), then hold each as told:
    {(workspace, container): (seconds, reason, scope)}; scope None: posted with a wait."""
    for workspace, container in holds:
        queue(outbox, f"{workspace}{container}", container, workspace_id=workspace)
    claims = {(c.workspace_id, c.container_id): c for c in outbox.claim()}
    for place, (after, reason, scope) in holds.items():
        claim = claims[place]
        if scope is None:
            wait = Finish(
                claim.post_id, claim.lease_token, Action.POSTED, wait=after, reason=reason, scope="container"
            )
            assert outbox.finish_many([(claim, wait)]) != [None]
        else:
            assert outbox.hold(claim, after, reason, scope=scope)


def test_gate_holds_lists_the_held_places_widest_first_with_until_when_and_why(outbox, clock):
    hold_each(
        outbox,
        {
            ("T1", "C1"): (30, "429 of team T1", "workspace"),
            ("T2", "C2"): (60, "429 of team T2", "workspace"),
            ("T3", "C3"): (2.5, "bucket empty", None),
            ("T3", "C4"): (10, "global rate limit", "source"),
            ("T3", "C5"): (20, "429 of channel C5", "container"),  # the post waits, no place is held
        },
    )
    counts, holds = outbox.gate_holds()
    assert counts == {"source": 1, "workspace": 2, "container": 1}
    at = clock.now
    assert holds == [
        ("source", "", "", at + timedelta(seconds=10), "global rate limit"),
        ("workspace", "T2", "", at + timedelta(seconds=60), "429 of team T2"),
        ("workspace", "T1", "", at + timedelta(seconds=30), "429 of team T1"),
        ("container", "T3", "C3", at + timedelta(seconds=2.5), "bucket empty"),
    ]
    assert holds[0].held_until == at + timedelta(seconds=10) and holds[0].reason == "global rate limit"


def test_gate_holds_leave_out_holds_that_ended_and_paces_that_hold_nothing(outbox, clock):
    with paced({"workspace": (1, 60.0)}):
        hold_each(
            outbox, {("T1", "C1"): (30, "429 of team T1", "workspace"), ("T2", "C2"): (5, "wait", None)}
        )
        assert Gate.objects.filter(scope="workspace", workspace_id="T2", held_until__isnull=True).exists()
        clock.advance(5)  # a hold ends at its instant: the claim takes the place again then
        assert outbox.gate_holds() == (
            {"source": 0, "workspace": 1, "container": 0},
            [("workspace", "T1", "", clock.now + timedelta(seconds=25), "429 of team T1")],
        )
        clock.advance(25)
        assert outbox.gate_holds() == ({"source": 0, "workspace": 0, "container": 0}, [])


def test_gate_holds_lists_at_most_limit_and_counts_them_all(outbox, clock):
    hold_each(outbox, {(f"T{n}", f"C{n}"): (10 * (n + 1), f"429 of T{n}", "workspace") for n in range(3)})
    counts, holds = outbox.gate_holds(limit=2)
    assert counts == {"source": 0, "workspace": 3, "container": 0}
    assert [h.workspace_id for h in holds] == ["T2", "T1"]
    assert outbox.gate_holds(limit=0) == (counts, [])


def test_gate_holds_are_the_sources_own(outbox, clock):
    other = Outbox("other", clock=clock)
    hold_each(other, {("T1", "C1"): (60, "global", "source")})
    assert outbox.gate_holds() == ({"source": 0, "workspace": 0, "container": 0}, [])
    assert other.gate_holds()[0] == {"source": 1, "workspace": 0, "container": 0}
