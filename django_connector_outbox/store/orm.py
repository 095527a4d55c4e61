"""The ORM store: `protocol.Store` with the ORM on every database, and the specification.

The design card's shape: `select_for_update(skip_locked=True)` and conditional `update()` calls,
under the locking order and the rules of the package (store/__init__.py). It also serves the
rare writes (set_status, requeue, cancel, holds, repair, prune) of every store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, OperationalError, connections, transaction
from django.db.models import DateTimeField, F, Max, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Greatest

from django_connector_outbox.conf import NOTIFY_CHANNEL, conf
from django_connector_outbox.models import (
    HEAD_FIELDS,
    Attempt,
    Gate,
    GateQuerySet,
    Lane,
    LaneQuerySet,
    Post,
    delete_ids,
    gate_order,
    head_rule,
    place,
    retraction,
)
from django_connector_outbox.posts import (
    FINISHED_STATES,
    HISTORY_OUTCOMES,
    RETRYABLE_STATES,
    Action,
    ClaimedPost,
    Finish,
    Kind,
    NewPost,
    Pace,
    Scope,
    State,
)
from django_connector_outbox.store import pacing
from django_connector_outbox.store.protocol import LaneRepair, claimed_post

# Places looked up per statement: an OR of ~1,000 is "Expression tree is too large" for SQLite.
PLACES_PER_STATEMENT = 200

# The fields a claim reads from a head.
CLAIM_FIELDS = (
    "pk", "lane_id", "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev",
    "state", "attempts", "next_at", "message_ref", "turn_key", "thread_of",
)  # fmt: skip
# The fields of a lane that a claim writes (its lease).
LEASE_FIELDS = ["lease_token", "worker", "due_at", "attempts", "sent_at"]
# The fields a claim reads from a lane.
LANE_FIELDS = ("pk", "head_id", "workspace_id", "pace_tat", "due_at", "lease_token", "attempts", "sent_at")


class OrmStore:
    """The ORM implementation of `Store`, on every database, and the rare writes of all stores."""

    def __init__(self, source: str, using: str) -> None:
        self.source = source
        self.using = using

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source!r} using={self.using!r}>"

    def posts(self) -> Any:
        return Post.objects.using(self.using).filter(source=self.source)

    def lanes(self) -> LaneQuerySet:
        return Lane.objects.using(self.using)

    def gates(self) -> GateQuerySet:
        return Gate.objects.using(self.using).of_source(self.source)

    # -- the hot paths ----------------------------------------------------------------------

    def insert(self, rows: Sequence[NewPost], now: datetime) -> int:
        unique = {row.post_id: row for row in rows}
        known = self.posts().filter(post_id__in=list(unique)).values_list("post_id", flat=True)
        existing = set(known)
        while True:
            new = [row for post_id, row in unique.items() if post_id not in existing]
            if not new:
                return 0
            lanes = self.lock_places({(row.workspace_id, row.container_id) for row in new})
            try:
                with creating(self.using, Post._meta.db_table, [(self.source, row.post_id) for row in new]):
                    if waits_in_a_read(self.using):
                        # Producers of these ids that have not committed are waited for here,
                        # on their rows alone, rather than in the INSERT (see the module).
                        taken = shared_read(
                            self.posts()
                            .filter(post_id__in=[row.post_id for row in new])
                            .values_list("post_id", flat=True),
                            self.using,
                        )
                        if taken:
                            existing |= set(taken)
                            continue
                    # A savepoint, so that an id inserted meanwhile by another transaction (in
                    # another container: this one is locked) leaves the caller's transaction usable.
                    with transaction.atomic(using=self.using):
                        # In list order: the ids it assigns are the posts' queue order (models).
                        Post.objects.using(self.using).bulk_create(
                            Post(
                                source=self.source, post_id=row.post_id, lane_id=lanes[(row.workspace_id, row.container_id)],
                                workspace_id=row.workspace_id, container_id=row.container_id, thread_id=row.thread_id,
                                kind=row.kind, body=row.body, turn_key=row.turn_key, thread_of=row.thread_of,
                                queued_at=row.due, next_at=row.due,
                                created_at=now, updated_at=now,
                            )
                            for row in new
                        )  # fmt: skip
            except IntegrityError as conflict:
                # Read again with a current read, which sees the id committed meanwhile: under
                # MySQL's REPEATABLE READ a plain read returns the same snapshot every time. A
                # shared one: InnoDB's duplicate-key check left a shared lock on the key, and
                # producers of one id that each asked for an exclusive lock on it deadlocked.
                found = set(shared_read(known, self.using))
                if found <= existing:
                    # No id of ours appeared meanwhile: the conflict is not a concurrent queue,
                    # and trying again would fail the same way for ever.
                    raise conflict
                existing = found
                continue
            self.refresh_heads(set(lanes.values()))
            self.notify()
            return len(new)

    def claim(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> list[ClaimedPost]:
        paces = conf.pace(self.source)
        # The lane index gives the due heads directly, however deep the queues behind them
        # are; SKIP LOCKED lets concurrent claimers take different lanes. Held places are left
        # out of the same range scan, as are containers whose pace waits.
        lanes = self.lanes().of_source(self.source).due(now).unheld(now).in_claim_order()
        if pace := paces.get(Scope.CONTAINER):
            lanes = lanes.pace_allows(now, pacing.tolerance(pace))
        if connections[self.using].features.has_select_for_update_skip_locked:
            lanes = lanes.select_for_update(skip_locked=True)
        lane_rows = {row["pk"]: row for row in lanes.values(*LANE_FIELDS)[:limit]}
        # A locking read: under MySQL's REPEATABLE READ a plain one returns the transaction's
        # snapshot, where a head replaced since (set_status, a finish) may still look current.
        heads = self.posts().filter(
            pk__in=[lane["head_id"] for lane in lane_rows.values() if lane["head_id"]]
        )
        due = []
        for row in heads.select_for_update().values(*CLAIM_FIELDS):
            lane = lane_rows[row["lane_id"]]
            if lane["head_id"] != row["pk"]:
                continue
            if lane["lease_token"]:  # its lease ended (the lane is due): taken back stale
                due.append(row | {"stale": True, "due": lane["due_at"], "attempts": lane["attempts"] + 1,
                                  "sent_at": lane["sent_at"] or now})  # fmt: skip
            elif row["state"] == State.QUEUED and row["next_at"] <= now:
                due.append(row | {"stale": False, "due": row["next_at"], "attempts": row["attempts"] + 1,
                                  "sent_at": now})  # fmt: skip
        # A stale head takes its turn by when its lease ended; heads due at one instant by id,
        # as the lanes were read (the head queued first first).
        due.sort(key=lambda row: (row["due"], row["pk"]))
        due = self._within_paces(due, paces, now)
        # The leases, in one UPDATE (a CASE by lane for what differs between them).
        container_pace = paces.get(Scope.CONTAINER)
        leases = [
            Lane(
                pk=row["lane_id"], lease_token=token, worker=worker, due_at=lease_until, attempts=row["attempts"],
                sent_at=row["sent_at"],
                pace_tat=pacing.after(container_pace, lane_rows[row["lane_id"]]["pace_tat"], now, 1)
                if container_pace else None,
            )
            for row in due
        ]  # fmt: skip
        fields = [*LEASE_FIELDS, "pace_tat"] if container_pace else LEASE_FIELDS
        self.lanes().bulk_update(leases, fields)
        self._read_parents(due)
        return [
            claimed_post(
                self.source,
                row,
                stale=row["stale"],
                sent_at=row["sent_at"],
                lease_until=lease_until,
                token=token,
            )
            for row in due
        ]

    def _read_parents(self, due: list[dict[str, Any]]) -> None:
        """The parents of the replies among the claimed heads, as they are now, into their rows:
        one read, only when some head is a reply. A parent is finished before its reply is a
        head (the container's order), so its row's state is its state."""
        wanted = {row["thread_of"] for row in due if row["thread_of"] is not None}
        if not wanted:
            return
        fields = ("post_id", "state", "message_ref", "thread_id")
        parents = {p[0]: p[1:] for p in self.posts().filter(post_id__in=wanted).values_list(*fields)}
        for row in due:
            if row["thread_of"] is not None:
                state, ref, thread = parents.get(row["thread_of"], (None, None, None))
                row.update(parent_state=state, parent_ref=ref, parent_thread=thread)

    def next_due(self, now: datetime) -> datetime | None:
        """When the earliest head may be claimable: its due time, after its container's pace,
        its workspace's and the source's; a held place's lanes wait for their hold's end
        (Outbox.next_due)."""
        gates = self.gates().holding(now)
        source_hold: datetime | None = gates.filter(scope=Scope.SOURCE).aggregate(end=Max("held_until"))[
            "end"
        ]
        if source_hold is not None:
            return source_hold
        lanes = self.lanes().of_source(self.source).unheld(now)
        paces = conf.pace(self.source)
        due_at: Any = F("due_at")
        # A lane is free when its head is due, its container's pace has a slot and its
        # workspace's pace too (each tat less the pace's burst tolerance, as pacing.free_at).
        tats: dict[Scope, Any] = {
            Scope.CONTAINER: F("pace_tat"),
            Scope.WORKSPACE: Subquery(
                self.gates().at(Scope.WORKSPACE, OuterRef("workspace_id")).values("pace_tat")[:1],
                output_field=DateTimeField(),
            ),
        }
        for scope, tat in tats.items():
            if pace := paces.get(scope):
                free = tat - pacing.tolerance(pace)
                due_at = Greatest(due_at, Coalesce(free, due_at, output_field=DateTimeField()))
        dues: list[datetime] = [d for d in (lanes.aggregate(due=Min(due_at))["due"],) if d is not None]
        # A hold that ends frees its lanes.
        dues += [end for end in (gates.aggregate(end=Min("held_until"))["end"],) if end is not None]
        if not dues:
            return None
        due = min(dues)
        if (pace := paces.get(Scope.SOURCE)) and (
            tat := self.source_gate().values_list("pace_tat", flat=True).first()
        ):
            due = max(due, pacing.free_at(pace, tat))
        return due

    def _within_paces(
        self, due: list[dict[str, Any]], paces: dict[Scope, Pace], now: datetime
    ) -> list[dict[str, Any]]:
        """The due heads (oldest first) that the workspace and source paces let through now;
        their gates, locked (every claimer waits for them: a pace is shared), move on."""
        wider: dict[Scope, Pace] = {scope: pace for scope, pace in paces.items() if scope != Scope.CONTAINER}
        if not due or not wider:
            return due
        keys = []
        if Scope.SOURCE in wider:
            keys.append((Scope.SOURCE, ""))
        if Scope.WORKSPACE in wider:
            keys += [(Scope.WORKSPACE, w) for w in sorted({r["workspace_id"] for r in due})]
        gates = self.lock_gates(keys)
        budget = {key: pacing.allowed(wider[key[0]], gates[key].pace_tat, now) for key in keys}
        through = []
        for row in due:
            mine = [key for key in keys if key[0] == Scope.SOURCE or key[1] == row["workspace_id"]]
            if all(budget[key] > 0 for key in mine):
                for key in mine:
                    budget[key] -= 1
                through.append(row)
        for key in keys:
            used = pacing.allowed(wider[key[0]], gates[key].pace_tat, now) - budget[key]
            if used:
                tat = pacing.after(wider[key[0]], gates[key].pace_tat, now, used)
                Gate.objects.using(self.using).filter(pk=gates[key].pk).update(pace_tat=tat, updated_at=now)
        return through

    def lock_gates(self, keys: list[tuple[Scope, str]]) -> dict[tuple[Scope, str], Gate]:
        """The gates of these (scope, workspace) keys, locked in the gates' order (the source's
        first: see the module), created where missing.

        Past the source's gate no other transaction locks a gate of this source, so the others
        can be read, created and read again without racing anyone.
        """
        gates = self.gates()
        found = {(Scope.SOURCE, ""): self.lock_source_gate()}
        wider = [(scope, w) for scope, w in keys if scope != Scope.SOURCE]
        if wider:
            match = Q(*(Q(**place(scope, w)) for scope, w in wider), _connector=Q.OR)
            locked = gates.filter(match).select_for_update().order_by("workspace_id")
            found.update({(Scope(g.scope), g.workspace_id): g for g in locked})
            if missing := [
                Gate(source=self.source, scope=s, workspace_id=w) for s, w in wider if (s, w) not in found
            ]:
                gates.bulk_create(missing, ignore_conflicts=True)
                found.update({(Scope(g.scope), g.workspace_id): g for g in locked.all()})
        return {key: found[key] for key in keys}

    def source_gate(self) -> Any:
        """This source's own gate (a queryset of it): the first gate that every transaction
        locking gates of this source locks (see the module)."""
        return self.gates().at(Scope.SOURCE)

    def lock_source_gate(self) -> Gate:
        """Lock this source's own gate, creating it if missing."""
        gate: Gate | None = self.source_gate().select_for_update().first()
        if gate is None:  # never made yet, or pruned: made and locked in one statement
            gates = Gate.objects.using(self.using)
            upsert(
                gates,
                [Gate(source=self.source, scope=Scope.SOURCE)],
                ["source", "scope", "workspace_id", "container_id"],
            )
            gate = self.source_gate().select_for_update().get()
        return gate

    def hold_places(self, holds: Sequence[tuple[Scope, str, str, datetime, str]], now: datetime) -> None:
        """Hold places wider than a post until the given instants (a later hold stands).

        The source's gate is locked first (the gates' order, see the module), then each gate
        is updated, in that order, and created where missing.
        """
        self.lock_source_gate()
        gates = self.gates()
        places = [
            (place(scope, workspace, container), until, reason)
            for scope, workspace, container, until, reason in holds
        ]
        for keys, until, reason in sorted(places, key=lambda p: gate_order(**p[0])):
            if not gates.filter(**keys).exists():
                gates.bulk_create([Gate(source=self.source, **keys)], ignore_conflicts=True)
            # The later of two holds stands, with its reason.
            gates.filter(Q(held_until__isnull=True) | Q(held_until__lte=until), **keys).update(
                held_until=until, hold_reason=reason, updated_at=now
            )

    def finish(self, finishes: Sequence[Finish], now: datetime) -> list[bool]:
        """Each finish by `finish_one`, their lanes locked first, all at once in pk order (the
        order of every lane lock): one by one in the finishes' order, a sender's batch and a
        producer's queue_many locking the same lanes deadlocked."""
        if len(finishes) > 1:
            lanes = (
                self.posts()
                .filter(post_id__in=[f.post_id for f in finishes])
                .values_list("lane_id", flat=True)
            )
            self.lock_lanes(set(lanes))
        return [self.finish_one(f, now) for f in finishes]

    def finish_and_claim(
        self,
        finishes: Sequence[Finish],
        clock: Callable[[], datetime],
        limit: int,
        lease: timedelta,
        token: str,
        worker: str,
    ) -> tuple[list[bool], list[ClaimedPost]]:
        """`finish`, then `claim`: the specification. The claim's SKIP LOCKED does not skip the
        lanes this transaction locked by finishing them (a transaction never waits for its own
        locks), so a container finished here hands its next head to this claim. The clock is
        read again for the claim: a lease runs from its claim, not from before the finishes
        waited for their lanes."""
        done = self.finish(finishes, clock())
        if limit <= 0:
            return done, []
        now = clock()
        return done, self.claim(limit, now, now + lease, token, worker)

    def finish_one(self, f: Finish, now: datetime) -> bool:
        """Record a resolved finish if its claim is still current: its lane holds its lease.

        The lane and the post are read with locking reads: under MySQL's REPEATABLE READ a
        plain read returns the transaction's snapshot, which may be from before another sender
        took the post back (or set_status changed its rev), while locking reads see the latest
        committed rows.
        """
        with transaction.atomic(using=self.using, savepoint=False):
            found = self.posts().filter(post_id=f.post_id).values_list("pk", "lane_id").first()
            if found is None:
                return False
            pk, lane_id = found
            locked = (
                self.lanes().select_for_update().filter(pk=lane_id).naming_head(pk).held_by(f.lease_token)
            )
            lane = locked.values("attempts", "worker").first()
            if lane is None:  # taken back, or finished already
                return False
            row = self.posts().filter(pk=pk).select_for_update().values("kind", "rev").get()
            post, lease = finish_changes(f, row, lane["attempts"], now)
            if post:
                self.posts().filter(pk=pk).update(updated_at=now, **post)
            if f.recorded in HISTORY_OUTCOMES:
                Attempt.objects.using(self.using).create(
                    post_id=pk, at=now, attempt=lane["attempts"], outcome=f.recorded, reason=f.reason,
                    worker=lane["worker"],
                )  # fmt: skip
            if lease is None:  # the claim ended: the lane takes its next head
                self.refresh_heads([lane_id], release=True)
            elif lease:
                locked.update(**lease)
            return True

    def notify(self) -> None:
        # LISTEN/NOTIFY is PostgreSQL's: elsewhere idle senders poll (POLL_INTERVAL). The ORM
        # store on PostgreSQL (STORE "orm") wakes them all the same.
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, self.source])

    # -- the rare writes (every store) -----------------------------------------------------

    def replace_status(self, now: datetime, pk: int, lane_id: int, body: dict[str, Any]) -> bool:
        """Give an existing status post a new body, under its lane's lock (Outbox.set_status);
        False if the post is gone (pruned since it was read: STATUS_RETENTION)."""
        self.lock_lanes([lane_id])
        # A locking read: the latest row, not a snapshot from before the lane was ours.
        row = self.posts().filter(pk=pk).with_claim().select_for_update().first()
        if row is None:
            return False
        if row.state == State.UNCERTAIN or row.body == body:
            return True
        changes: dict[str, Any] = {"body": body, "rev": row.rev + 1}
        if row.state in FINISHED_STATES:
            self.rejoin(now, row.lane_id, self.posts().filter(pk=row.pk), **changes)
            return True
        if row.current_state == State.QUEUED:  # a sending one keeps its attempts
            changes["attempts"] = 0
        self.posts().filter(pk=row.pk).update(updated_at=now, **changes)
        return True

    def renew(self, now: datetime, tokens: Sequence[str], until: datetime) -> set[str]:
        """Extend to `until` the leases of these tokens that have not ended; the tokens extended
        (Outbox.renew_leases). One conditional write: a lane whose lease ended or changed hands
        meanwhile is not written, and the read after it sees only this transaction's."""
        leases = self.lanes().of_source(self.source).held_by_any(tokens)
        leases.running(now).update(due_at=until)
        return set(leases.filter(due_at=until).values_list("lease_token", flat=True).distinct())

    def requeue(self, now: datetime, post_id: str) -> bool:
        """A failed or uncertain post with a body back to the back of its queue (Outbox.requeue)."""
        found = self.posts().filter(post_id=post_id).values("lane_id").first()
        if found is None:
            return False
        self.lock_lanes([found["lane_id"]])
        # The state is decided by the write, under the lane's lock: a plain read before the lock
        # may be older than a finish that committed meanwhile (or, under MySQL's REPEATABLE
        # READ, than the caller's snapshot).
        movable = self.posts().filter(post_id=post_id, state__in=RETRYABLE_STATES, body__isnull=False)
        return self.rejoin(now, found["lane_id"], movable)

    def rejoin(self, now: datetime, lane_id: int, post: Any, **changes: Any) -> bool:
        """Put a finished post (`post`: a queryset of it) back at the back of its locked lane."""
        moved = post.update(
            state=State.QUEUED, attempts=0, queued_at=now, next_at=now, updated_at=now, **changes
        )
        if moved:
            self.refresh_heads([lane_id])
            self.notify()
        return bool(moved)

    def cancel(self, now: datetime, post_id: str) -> bool:
        """A queued post becomes cancelled and loses its body (Outbox.cancel_queued).

        Its lane is locked first, by its id alone, and the decision is made under that lock
        from current rows: a locking read filtered on the lane's head would match no row while
        a sender finishes the head in front (PostgreSQL neither locks nor waits for a row whose
        committed version does not match), and a claim could then take the post between the
        decision and the write.
        """
        found = self.posts().filter(post_id=post_id).values("pk", "lane_id").first()
        if found is None:
            return False
        pk, lane_id = found["pk"], found["lane_id"]
        if not self.lock_lanes([lane_id]):  # the post was finished and pruned since, and its lane with it
            return False
        # A locking read: under MySQL's REPEATABLE READ a plain one returns the transaction's
        # snapshot, which may be from before a sender leased the post.
        in_flight = self.lanes().select_for_update().filter(pk=lane_id).naming_head(pk).leased()
        if list(in_flight.values_list("pk", flat=True)):
            return False  # being sent: its row says queued, its lane holds the lease on it
        cancelled = (
            self.posts()
            .filter(pk=pk, state=State.QUEUED)
            .update(state=State.CANCELLED, body=None, updated_at=now)
        )
        if cancelled:
            self.refresh_heads([lane_id])
        return bool(cancelled)

    def retract(self, now: datetime, post_id: str) -> bool:
        """Retract a post by `models.retraction` (Outbox.retract): cancel it, queue a delete of
        its message behind it in its container (under the first free id of `delete_ids`,
        carrying its place and message ref), or both; False, changing nothing, when neither
        applies or it was retracted before (its delete exists: `PostQuerySet.deleting`).

        As `cancel`: the lane is locked first, by its id alone, and everything is decided under
        that lock from current rows (a locking read), so that a claim cannot take the post
        between the decision and the write, and two retracts of one post take turns.
        """
        found = self.posts().filter(post_id=post_id).values("pk", "lane_id").first()
        if found is None:
            return False
        pk, lane_id = found["pk"], found["lane_id"]
        if not self.lock_lanes([lane_id]):  # finished and pruned since, its lane with it
            return False
        fields = ("kind", "current_state", "message_ref", "workspace_id", "container_id", "thread_id")
        row = self.posts().filter(pk=pk).with_claim().select_for_update().values(*fields).first()
        if row is None or self.posts().deleting(post_id).exists():
            return False
        rule = retraction(row["kind"], row["current_state"], row["message_ref"])
        if not (rule.cancel or rule.delete):
            return False
        if rule.cancel:
            self.posts().filter(pk=pk).update(state=State.CANCELLED, body=None, updated_at=now)
        if rule.delete:
            delete = Post(
                source=self.source, lane_id=lane_id, workspace_id=row["workspace_id"],
                container_id=row["container_id"], thread_id=row["thread_id"], kind=Kind.DELETE, body={},
                thread_of=post_id, message_ref=row["message_ref"], queued_at=now, next_at=now,
                created_at=now, updated_at=now,
            )  # fmt: skip
            self._insert_delete(delete, delete_ids(post_id))
        self.refresh_heads([lane_id])
        if rule.delete:
            self.notify()
        return True

    def _insert_delete(self, delete: Post, delete_ids: Sequence[str]) -> None:
        """Insert a retract's delete under the first of `delete_ids` that no post has (a
        caller's own post may have one), each try in a savepoint: an id inserted meanwhile by
        another transaction (into another lane) leaves the caller's transaction usable."""
        for delete_id in delete_ids:
            if self.posts().filter(post_id=delete_id).exists():
                continue
            delete.post_id = delete_id
            try:
                with (
                    creating(self.using, Post._meta.db_table, [(self.source, delete_id)]),
                    transaction.atomic(using=self.using),
                ):
                    delete.save(using=self.using, force_insert=True)
                return
            except IntegrityError:
                delete.pk = None
                continue
        raise IntegrityError(f"no free post id for the delete of {delete.thread_of!r}: {list(delete_ids)}")

    def prune(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None, limit: int
    ) -> int:
        """Delete up to `limit` finished posts by the cutoffs of `PostQuerySet.prunable`; how many."""
        batch = list(
            self.prunable(cutoff, attention_cutoff, status_cutoff).values_list("pk", flat=True)[:limit]
        )
        if not batch:
            return 0
        # The state again, by a locking read: a post may have been requeued since it was read,
        # and one locked here cannot be (a requeue waits, then finds it gone). The batch goes
        # by these ids, its history (models.Attempt) first, in one DELETE each: the ORM's
        # cascade would read the posts back and delete them in chunks of the database's
        # parameter limit (`_raw_delete` is the DELETE that Django's collector itself runs).
        doomed = self.posts().filter(pk__in=batch, state__in=FINISHED_STATES).select_for_update()
        pks = list(doomed.values_list("pk", flat=True))
        if not pks:
            return 0
        Attempt.objects.using(self.using).filter(post_id__in=pks)._raw_delete(self.using)
        deleted: int = self.posts().filter(pk__in=pks)._raw_delete(self.using)
        return deleted

    def prunable(self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None) -> Any:
        """The posts that `prune` deletes (see there), as a queryset."""
        return self.posts().prunable(cutoff, attention_cutoff, status_cutoff)

    def prune_lanes(self, cutoff: datetime, after: int, limit: int) -> tuple[int | None, int]:
        """Check this source's next `limit` lanes (by id, after `after`) and delete those idle
        since `cutoff` (`LaneQuerySet.prunable`); the last lane id checked (None when no lane
        is left after it) and how many were deleted.

        The idle ones are locked with SKIP LOCKED (a lane that a producer, a claimer or a
        finisher holds is left for the next walk) and deleted by the next statement, which
        checks again under the locks that they have no post (`LaneQuerySet.postless`): a
        producer inserts a post only into a lane it holds, so a lane that has no post then has
        none at the commit either. (The locking statement reads the posts from a snapshot taken
        before its locks; the lane's own columns it reads at their latest version, and only a
        holder of the lock changes them.) The DELETE names the lanes by id and no other column
        of theirs, so that its only way to them is the primary key: given `head_id IS NULL`
        too, MariaDB walked the head_id index and locked there the new lane of a producer (a
        lane it does not delete) before its row, which the producer held while it asked for
        that index entry to give its lane a head: a deadlock, and the producer's transaction
        rolled back.
        """
        walked = self.lanes().filter(source=self.source, pk__gt=after).order_by("pk")
        nth = list(walked.values_list("pk", flat=True)[limit - 1 : limit])
        last = nth[0] if nth else None
        idle = (walked if last is None else walked.filter(pk__lte=last)).prunable(cutoff)
        if connections[self.using].features.has_select_for_update_skip_locked:
            idle = idle.select_for_update(skip_locked=True)
        locked = list(idle.values_list("pk", flat=True))
        if not locked:
            return last, 0
        # The raw DELETE: the ORM's would read the lanes' posts back first (their PROTECT). On
        # MySQL one lane a statement: given an IN list over a small table, MariaDB read the
        # lanes by a scan, waiting for a lane that SKIP LOCKED had left to its producer while
        # holding index entries of the deleted ones, which that producer then asked for.
        batches = [[pk] for pk in locked] if connections[self.using].vendor == "mysql" else [locked]
        deleted = sum(self.lanes().filter(pk__in=ids).postless()._raw_delete(self.using) for ids in batches)
        return last, deleted

    def prunable_lanes(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None
    ) -> Any:
        """The lanes that pruning at these cutoffs deletes, with the posts it deletes first
        (for a dry run), as a queryset."""
        outliving = Post.objects.using(self.using).outliving(cutoff, attention_cutoff, status_cutoff)
        return self.lanes().filter(source=self.source).prunable(cutoff, posts=outliving)

    def prune_gates(self, cutoff: datetime) -> int:
        """Delete the gates that hold nothing since before `cutoff`; how many.

        A place held or paced once (a Discord channel whose bucket ran out, say) would otherwise
        keep its row for ever. A gate whose hold and pace times are past holds nothing: a pace
        time in the past lets the whole burst through, as a missing gate does. A claimer that
        moves the gate's pace meanwhile is waited for, and the row is then kept.
        """
        ended = Q(held_until__isnull=True) | Q(held_until__lt=cutoff)
        idle = Q(pace_tat__isnull=True) | Q(pace_tat__lt=cutoff)
        # The gates' order (see the module): the DELETE's own is the table's. Without a source
        # gate, one that a claimer creates meanwhile is not the DELETE's to wait for (its insert
        # is not committed), and the claimer waits for what the DELETE holds, not the reverse.
        list(self.source_gate().select_for_update().values_list("pk"))
        gates = Gate.objects.using(self.using).filter(ended, idle, source=self.source, updated_at__lt=cutoff)
        deleted: int = gates.delete()[0]
        return deleted

    def prune_history(self, cutoff: datetime, limit: int) -> int:
        """Delete up to `limit` history rows (models.Attempt) written before `cutoff` of posts
        that are kept (a status post lives on, its 429s of months ago need not); how many.
        A pruned post's rows go with it (`prune`)."""
        old = Attempt.objects.using(self.using).filter(at__lt=cutoff, post__source=self.source)
        pks = list(old.order_by().values_list("pk", flat=True)[:limit])
        if not pks:
            return 0
        deleted: int = Attempt.objects.using(self.using).filter(pk__in=pks)._raw_delete(self.using)
        return deleted

    def repair(self, after: int, limit: int) -> tuple[int | None, list[LaneRepair]]:
        """Check this source's next `limit` lanes (by id, after `after`) against `head_rule`.

        Lanes that differ are locked, recomputed under their lock and written; returns the last
        lane id checked (None when no lane is left after it) and the repairs.
        """
        rule = head_rule()
        want = {f"want_{name}": rule[name] for name in HEAD_FIELDS}
        lanes = self.lanes().filter(source=self.source, pk__gt=after).annotate(**want).order_by("pk")
        rows = list(lanes.values_list("pk", *HEAD_FIELDS, *want)[:limit])
        width = len(HEAD_FIELDS)
        drifted = [pk for pk, *now in rows if now[:width] != now[width:]]
        repairs = self._repair(drifted) if drifted else []
        return (rows[-1][0] if len(rows) == limit else None), repairs

    def _repair(self, lane_ids: list[int]) -> list[LaneRepair]:
        with transaction.atomic(using=self.using, savepoint=False):
            locked = self.lanes().select_for_update().filter(pk__in=lane_ids).order_by("pk")
            before = {pk: (head, due) for pk, head, due in locked.values_list("pk", "head_id", "due_at")}
            self.refresh_heads(before)
            lanes = self.lanes().filter(pk__in=before).order_by("pk")
            after = lanes.values_list("pk", "workspace_id", "container_id", "head_id", "due_at")
            repairs = [
                LaneRepair(self.source, pk, workspace_id, container_id, *before[pk], head, due)
                for pk, workspace_id, container_id, head, due in after
                if (head, due) != before[pk]
            ]
            if repairs:
                self.notify()  # a repaired head may be due now: idle senders should look
        return repairs

    # -- lanes ------------------------------------------------------------------------------

    def lock_places(self, places: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Lock the lanes of these (workspace, container) places, creating missing ones; their ids.

        Existing lanes are found by a plain read and locked by pk, in pk order (the deadlock-free
        order of every lane lock), never through the index of places: a lane that another
        producer created and has not committed, locked through that index, could be held there
        by one transaction and by its pk by the creator, each then asking for the other's (seen
        on MariaDB). Missing lanes are looked for again by a locking read (READ COMMITTED, see
        `waits_in_a_read`), then created by `upsert`, which locks one that another producer
        created meanwhile at once, exclusively (new lanes come after the existing ones in pk
        order too), and read with a locking read (a plain one may not see them).
        """
        lanes = self._find_lanes(places, lock=False)
        if lanes:
            # A lane that pruning deleted since the read is gone from the locked ones: it is
            # missing, and made again below (after every existing lane in pk order, too).
            locked = self.lock_lanes(lanes.values())
            lanes = {place: pk for place, pk in lanes.items() if pk in locked}
        if len(lanes) == len(places):
            return lanes
        missing = places - set(lanes)
        # The creators of a lane take turns (`upsert`'s named locks, taken here already: a session
        # may hold one more than once) from this read to their INSERT.
        with creating(self.using, Lane._meta.db_table, [(self.source, w, c) for w, c in missing]):
            if waits_in_a_read(self.using):
                # Lanes created since the plain read (not committed then) are waited for and
                # locked here, on their rows alone: an upsert's wait on such a lane covered the
                # gap before it, where the lane's creator then inserted another lane (module).
                lanes.update(self._find_lanes(missing, lock=True))
                missing = places - set(lanes)
            if missing:
                upsert(
                    self.lanes(),
                    [Lane(source=self.source, workspace_id=w, container_id=c) for w, c in sorted(missing)],
                    ["source", "workspace_id", "container_id"],
                )
                lanes.update(self._find_lanes(missing, lock=True))
        return lanes

    def _find_lanes(self, places: set[tuple[str, str]], *, lock: bool) -> dict[tuple[str, str], int]:
        """The ids of the existing lanes of these places (locked, in pk order, if `lock`)."""
        ordered = sorted(places)
        lanes: dict[tuple[str, str], int] = {}
        for start in range(0, len(ordered), PLACES_PER_STATEMENT):
            # One flat OR: `|=` in a loop copies the growing tree each time (quadratic).
            chunk = ordered[start : start + PLACES_PER_STATEMENT]
            match = Q(*(Q(workspace_id=w, container_id=c) for w, c in chunk), _connector=Q.OR)
            found = self.lanes().filter(match, source=self.source)
            if lock:
                found = found.select_for_update().order_by("pk")
            lanes.update({(w, c): pk for pk, w, c in found.values_list("pk", "workspace_id", "container_id")})
        return lanes

    def lock_lanes(self, lane_ids: Iterable[int]) -> set[int]:
        """Lock these lanes, in pk order; the ids of those that exist (pruning deletes lanes)."""
        locked = self.lanes().select_for_update().filter(pk__in=list(lane_ids)).order_by("pk")
        return set(locked.values_list("pk", flat=True))

    def refresh_heads(self, lane_ids: Iterable[int], *, release: bool = False) -> None:
        """Point each (locked) lane at its head and the head's due time, by `head_rule`;
        `release`: the lease it held has ended, and it is freed.

        One statement however many lanes, so that queue_many stays one round trip per batch
        rather than per container.
        """
        self.lanes().filter(pk__in=list(lane_ids)).refresh_heads(release=release)


def waits_in_a_read(using: str) -> bool:
    """Whether a producer reads the ids it is about to insert with a locking read first: on
    MySQL under READ COMMITTED (Django's default there), where such a read waits for a row
    another transaction inserted and locks no gap (under REPEATABLE READ it would lock the gap
    of a missing id, and two producers inserting into one gap would deadlock)."""
    connection = connections[using]
    return connection.vendor == "mysql" and getattr(connection, "isolation_level", "") == "read committed"


def shared_read(rows: Any, using: str) -> list[Any]:
    """The rows of a queryset by a current read that takes shared locks (FOR SHARE / LOCK IN
    SHARE MODE; SQLite's one writer needs none): it sees what committed since the transaction's
    snapshot, and keeps a shared lock that InnoDB may hold already from a duplicate-key check."""
    connection = connections[using]
    sql, params = rows.query.get_compiler(using).as_sql()
    suffix = {"postgresql": " FOR SHARE", "mysql": " LOCK IN SHARE MODE"}.get(connection.vendor, "")
    with connection.cursor() as cursor:
        cursor.execute(sql + suffix, params)
        return [row[0] if len(row) == 1 else row for row in cursor.fetchall()]


def upsert(manager: Any, objs: list[Any], unique_fields: list[str]) -> None:
    """Insert the rows that are missing and lock those that exist, exclusively, in one statement.

    An INSERT that meets an existing key there takes the row's exclusive lock at once (ON
    DUPLICATE KEY UPDATE, ON CONFLICT DO UPDATE: the row is "updated" to itself), where INSERT
    IGNORE / ON CONFLICT DO NOTHING took a shared one on MySQL: two transactions holding it and
    then locking the row for update deadlocked. On MySQL the creators of one key also take
    turns through `creating` (see the module).
    """
    features = connections[manager.db].features
    keys = [tuple(getattr(obj, name) for name in unique_fields) for obj in objs]
    with creating(manager.db, manager.model._meta.db_table, keys):
        manager.bulk_create(
            objs,
            update_conflicts=True,
            update_fields=unique_fields[:1],
            unique_fields=unique_fields if features.supports_update_conflicts_with_target else None,
        )


@contextmanager
def creating(using: str, table: str, keys: Iterable[tuple[Any, ...]]) -> Iterator[None]:
    """On MySQL, named locks (GET_LOCK) on these unique keys of `table` around the statement
    that creates them, so that one creator of a key at a time runs it (see the module).

    Taken in key order, released when the statement returns (not at commit: a named lock is the
    session's): the rows' own locks order the creators from there on. Elsewhere: nothing.
    """
    connection = connections[using]
    if connection.vendor != "mysql":
        yield
        return
    # A lock name is at most 64 characters: a digest of the table and the key.
    names = sorted({"outbox:" + hashlib.sha1(repr((table, key)).encode()).hexdigest() for key in keys})
    # One statement each way, however many names: its expressions run in order.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join(["GET_LOCK(%s, @@innodb_lock_wait_timeout)"] * len(names)), names
        )
        taken = [name for name, got in zip(names, cursor.fetchone(), strict=True) if got == 1]
    try:
        if len(taken) < len(names):
            raise OperationalError(f"Lock wait timeout exceeded: creating a row of {table}")
        yield
    finally:
        if taken:
            with connection.cursor() as cursor:
                cursor.execute("SELECT " + ", ".join(["RELEASE_LOCK(%s)"] * len(taken)), taken)


def finish_changes(
    f: Finish, row: dict[str, Any], attempts: int, now: datetime
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """What a resolved finish sets on its post (`row`: its kind and rev; `attempts`: the
    claim's attempt, from its lane) and on its lane: None when the claim ends (the lane is
    released and takes its next head), else the lane's changes (the claim goes on)."""
    match f.action:
        case Action.POSTED:
            changes: dict[str, Any] = {"attempts": 0, "delivered_attempt": attempts}
            if f.message_ref is not None:
                changes["message_ref"] = f.message_ref
            if f.thread_id is not None:
                changes["thread_id"] = f.thread_id
            if row["kind"] != Kind.STATUS:
                changes["body"] = None
            if row["rev"] == f.claimed_rev:
                changes["state"] = State.POSTED
            else:  # set_status replaced the body while it was being sent: edit once more
                changes.update(state=State.QUEUED, queued_at=now, next_at=now)
            return changes, None
        case Action.FOUND:  # a status: edited once more, in the same place
            changes = dict(state=State.QUEUED, next_at=now, attempts=0)
            if f.message_ref is not None:
                changes["message_ref"] = f.message_ref
            if f.thread_id is not None:
                changes["thread_id"] = f.thread_id
            return changes, None
        case Action.RETRY:
            wait = timedelta(seconds=f.wait or 0)
            return dict(state=State.QUEUED, next_at=now + wait, attempts=attempts, last_error=f.reason), None
        case Action.HOLD:  # the attempt is not counted
            wait = timedelta(seconds=f.wait or 0)
            return dict(
                state=State.QUEUED, next_at=now + wait, attempts=attempts - 1, last_error=f.reason
            ), None
        case Action.LEAVE:  # as it is, under its lease: only the reason is noted
            return dict(last_error=f.reason), {}
        case Action.GIVE_BACK:  # not started: the attempt is not counted
            if f.state == State.QUEUED:  # a fresh claim, as hold(claim, 0)
                return dict(next_at=now, attempts=attempts - 1, last_error=f.reason), None
            # A stale one may be in the source: still stale, its lease ended now.
            return dict(last_error=f.reason), dict(due_at=now, attempts=attempts - 1)
        case Action.DROP:  # a delete with nothing to delete: cancelled, as cancel_queued leaves it
            return dict(state=State.CANCELLED, body=None, attempts=attempts, last_error=f.reason), None
    return dict(state=f.state, attempts=attempts, last_error=f.reason), None  # settle
