"""What the operators' commands share: durations, checks of their arguments, and the
select-then-act loop of `outbox_retry` and `outbox_cancel`.

Those two select posts with a Post queryset and act on each through the Outbox
(`requeue`, `cancel_queued`), never with a bulk UPDATE: the Outbox locks the post's lane and
checks its state again, so a post that a sender claimed meanwhile is left alone.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone
from django.utils.translation import gettext, ngettext

from django_connector_outbox.conf import MAX_DURATION, conf
from django_connector_outbox.health import NotMigrated, require_tables
from django_connector_outbox.models import QUEUE_ORDER, Post
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State
from django_connector_outbox.validation import text_flaw

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise as StrOrPromise


class OutboxCommand(BaseCommand):
    """A command whose `help` is lazy (translated in the language of each run): argparse
    formats its description with `re`, which takes no lazy string, so `--help` would raise
    TypeError. The parser gets it as a plain string, translated when the parser is made."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        self.help = str(self.help)
        return super().create_parser(prog_name, subcommand, **kwargs)


UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DURATION = re.compile(r"(?P<number>\d+(?:\.\d+)?)(?P<unit>[smhd]?)")


def duration(value: str) -> float:
    """Seconds from "90", "1.5", "15m", "2h" or "7d" (an argparse type): 0 up to ten years."""
    match = DURATION.fullmatch(value.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            gettext("must be seconds, or a number with s, m, h or d, got %(value)r") % {"value": value}
        )
    number = float(match["number"]) * UNITS[match["unit"]]
    if number > MAX_DURATION:
        raise argparse.ArgumentTypeError(
            gettext("must be at most %(max)s seconds, got %(value)r") % {"max": MAX_DURATION, "value": value}
        )
    return number


def human(seconds: float) -> str:
    """A duration as an operator reads it: 4.2s, 3m05s, 2h07m, 3d04h."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def one_line(text: str, limit: int = 200) -> str:
    """A reason on one line of a terminal: whitespace runs (newlines too) become one space."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def add_source_and_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        action="append",
        dest="sources",
        metavar="NAME",
        help=gettext("only this source (repeatable)"),
    )
    parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help=gettext("database alias (default)"))


def check_text(options: dict[str, Any], arguments: dict[str, str]) -> None:
    """CommandError naming the argument for an id or name that no database stores alike (a
    lone surrogate, which is what bytes of the command line that are not UTF-8 become, or a
    NUL), as the Outbox refuses them in posts. `arguments`: option name -> name shown."""
    for name, shown in arguments.items():
        given = options.get(name)
        for value in [given] if isinstance(given, str) else given or ():
            flaw = text_flaw(value)
            if flaw:
                # ascii(): the value as an escape, which any terminal can print.
                raise CommandError(
                    gettext("%(argument)s %(value)s is not valid text: it %(flaw)s")
                    % {"argument": shown, "value": ascii(value), "flaw": flaw}
                )


def sources_and_database(options: dict[str, Any]) -> list[str]:
    """The sources asked for (all configured ones by default); CommandError for an unknown one."""
    check_text(options, {"sources": "--source", "database": "--database"})
    if options["database"] not in connections:
        raise CommandError(gettext("Unknown database alias %(alias)r") % {"alias": options["database"]})
    try:
        require_tables(options["database"])
    except NotMigrated as e:
        raise CommandError(str(e)) from e
    asked = options["sources"] or sorted(conf.CONNECTORS)
    unknown = sorted(set(asked) - set(conf.CONNECTORS))
    if unknown:
        configured = ", ".join(sorted(conf.CONNECTORS)) or gettext("none")
        raise CommandError(
            gettext("Unknown source %(sources)s; configured: %(configured)s")
            % {"sources": ", ".join(unknown), "configured": configured}
        )
    return list(dict.fromkeys(asked))


