"""``manage.py outbox_status``: counts by state, the oldest due post and the holds, per source.

Holds are of two kinds: posts sent back to wait (a retry, a Retry-After of their channel), and
places held for every post of them (the whole source or a workspace after a wider 429, a
channel after a success that announced a wait), whose posts keep their own due time.

For a source with installations (OPTIONS "installations": True), the problems per workspace:
installations revoked (when, why), refreshes failing, and workspaces whose posts wait without
any installation (not for a webhook source, whose containers have destinations instead).

With --fail-if-older it is a health check: exit status 3 when a source's oldest due post has
waited longer than that (a sender down, a channel stuck behind a hold).

With --failed it answers "why did they fail" instead: each source's failed and uncertain posts
grouped by reason (their latest error), the groups that failed last first, with how many, when
the latest ended and a few post ids; a post's every attempt is on its admin page.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_connector_outbox import heartbeat
from django_connector_outbox.conf import conf
from django_connector_outbox.connectors import connectors
from django_connector_outbox.health import SourceHealth, source_health
from django_connector_outbox.installations.health import WorkspaceProblems, workspace_problems
from django_connector_outbox.management.operator import (
    add_source_and_database,
    duration,
    human,
    one_line,
    sources_and_database,
)
from django_connector_outbox.outbox import GateHold, HeldPost, Outbox
from django_connector_outbox.posts import Scope, State

# The exit status of a failed health check (1 is any other error, 2 a usage error).
TOO_OLD = 3
# The post ids shown per reason by --failed.
EXAMPLES = 3


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds")


class Command(BaseCommand):
    help = "Show each source's posts by state, its oldest due post and its holds."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_source_and_database(parser)
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument(
            "--fail-if-older",
            type=duration,
            metavar="AGE",
            help=f"exit with status {TOO_OLD} when a due post has waited longer than AGE (90, 15m, 2h)",
        )
        parser.add_argument(
            "--failed",
            action="store_true",
            help="list the failed and uncertain posts by reason instead of the counts",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=10,
            metavar="N",
            help="with --failed: at most N reasons per source (10)",
        )
        parser.add_argument(
            "--holds",
            type=int,
            default=10,
            metavar="N",
            help="list at most N held posts and N held places per source (10)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sources = sources_and_database(options)
        if options["failed"]:
            if options["fail_if_older"] is not None:
                raise CommandError(
                    "--failed lists failures; run the health check (--fail-if-older) on its own"
                )
            self._failures(sources, options["database"], max(options["limit"], 0), json_=options["json"])
            return
        health = [
            source_health(Outbox(source, using=options["database"]), holds=max(options["holds"], 0))
            for source in sources
        ]
        problems = {
            source: workspace_problems(
                source,
                using=options["database"],
                limit=max(options["holds"], 0),
                installed_only=not hasattr(connectors[source], "destinations"),
            )
            for source in sources
            if conf.CONNECTORS[source].get("OPTIONS", {}).get("installations") is True
        }
        now = timezone.now()
        running = heartbeat.senders(
            options["database"], now, conf.LEASE, None if not options["sources"] else sources
        )
        limit = options["fail_if_older"]
        too_old = [h for h in health if limit is not None and h.oldest_due and h.oldest_due.age > limit]
        if options["json"]:
            document = self._json(health, limit, too_old)
            for entry in document["sources"]:
                if entry["source"] in problems:
                    entry["installations"] = self._problems_json(problems[entry["source"]])
            document["senders"] = [self._sender_json(seen) for seen in running]
            self.stdout.write(json.dumps(document, indent=2))
        else:
            self._table(health)
            for source, found in problems.items():
                self._problems(source, found)
            self._senders(running, now)
        if too_old:
            waits = ", ".join(
                f"{h.source} {human(h.oldest_due.age)} ({h.oldest_due.post_id})"
                for h in too_old
                if h.oldest_due
            )
            raise CommandError(
                f"oldest due post waits longer than {human(limit or 0)}: {waits}", returncode=TOO_OLD
            )

    def _table(self, health: list[SourceHealth]) -> None:
        header = ["source", *State.values, "oldest due"]
        rows = [
            [
                h.source,
                *(str(h.counts[state]) for state in State.values),
                f"{human(h.oldest_due.age)} ({h.oldest_due.post_id})" if h.oldest_due else "-",
            ]
            for h in health
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            cells = [row[0].ljust(widths[0])]
            cells += [cell.rjust(width) for cell, width in zip(row[1:-1], widths[1:-1], strict=True)]
            cells.append(row[-1])
            self.stdout.write("  ".join(cells))
        for h in health:
            if not h.held:
                continue
            posts = "post waits" if h.held == 1 else "posts wait"
            self.stdout.write(f"holds of {h.source}: {h.held} {posts} after a retry or a Retry-After")
            for hold in h.holds:
                self.stdout.write(f"  {self._hold(hold, h.at)}")
            if h.held > len(h.holds):
                self.stdout.write(f"  ... and {h.held - len(h.holds)} more")
        for h in health:
            places = sum(h.held_places.values())
            if not places:
                continue
            self.stdout.write(f"held places of {h.source}: {self._places(h.held_places)}")
            for gate in h.place_holds:
                self.stdout.write(f"  {self._place_hold(gate, h.at)}")
            if places > len(h.place_holds):
                self.stdout.write(f"  ... and {places - len(h.place_holds)} more")

    def _failures(self, sources: list[str], using: str, limit: int, *, json_: bool) -> None:
        found = {source: Outbox(source, using=using).failures(limit, EXAMPLES) for source in sources}
        if json_:
            document = {
                "sources": [
                    {
                        "source": source,
                        "posts": failures.posts,
                        "reasons": failures.reasons,
                        "groups": [
                            {
                                "state": group.state,
                                "reason": group.reason,
                                "count": group.posts,
                                "newest": iso(group.newest),
                                "post_ids": group.post_ids,
                            }
                            for group in failures.groups
                        ],
                    }
                    for source, failures in found.items()
                ]
            }
            self.stdout.write(json.dumps(document, indent=2))
            return
        for source, failures in found.items():
            if not failures.posts:
                self.stdout.write(f"failed and uncertain posts of {source}: none")
                continue
            reasons = f"{failures.reasons} reason{'' if failures.reasons == 1 else 's'}"
            self.stdout.write(f"failed and uncertain posts of {source}: {failures.posts} ({reasons})")
            for group in failures.groups:
                why = one_line(group.reason) or "(no reason kept)"
                self.stdout.write(f"  {group.posts} {group.state}, latest {iso(group.newest)}: {why}")
                more = group.posts - len(group.post_ids)
                self.stdout.write(f"    {', '.join(group.post_ids)}{f' and {more} more' if more else ''}")
            if failures.reasons > len(failures.groups):
                rest = failures.reasons - len(failures.groups)
                self.stdout.write(f"  ... and {rest} more reason{'' if rest == 1 else 's'}")

    def _problems(self, source: str, found: WorkspaceProblems) -> None:
        if not found:
            return
        parts = [f"{found.revoked} revoked"] if found.revoked else []
        parts += [f"{found.failing} failing to refresh"] if found.failing else []
        if found.not_installed:
            parts.append(f"{len(found.not_installed)} with posts waiting and no installation")
        self.stdout.write(f"workspaces of {source}: {', '.join(parts)}")
        for revoked in found.revoked_shown:
            why = one_line(revoked.reason) or "(no reason kept)"
            self.stdout.write(
                f"  {revoked.workspace_id} revoked at {iso(revoked.at)}: {why}; install the app again"
            )
        if found.revoked > len(found.revoked_shown):
            self.stdout.write(f"  ... and {found.revoked - len(found.revoked_shown)} more revoked")
        for failing in found.failing_shown:
            self.stdout.write(f"  {failing.workspace_id} refresh failing: {one_line(failing.error)}")
        if found.failing > len(found.failing_shown):
            self.stdout.write(f"  ... and {found.failing - len(found.failing_shown)} more failing")
        for workspace_id in found.not_installed:
            self.stdout.write(
                f"  {workspace_id} has posts waiting and no installation: install the app there"
            )

    def _senders(self, running: list[heartbeat.SenderSeen], now: datetime) -> None:
        """The running senders as a table; a silent one is flagged."""
        if not running:
            self.stdout.write("senders: none running")
            return
        silent = sum(seen.silent for seen in running)
        flagged = f", {silent} silent for longer than LEASE ({human(conf.LEASE)})" if silent else ""
        self.stdout.write(f"senders: {len(running)}{flagged}")
        header = ["worker", "host", "pid", "sources", "started", "last seen", "posts sent"]
        rows = [
            [
                seen.worker, seen.host, str(seen.pid), ",".join(seen.sources), iso(seen.started_at),
                f"{human(max((now - seen.last_seen).total_seconds(), 0))} ago", str(seen.sent),
                "SILENT" if seen.silent else "",
            ]
            for seen in running
        ]  # fmt: skip
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [[*header, ""], *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            self.stdout.write("  ".join(["", *cells, row[-1]]).rstrip())

    @staticmethod
    def _sender_json(seen: heartbeat.SenderSeen) -> dict[str, Any]:
        return {
            "worker": seen.worker,
            "host": seen.host,
            "pid": seen.pid,
            "sources": seen.sources,
            "started_at": iso(seen.started_at),
            "last_seen": iso(seen.last_seen),
            "posts_sent": seen.sent,
            "silent": seen.silent,
        }

    @staticmethod
    def _problems_json(found: WorkspaceProblems) -> dict[str, Any]:
        return {
            "revoked": found.revoked,
            "revoked_shown": [
                {"workspace_id": r.workspace_id, "revoked_at": iso(r.at), "reason": r.reason}
                for r in found.revoked_shown
            ],
            "refresh_failing": found.failing,
            "refresh_failing_shown": [
                {"workspace_id": f.workspace_id, "error": f.error} for f in found.failing_shown
            ],
            "not_installed": found.not_installed,
        }

    @staticmethod
    def _hold(hold: HeldPost, now: datetime) -> str:
        wait = human((hold.next_at - now).total_seconds())
        return (
            f"{hold.post_id} in {hold.workspace_id}/{hold.container_id} until {iso(hold.next_at)} "
            f"(in {wait}), attempts {hold.attempts}: {one_line(hold.last_error) or '(no reason kept)'}"
        )

    @staticmethod
    def _places(counts: dict[str, int]) -> str:
        """How many places of each scope are held: "the whole source, 2 workspaces, 1 container"."""
        parts = []
        for scope, n in counts.items():
            if n and scope == Scope.SOURCE:
                parts.append("the whole source")
            elif n:
                parts.append(f"{n} {scope}{'' if n == 1 else 's'}")
        return ", ".join(parts)

    @staticmethod
    def _place_hold(gate: GateHold, now: datetime) -> str:
        match gate.scope:
            case Scope.SOURCE:
                place = "the whole source"
            case Scope.WORKSPACE:
                place = f"workspace {gate.workspace_id}"
            case _:
                place = f"container {gate.workspace_id}/{gate.container_id}"
        wait = human((gate.held_until - now).total_seconds())
        return (
            f"{place} until {iso(gate.held_until)} (in {wait}): {one_line(gate.reason) or '(no reason kept)'}"
        )

    @staticmethod
    def _json(health: list[SourceHealth], limit: float | None, too_old: list[SourceHealth]) -> dict[str, Any]:
        sources = [
            {
                "source": h.source,
                "at": iso(h.at),
                "counts": h.counts,
                "depth": h.depth,
                "oldest_due": {
                    "post_id": h.oldest_due.post_id,
                    "queued_at": iso(h.oldest_due.queued_at),
                    "age": round(h.oldest_due.age, 3),
                }
                if h.oldest_due
                else None,
                "held": h.held,
                "holds": [
                    {
                        "post_id": hold.post_id,
                        "workspace_id": hold.workspace_id,
                        "container_id": hold.container_id,
                        "next_at": iso(hold.next_at),
                        "attempts": hold.attempts,
                        "last_error": hold.last_error,
                    }
                    for hold in h.holds
                ],
                "held_places": h.held_places,
                "place_holds": [
                    {
                        "scope": gate.scope,
                        "workspace_id": gate.workspace_id,
                        "container_id": gate.container_id,
                        "held_until": iso(gate.held_until),
                        "reason": gate.reason,
                    }
                    for gate in h.place_holds
                ],
            }
            for h in health
        ]
        document: dict[str, Any] = {"sources": sources}
        if limit is not None:
            document["fail_if_older"] = limit
            document["too_old"] = [h.source for h in too_old]
        return document
