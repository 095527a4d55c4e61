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

from django.core.management.base import CommandError
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy, ngettext

from django_connector_outbox import heartbeat
from django_connector_outbox.conf import conf
from django_connector_outbox.connectors import connectors
from django_connector_outbox.health import SourceHealth, source_health
from django_connector_outbox.installations.health import WorkspaceProblems, workspace_problems
from django_connector_outbox.management.operator import (
    OutboxCommand,
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


class Command(OutboxCommand):
    help = gettext_lazy("Show each source's posts by state, its oldest due post and its holds.")  # type: ignore[assignment]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_source_and_database(parser)
        parser.add_argument("--json", action="store_true", help=gettext("print JSON instead of a table"))
        parser.add_argument(
            "--fail-if-older",
            type=duration,
            metavar="AGE",
            help=gettext(
                "exit with status %(status)s when a due post has waited longer than AGE (90, 15m, 2h)"
            )
            % {"status": TOO_OLD},
        )
        parser.add_argument(
            "--failed",
            action="store_true",
            help=gettext("list the failed and uncertain posts by reason instead of the counts"),
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=10,
            metavar="N",
            help=gettext("with --failed: at most N reasons per source (10)"),
        )
        parser.add_argument(
            "--holds",
            type=int,
            default=10,
            metavar="N",
            help=gettext("list at most N held posts and N held places per source (10)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sources = sources_and_database(options)
        if options["failed"]:
            if options["fail_if_older"] is not None:
                raise CommandError(
                    gettext("--failed lists failures; run the health check (--fail-if-older) on its own")
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
                gettext("oldest due post waits longer than %(limit)s: %(waits)s")
                % {"limit": human(limit or 0), "waits": waits},
                returncode=TOO_OLD,
            )

    def _table(self, health: list[SourceHealth]) -> None:
        header = [gettext("source"), *State.values, gettext("oldest due")]
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
            line = ngettext(
                "holds of %(source)s: %(count)s post waits after a retry or a Retry-After",
                "holds of %(source)s: %(count)s posts wait after a retry or a Retry-After",
                h.held,
            )
            self.stdout.write(line % {"source": h.source, "count": h.held})
            for hold in h.holds:
                self.stdout.write(f"  {self._hold(hold, h.at)}")
            if h.held > len(h.holds):
                self.stdout.write(self._more(h.held - len(h.holds)))
        for h in health:
            places = sum(h.held_places.values())
            if not places:
                continue
            self.stdout.write(
                gettext("held places of %(source)s: %(places)s")
                % {"source": h.source, "places": self._places(h.held_places)}
            )
            for gate in h.place_holds:
                self.stdout.write(f"  {self._place_hold(gate, h.at)}")
            if places > len(h.place_holds):
                self.stdout.write(self._more(places - len(h.place_holds)))

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
                self.stdout.write(
                    gettext("failed and uncertain posts of %(source)s: none") % {"source": source}
                )
                continue
            reasons = ngettext("%(count)s reason", "%(count)s reasons", failures.reasons) % {
                "count": failures.reasons
            }
            self.stdout.write(
                gettext("failed and uncertain posts of %(source)s: %(count)s (%(reasons)s)")
                % {"source": source, "count": failures.posts, "reasons": reasons}
            )
            for group in failures.groups:
                why = one_line(group.reason) or gettext("(no reason kept)")
                self.stdout.write(
                    gettext("  %(count)s %(state)s, latest %(when)s: %(reason)s")
                    % {"count": group.posts, "state": group.state, "when": iso(group.newest), "reason": why}
                )
                more = group.posts - len(group.post_ids)
                ids = ", ".join(group.post_ids)
                if more:
                    ids = gettext("%(ids)s and %(count)s more") % {"ids": ids, "count": more}
                self.stdout.write(f"    {ids}")
            if failures.reasons > len(failures.groups):
                rest = failures.reasons - len(failures.groups)
                self.stdout.write(
                    ngettext("  ... and %(count)s more reason", "  ... and %(count)s more reasons", rest)
                    % {"count": rest}
                )

    def _problems(self, source: str, found: WorkspaceProblems) -> None:
        if not found:
            return
        parts = [gettext("%(count)s revoked") % {"count": found.revoked}] if found.revoked else []
        parts += [gettext("%(count)s failing to refresh") % {"count": found.failing}] if found.failing else []
        if found.not_installed:
            parts.append(
                gettext("%(count)s with posts waiting and no installation")
                % {"count": len(found.not_installed)}
            )
        self.stdout.write(
            gettext("workspaces of %(source)s: %(problems)s")
            % {"source": source, "problems": ", ".join(parts)}
        )
        for revoked in found.revoked_shown:
            why = one_line(revoked.reason) or gettext("(no reason kept)")
            self.stdout.write(
                gettext("  %(workspace)s revoked at %(when)s: %(reason)s; install the app again")
                % {"workspace": revoked.workspace_id, "when": iso(revoked.at), "reason": why}
            )
        if found.revoked > len(found.revoked_shown):
            self.stdout.write(
                gettext("  ... and %(count)s more revoked")
                % {"count": found.revoked - len(found.revoked_shown)}
            )
        for failing in found.failing_shown:
            self.stdout.write(
                gettext("  %(workspace)s refresh failing: %(error)s")
                % {"workspace": failing.workspace_id, "error": one_line(failing.error)}
            )
        if found.failing > len(found.failing_shown):
            self.stdout.write(
                gettext("  ... and %(count)s more failing")
                % {"count": found.failing - len(found.failing_shown)}
            )
        for workspace_id in found.not_installed:
            self.stdout.write(
                gettext("  %(workspace)s has posts waiting and no installation: install the app there")
                % {"workspace": workspace_id}
            )

    def _senders(self, running: list[heartbeat.SenderSeen], now: datetime) -> None:
        """The running senders as a table; a silent one is flagged."""
        if not running:
            self.stdout.write(gettext("senders: none running"))
            return
        silent = sum(seen.silent for seen in running)
        flagged = (
            gettext(", %(count)s silent for longer than LEASE (%(lease)s)")
            % {"count": silent, "lease": human(conf.LEASE)}
            if silent
            else ""
        )
        self.stdout.write(
            gettext("senders: %(count)s%(flagged)s") % {"count": len(running), "flagged": flagged}
        )
        header = [
            gettext("worker"), gettext("host"), gettext("pid"), gettext("sources"), gettext("started"),
            gettext("last seen"), gettext("posts sent"), gettext("in flight"), gettext("loop lag"),
        ]  # fmt: skip
        rows = [
            [
                seen.worker, seen.host, str(seen.pid), ",".join(seen.sources), iso(seen.started_at),
                gettext("%(age)s ago") % {"age": human(max((now - seen.last_seen).total_seconds(), 0))},
                str(seen.sent), str(seen.in_flight),
                "-" if seen.loop_lag is None else f"{seen.loop_lag * 1000:.0f} ms",
                gettext("SILENT") if seen.silent else "",
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
            "sends_in_flight": seen.in_flight,
            "loop_lag_seconds": seen.loop_lag,
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
        return gettext(
            "%(post)s in %(place)s until %(when)s (in %(wait)s), attempts %(attempts)s: %(reason)s"
        ) % {
            "post": hold.post_id,
            "place": f"{hold.workspace_id}/{hold.container_id}",
            "when": iso(hold.next_at),
            "wait": wait,
            "attempts": hold.attempts,
            "reason": one_line(hold.last_error) or gettext("(no reason kept)"),
        }

    @staticmethod
    def _more(count: int) -> str:
        return gettext("  ... and %(count)s more") % {"count": count}

    @staticmethod
    def _places(counts: dict[str, int]) -> str:
        """How many places of each scope are held: "the whole source, 2 workspaces, 1 container"."""
        parts = []
        for scope, n in counts.items():
            if n and scope == Scope.SOURCE:
                parts.append(gettext("the whole source"))
            elif n and scope == Scope.WORKSPACE:
                parts.append(ngettext("%(count)s workspace", "%(count)s workspaces", n) % {"count": n})
            elif n:
                parts.append(ngettext("%(count)s container", "%(count)s containers", n) % {"count": n})
        return ", ".join(parts)

    @staticmethod
    def _place_hold(gate: GateHold, now: datetime) -> str:
        match gate.scope:
            case Scope.SOURCE:
                place = gettext("the whole source")
            case Scope.WORKSPACE:
                place = gettext("workspace %(id)s") % {"id": gate.workspace_id}
            case _:
                place = gettext("container %(id)s") % {"id": f"{gate.workspace_id}/{gate.container_id}"}
        wait = human((gate.held_until - now).total_seconds())
        return gettext("%(place)s until %(when)s (in %(wait)s): %(reason)s") % {
            "place": place,
            "when": iso(gate.held_until),
            "wait": wait,
            "reason": one_line(gate.reason) or gettext("(no reason kept)"),
        }

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
