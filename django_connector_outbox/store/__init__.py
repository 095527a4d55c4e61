"""Where the rows are written: one store interface (`protocol.Store`), chosen once per Outbox.

The Outbox decides what a call means (validation, out of attempts, backoff, storable answers);
a store writes it. `Store` is the interface; `OrmStore` implements it with the ORM on every
database (the design card's shape: `select_for_update(skip_locked=True)` and conditional
`update()` calls) and is the specification; `postgres.PostgresStore` implements the hot paths
(insert, claim, finish, a status post's new body, notify) again as single SQL statements on PostgreSQL, and hands the
rare writes to an `OrmStore` it holds. `pacing` is the GCRA both apply. Imports run one way:
`postgres` -> `orm` -> `protocol`, `pacing`, and the model layer, whose querysets name the rules
about rows (models.py). Differential
tests drive both with the same operations on the same database and compare every result.

Locking order, everywhere: a lane row first, then posts of that lane. Every write that can
change which post is a container's head locks the lane; claimers lock lanes with SKIP LOCKED.
Together that gives one head per container in flight and no deadlock between producers,
claimers and finishers. A lane is locked by its id alone, and what to do is decided under the
lock from current rows: PostgreSQL neither locks nor waits for a row whose committed version
does not match a locking read's WHERE, so a lock asked for "the lane whose head is this post"
is no lock at all while a finish moves the head. (A finish's fencing read filters on its lease
token, rightly: a lease once replaced never comes back, so a lane that does not match is a
claim that is over.) Locks are held until the caller commits: the order across several calls
in one transaction of the caller's is the caller's (two transactions that each queue into two
containers, in opposite orders, wait for each other as any two row writers would).

Gates (models.Gate) come after lanes and posts, in one order per source: the source's own gate
first, always, by every transaction that locks any gate of the source (a paced claim, a hold
of any scope, pruning), then workspace gates by id, then container gates. A sender's turn
finishes (a workspace hold locks that workspace's gate) and claims (which locks the gates of
its heads) in one transaction, so a per-call order alone could not hold across the turn: the
source's gate in front makes the gate lockers of a source take turns, whatever they lock next.

Rows another transaction may be creating at the same moment (a lane, a gate, a post id queued
twice) are never locked shared then exclusive: InnoDB's duplicate-key check takes a shared
lock on the key, and two holders of it that each ask for the exclusive lock deadlock. A lane
or gate that may exist is created by `upsert` (exclusive at once: ON DUPLICATE KEY UPDATE / ON
CONFLICT DO UPDATE); a post id found taken is read again in share mode (`shared_read`).

On MySQL the creators of one key also take turns before their INSERT, by a named lock on the
key (`creating`: GET_LOCK, held for that statement only, taken in name order), because InnoDB's
duplicate-key check locks gaps of the index, not only the key: two creators of one lane or gate
whose checks ran at once (the key's deleted versions, not yet purged, make the check scan them
and lock the gap after them) each held the gap the other then inserted into. (Gates and idle
lanes are deleted by pruning, and among the explorer's deleted ones creators of two different
new lanes met so too: a turn per source would close that, but a creator waiting for a row
during its turn would then hold up every other, in a cycle InnoDB cannot see.) A producer's new ids
are also read, under their named locks, with a locking read before the INSERT
(`waits_in_a_read`: READ COMMITTED, Django's default on MySQL, where that read locks the rows
found and no gap): a producer of an id that another transaction inserted and has not committed
waits there, on that row alone. Waiting in the INSERT instead, its request covered the gap
before the id, and the first producer's next insert into that gap (another id of its
transaction) deadlocked. What InnoDB still cannot order: producers of one new id that wait for
a first one that rolls back; under REPEATABLE READ, that wait in the INSERT (a locking read
there would lock the gap of every missing id, and producers inserting into one gap would
deadlock); two transactions that each queue ids the other queues too, in opposite orders, as
any two writers of the same rows (where one waits holding the named locks of a queue_many,
InnoDB does not see the cycle: it ends at innodb_lock_wait_timeout).

Pruning deletes idle lanes (models.LaneQuerySet.prunable: no post, head or lease), never one
in use: it locks them with SKIP LOCKED, waiting for no one, and deletes them by the next
statement only if they still have no post; a producer inserts a post only into a lane it
holds. A lane is found by a plain read and then locked by its id, so one deleted in between is
gone when it is locked: `OrmStore.lock_places` counts it missing and creates it again (a new
id, after every existing one in pk order), and PostgreSQL's LOCK_PLACES inserts every place it
did not lock. A write that reaches a lane through one of its posts (set_status, requeue,
cancel) finds the post gone with it.

A lane's head and due time are derived: they follow from its posts and its lease by one rule,
`models.head_rule` (LaneQuerySet.refresh_heads), which every write here applies under the lane's lock (the lease itself is not
derived: it is the claim). `repair` applies it to lanes that drifted from it anyway (a bug, a
manual UPDATE, a restore), under their locks too.

Claims are kept on lanes (models.py): a claim writes the lease into the lane (its token,
holder, attempt and end), and leaves the post as it was, `queued`; a finish writes the post
once and frees the lane. Fencing: a finish locks the lane and changes the post only while the
lane still holds that very lease on it.

What a write changes is decided by a locking read or by a condition of the write itself;
plain reads only find which lane to lock (a post's lane never changes). Under MySQL's
REPEATABLE READ a plain read returns the transaction's snapshot, which may be older than the
lane lock it then waited for; locking reads and UPDATEs see the latest committed rows.
"""

from __future__ import annotations

from django.db import connections

from django_connector_outbox.conf import conf
from django_connector_outbox.store.orm import OrmStore
from django_connector_outbox.store.postgres import PostgresStore
from django_connector_outbox.store.protocol import LaneRepair, Store

__all__ = ["LaneRepair", "OrmStore", "PostgresStore", "Store", "store_for"]


def store_for(source: str, using: str) -> Store:
    """The store of a source on a database: PostgreSQL's own SQL there, unless STORE says "orm"."""
    if connections[using].vendor == "postgresql" and conf.STORE != "orm":
        return PostgresStore(source, using)
    return OrmStore(source, using)
