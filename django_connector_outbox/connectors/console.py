"""Prints each post readably: the connector for a first look and for development."""

from __future__ import annotations

import itertools
import json
import sys
import threading
from typing import Any, TextIO

from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox.connectors.base import Connector, Delivered, Outcome
from django_connector_outbox.posts import ClaimedPost, Kind


class ConsoleConnector(Connector):
    """Writes one block per post to `stream` (standard output by default); a delete is one line."""

    kinds = frozenset(Kind.values)

    def __init__(self, source: str, *, stream: TextIO | None = None, **options: Any) -> None:
        super().__init__(source, **options)
        self.stream = stream
        self._lock = threading.Lock()  # one post's lines never interleave with another's
        self._ids = itertools.count(1)

    def check(self) -> list[checks.CheckMessage]:
        """E221: a `stream` that cannot be written to (every send would fail)."""
        if self.stream is None or (
            callable(getattr(self.stream, "write", None)) and callable(getattr(self.stream, "flush", None))
        ):
            return []
        return [
            checks.Error(
                gettext(
                    "CONNECTOR_OUTBOX source %(source)r: the console OPTIONS['stream'] must be a text stream "
                    "(with write() and flush()), such as sys.stderr, not %(stream)r."
                )
                % {"source": self.source, "stream": self.stream},
                hint=gettext("Leave it out to print to standard output."),
                id="connector_outbox.E221",
            )
        ]

    def send(self, post: ClaimedPost) -> Outcome:
        place = f"{post.workspace_id}/{post.container_id}" + (
            f" thread {post.thread_id}" if post.thread_id else ""
        )
        if post.kind == Kind.DELETE:  # a retract: the message of its ref is taken away
            with self._lock:
                stream = self.stream or sys.stdout
                stream.write(f"[{self.source}] delete {post.message_ref} -> {place} ({post.post_id})\n")
                stream.flush()
            return Delivered(post.message_ref)
        with self._lock:
            ref = post.message_ref or f"{post.container_id}:{next(self._ids)}"
            verb = "edit" if post.kind == Kind.STATUS and post.message_ref else post.kind
            stream = self.stream or sys.stdout
            stream.write(f"[{self.source}] {verb} {post.post_id} -> {place} (ref {ref})\n")
            stream.write(f"    {json.dumps(post.body, ensure_ascii=False, sort_keys=True)}\n")
            stream.flush()
        has_ref = post.kind in (Kind.MESSAGE, Kind.STATUS)
        return Delivered(ref if has_ref else None)