class PostActionCommand(OutboxCommand):
    """Select posts by ids and filters, then act on each through its Outbox (or, with
    --dry-run, say what would be done). Subclasses name the action and decide per post."""

    # What is said of the posts acted on, each sentence whole for its translations: a post
    # (%(post)s), a count (%(count)s), and the error without post ids or filters.
    done_line: StrOrPromise  # "retried %(post)s"
    would_line: StrOrPromise  # "would retry %(post)s"
    done_count: StrOrPromise  # "%(count)s retried"
    would_count: StrOrPromise  # "%(count)s would be retried"
    name_the_posts: StrOrPromise  # "Name the posts to retry: post ids, or ...; or --all"
    # The states selected when neither --state nor post ids are given.
    default_states: tuple[str, ...]
    # Why a post is skipped when `act` returns False.
    changed_meanwhile: StrOrPromise

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("post_ids", nargs="*", metavar="POST_ID", help=gettext("these posts (exact ids)"))
        add_source_and_database(parser)
        parser.add_argument(
            "--state",
            action="append",
            dest="states",
            choices=State.values,
            help=gettext("only posts in this state (repeatable; default %(states)s)")
            % {"states": ", ".join(self.default_states)},
        )
        parser.add_argument(
            "--container",
            action="append",
            dest="containers",
            metavar="ID",
            help=gettext("only this container id"),
        )
        parser.add_argument(
            "--older-than",
            type=duration,
            metavar="AGE",
            help=gettext("only posts queued (in their container's queue) more than AGE ago: 90, 15m, 2h, 7d"),
        )
        parser.add_argument(
            "--all",
            action="store_true",
            help=gettext("act without any post id or filter: every selected post"),
        )
        parser.add_argument(
            "--dry-run", action="store_true", help=gettext("say what would be done, change nothing")
        )

    def skip_reason(self, state: str, has_body: bool, options: dict[str, Any]) -> str | None:
        """Why this post is left alone, or None to act on it."""
        raise NotImplementedError

    def act(self, outbox: Outbox, post_id: str) -> bool:
        """Do it through the Outbox; False when the post changed meanwhile."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options, {"post_ids": "POST_ID", "containers": "--container"})
        sources = sources_and_database(options)
        filtered = any(options[name] for name in ("post_ids", "sources", "states", "containers"))
        if not filtered and options["older_than"] is None and not options["all"]:
            raise CommandError(str(self.name_the_posts))
        using = options["database"]
        posts = Post.objects.using(using).filter(source__in=sources)
        ids = list(dict.fromkeys(options["post_ids"]))
        if ids:
            posts = posts.filter(post_id__in=ids)
        states = options["states"] or (() if ids else self.default_states)
        if states:
            posts = posts.in_states(states)
        if options["containers"]:
            posts = posts.filter(container_id__in=options["containers"])
        if options["older_than"] is not None:
            posts = posts.filter(queued_at__lt=timezone.now() - timedelta(seconds=options["older_than"]))
        has_body = ExpressionWrapper(Q(body__isnull=False), output_field=BooleanField())
        rows = list(
            posts.with_claim()
            .annotate(has_body=has_body)
            .order_by(*QUEUE_ORDER)
            .values_list("source", "post_id", "current_state", "workspace_id", "container_id", "has_body")
        )
        outboxes = {source: Outbox(source, using=using) for source in sources}
        dry_run = options["dry_run"]
        acted = skipped = 0
        for source, post_id, state, workspace_id, container_id, body in rows:
            what = f"{source}:{post_id} ({state}, {workspace_id}/{container_id})"
            reason = self.skip_reason(state, body, options)
            if reason is None and not dry_run and not self.act(outboxes[source], post_id):
                reason = str(self.changed_meanwhile)
            if reason is not None:
                skipped += 1
                self._say(options, gettext("skipped %(post)s: %(reason)s") % {"post": what, "reason": reason})
                continue
            acted += 1
            self._say(options, (self.would_line if dry_run else self.done_line) % {"post": what})
        unmatched = sorted(set(ids) - {row[1] for row in rows})
        summary = str((self.would_count if dry_run else self.done_count) % {"count": acted})
        if skipped:
            summary = ngettext(
                "%(summary)s, %(count)s skipped", "%(summary)s, %(count)s skipped", skipped
            ) % {
                "summary": summary,
                "count": skipped,
            }
        self.stdout.write(
            gettext("dry run: %(summary)s; nothing changed") % {"summary": summary} if dry_run else summary
        )
        if unmatched:
            # A mistyped id is an error (exit status 1), as `rm` of a missing file: the others
            # were acted on all the same.
            if options["sources"]:
                message = gettext("no post of %(sources)s matches %(ids)s")
            else:
                message = gettext("no post matches %(ids)s")
            raise CommandError(message % {"sources": ", ".join(sources), "ids": ", ".join(unmatched)})

    def _say(self, options: dict[str, Any], line: str) -> None:
        if options["verbosity"] >= 1:
            self.stdout.write(line)
