"""Slack, through the official slack-sdk `WebClient`: build one Web API call, map Slack's answer.

Every create carries message metadata naming the post, so that after a lost reply the post can
be found again in the channel's history (Slack has no idempotency key for chat.postMessage).
The full mapping of Slack's answers to outcomes is in docs/connectors/slack.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.error import URLError
from urllib.parse import urlsplit

import aiohttp
from django.core import checks
from django.utils.translation import gettext
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.web import SlackResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from django_connector_outbox.conf import seconds
from django_connector_outbox.connectors import slack_render
from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
    Connector,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
    blocking,
)
from django_connector_outbox.connectors.plans import Driven, Offload, cached_or
from django_connector_outbox.connectors.slack_calls import Grant, error_code, text_of
from django_connector_outbox.connectors.spread import Recent429s
from django_connector_outbox.connectors.text import is_header_token, scrub
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope

if TYPE_CHECKING:
    from django_connector_outbox.connectors.slack_installations import WorkspaceTokens
    from django_connector_outbox.installations.cache import TtlCache

DEFAULT_BASE_URL: Final = "https://slack.com/api/"
DEFAULT_TIMEOUT: Final = 10.0

#: The metadata event type of every message the outbox creates; its payload is {"post_id": ...}.
EVENT_TYPE: Final = "connector_outbox"

#: A lookup starts this long before the claim's `sent_at`: Slack's clock is not ours.
LOOKUP_SKEW: Final = timedelta(seconds=60)
#: Slack recommends "no more than 200 results at a time" (conversations.history): the page of a
#: Marketplace or internal app (OPTIONS ``marketplace``), whose lookups are Tier 3.
LOOKUP_PAGE_SIZE: Final = 200
#: Any other app's: "for new applications and installation commercially distributed outside of
#: the Marketplace, this method is rate limited to 1 request per minute. The maximum and default
#: values for the limit parameter have both been reduced to 15 objects" (conversations.history
#: and .replies; existing installations too since 2026-03-03). Such a lookup reads one page a
#: call, in a window tight around its post, and goes on where it stopped at the next lookup.
NON_MARKETPLACE_PAGE_SIZE: Final = 15
#: How long, and for how many claims, a non-Marketplace lookup keeps where it stopped.
LOOKUP_CURSOR_TTL: Final = 3600.0
LOOKUP_CURSORS: Final = 10_000
#: A lookup that needs more pages than this gives up for now (CheckLater) rather than loop.
#: 1,000 messages is a quarter of an hour of a channel at Slack's one message a second, and
#: keeps the worst lookup (pages x timeout) well inside the default LEASE with a send after it.
LOOKUP_MAX_PAGES: Final = 5

#: Waits (seconds) where Slack says "wait" but not for how long.
RATE_LIMIT_FALLBACK: Final = 60.0  # a 429 without a usable Retry-After; legacy `rate_limited`
USAGE_LIMIT_WAIT: Final = 900.0  # `message_limit_exceeded`: a free workspace's usage limit
MIGRATION_WAIT: Final = 300.0  # `team_added_to_org`, `org_login_required`: a workspace migrating

#: The body keys chat.update accepts; the rest of a chat.postMessage body (username,
#: icon_emoji, unfurl_links, ...) is not editable and is dropped from an edit. `metadata` is
#: left out on purpose: without it Slack keeps the message's metadata, our post id.
UPDATE_ARGS: Final = frozenset(
    {"text", "blocks", "attachments", "markdown_text", "link_names", "parse", "reply_broadcast", "file_ids"}
)

#: Keys a body may not carry: the place comes from the post, `metadata` is how the outbox finds
#: a post again, and slack-sdk would take a `token` argument as the credential of the call.
RESERVED_ARGS: Final = frozenset({"channel", "thread_ts", "ts", "metadata", "token"})

RATE_LIMIT_CODES: Final = frozenset({"ratelimited", "rate_limited", "message_limit_exceeded"})
#: Methods whose limit is a tier, "applied on a per API method per workspace/team per app
#: basis" (Slack's rate-limits page): chat.update, chat.delete and reactions.add are Tier 3
#: (50+ per minute), chat.postEphemeral Tier 4. Their 429 holds the workspace: every other
#: channel would get one.
WORKSPACE_TIER_METHODS: Final = frozenset(
    {"chat.update", "chat.delete", "reactions.add", "chat.postEphemeral"}
)
#: chat.postMessage keeps "one message per second per channel, while also maintaining a
#: workspace-wide limit", and its 429 does not say which one tripped. A 429 holds the channel;
#: once 429s come from this many channels of one workspace within the window, the workspace.
WORKSPACE_429_CHANNELS: Final = 2
WORKSPACE_429_WINDOW: Final = 10.0  # seconds
TRANSIENT_CODES: Final = frozenset(
    {
        "service_unavailable",
        "request_timeout",  # "POST data was either missing or truncated": never processed
        "external_channel_migrating",
        "streaming_state_conflict",
        "update_failed",
    }
)
SLOW_TRANSIENT_CODES: Final = frozenset({"team_added_to_org", "org_login_required"})
#: "possible some aspect of the operation succeeded": ambiguous on a create, retried otherwise.
AMBIGUOUS_CODES: Final = frozenset({"fatal_error", "internal_error"})
PERMANENT_CODES: Final = frozenset(
    {
        # credentials and configuration: an operator must act
        "not_authed",
        "invalid_auth",
        "token_revoked",
        "token_expired",
        "account_inactive",
        "missing_scope",
        "not_allowed_token_type",
        "no_permission",
        "access_denied",
        "accesslimited",
        "ekm_access_denied",
        "enterprise_is_restricted",
        "team_not_found",
        "two_factor_setup_required",
        "app_access_restricted",
        "is_bot",
        "as_user_not_supported",
        "method_deprecated",
        "deprecated_endpoint",
        "unknown_method",
        # the destination refuses
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "restricted_action",
        "restricted_action_read_only_channel",
        "restricted_action_thread_only_channel",
        "restricted_action_non_threadable_channel",
        "restricted_action_thread_locked",
        "cannot_reply_to_message",
        "messages_tab_disabled",
        "user_not_in_channel",
        "is_inactive",
        "thread_locked",
        # the payload is invalid
        "msg_too_long",
        "msg_blocks_too_long",
        "no_text",
        "invalid_blocks",
        "invalid_blocks_format",
        "invalid_attachments",
        "too_many_attachments",
        "attachment_payload_limit_exceeded",
        "markdown_text_conflict",
        "invalid_metadata_format",
        "invalid_metadata_schema",
        "metadata_too_large",
        "metadata_must_be_sent_from_app",
        "invalid_arg_name",
        "invalid_array_arg",
        "invalid_charset",
        "invalid_form_data",
        "invalid_post_type",
        "missing_post_type",
        "invalid_name",
        "bad_timestamp",
        "invalid_thread_ts",  # a malformed thread_ts ("0 is not a valid thread_ts")
        # the target message refuses
        "message_not_found",
        "cant_update_message",
        "cant_delete_message",  # chat.delete of a message this token may not delete
        "compliance_exports_prevent_deletion",  # the workspace's exports keep its messages
        "edit_window_closed",
        "block_mismatch",
        "not_reactable",
        "too_many_emoji",
        "too_many_reactions",
    }
)

#: Answers meaning the token no longer works: the installation is revoked (installations only;
#: with a plain token they are refusals like any other).
REVOKED_CODES: Final = frozenset({"invalid_auth", "token_revoked", "account_inactive"})
#: Answers after which an installation's call is made once more, within the same send, with
#: the token saved since (a refresh, a re-install).
RENEWING_CODES: Final = REVOKED_CODES | {"token_expired"}
#: The requests an installation's token may add to a send or a lookup: a refresh before (due),
#: and after a `token_expired` answer a refresh and the call again.
RENEWAL_REQUESTS: Final = 3


T = TypeVar("T")


@dataclass(frozen=True)
class _Request:
    """One Web API call of a plan, for a door to make (`_request`, `_arequest`)."""

    grant: Grant
    method: str
    args: Mapping[str, Any]
    create: bool  # a repeat could post twice


#: What a send or a lookup does, written once for both doors: a generator that yields its
#: steps, is sent each step's answer (or has its exception thrown in), and returns the result.
Plan = Generator[_Request | Offload, Any, T]


class _Failed(Exception):
    """A call that did not succeed, with the outcome it means for the post."""

    def __init__(self, outcome: Outcome, code: str | None = None, *, uninstalled: bool = False) -> None:
        self.reason: str = getattr(outcome, "reason", "")
        super().__init__(self.reason)
        self.outcome = outcome
        self.code = code  # Slack's error code, when Slack answered
        self.uninstalled = uninstalled  # the workspace has no usable installation


class SlackConnector(Connector):
    """Posts to Slack with a bot token, or each workspace's installation's; message, status,
    reaction and ephemeral posts, and a retract's delete (chat.delete).

    Place: `workspace_id` is the team id, `container_id` the conversation id, `thread_id` the
    parent message's ts ("" for top level). `message_ref` is "channel:ts".

    With ``installations=True`` (instead of `token`), each post is sent with the bot token of
    its workspace's installation (installations.Installations), refreshed before it expires;
    `client_id`, `client_secret`, `scopes` and `user_scopes` are the Slack app's (the refresh
    and the "Add to Slack" flow need them), `success_url` where that flow sends the installer
    at the end (installations/slack_views.py reads them).
    """

    kinds = frozenset(Kind.values)  # "delete" too: chat.delete
    lookup_requests = LOOKUP_MAX_PAGES
    #: "Posting messages: 1 per second. Short bursts >1 allowed." (Slack's rate-limits page):
    #: one a second per channel, and no burst of ours, so that Slack's burst absorbs the jitter
    #: between a claim and its request (with a burst of 2 like Slack's, 5.8% of a drain at the
    #: limit drew 429s; bench/rate_limits.py). Slack publishes no figure for its workspace-wide
    #: limit, so there is no workspace pace: a workspace is held when its 429s spread across
    #: channels (`Recent429s`); set PACE if you know yours.
    pace = {Scope.CONTAINER: (1, 1.0)}

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return slack_render.problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return slack_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        token: str = "",
        installations: bool = False,
        client_id: str = "",
        client_secret: str = "",
        scopes: list[str] | tuple[str, ...] | str = (),
        user_scopes: list[str] | tuple[str, ...] | str = (),
        success_url: str | None = None,
        marketplace: bool = False,
        base_url: str = DEFAULT_BASE_URL,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        **options: Any,
    ) -> None:
        if options:
            raise TypeError(
                f"{type(self).__name__} of source {source!r} got unknown OPTIONS "
                f"{', '.join(sorted(options))}; it takes token, installations, client_id, "
                "client_secret, scopes, user_scopes, success_url, marketplace, base_url and timeout"
            )
        super().__init__(source)
        # A token read from a secrets file ends with a newline; Slack's never has whitespace.
        self._token = token.strip() if isinstance(token, str) else ""
        # Kept raw for check(), which reports them instead of a traceback at send time.
        self._base_url = base_url
        self._timeout_option = timeout
        self._installations_option = installations
        self.client_id = client_id.strip() if isinstance(client_id, str) else ""
        self.client_secret = client_secret.strip() if isinstance(client_secret, str) else ""
        self.scopes = scopes
        self.user_scopes = user_scopes
        self.success_url = success_url
        # A bad timeout is reported by check() (E102); meanwhile the default keeps it usable.
        self.timeout = _positive_seconds(timeout) or DEFAULT_TIMEOUT
        self.marketplace = marketplace is True
        # Where the lookup of each claim (post id, sent_at) stopped, for a non-Marketplace
        # app's next lookup to go on from: one page a minute. (Imported here: the
        # installations package reads models, which a connector module must not at import.)
        from django_connector_outbox.installations.cache import TtlCache

        self._lookup_cursors: TtlCache[str] = TtlCache(ttl=LOOKUP_CURSOR_TTL, size=LOOKUP_CURSORS)
        self.recent_429s = Recent429s(WORKSPACE_429_WINDOW)
        #: With installations, the workspaces' tokens (and `client` makes no call); else None.
        self.tokens: WorkspaceTokens | None = None
        if installations is True:
            from django_connector_outbox.connectors.slack_installations import WorkspaceTokens

            self.tokens = WorkspaceTokens(
                source,
                client_id=self.client_id,
                client_secret=self.client_secret,
                make_client=self._client,
            )
            # E009 sizes the LEASE for a lookup and a send: one of them may renew the token
            # (the token renewed for the lookup is fresh for the send after it).
            self.lookup_requests = LOOKUP_MAX_PAGES + RENEWAL_REQUESTS
        self.client = self._client(self._token)
        # The coroutine door's AsyncWebClient, with its aiohttp session, per event loop.
        self._sessions: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncWebClient]
        ] = weakref.WeakKeyDictionary()
        self._sessions_lock = threading.Lock()

    def _client(self, token: str, logger: logging.Logger | None = None) -> WebClient:
        # retry_handlers=[]: slack-sdk's default ConnectionErrorRetryHandler re-sends a request
        # whose connection was dropped after it was sent, which posts the same message twice;
        # the outbox decides about retries (and looks the post up first).
        return WebClient(
            token=token or None,
            base_url=self._base_url if isinstance(self._base_url, str) else DEFAULT_BASE_URL,
            timeout=self.timeout,  # type: ignore[arg-type]  # urllib takes float seconds
            retry_handlers=[],
            logger=logger,
        )

    def check(self) -> list[checks.CheckMessage]:
        """E101: no token (nor installations); E102: a timeout that is not a positive duration;
        E103: a bad base_url; E104-E109: the installations options (see `_check_installations`)."""
        errors: list[checks.CheckMessage] = []
        uses_installations = self._installations_option is not False
        if not self._token and not uses_installations:
            errors.append(
                checks.Error(
                    gettext("Connector outbox source %(source)r: the Slack OPTIONS need a 'token'.")
                    % {"source": self.source},
                    hint=gettext(
                        "Set OPTIONS['token'] to the app's bot token (xoxb-...), or OPTIONS['installations'] to "
                        "True for an app installed in many workspaces."
                    ),
                    id="connector_outbox.E101",
                )
            )
        elif self._token and not is_header_token(self._token):
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS['token'] must be printable ASCII "
                        "without spaces; this one cannot be sent in an HTTP header."
                    )
                    % {"source": self.source},
                    id="connector_outbox.E101",
                )
            )
        if _positive_seconds(self._timeout_option) is None:
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS['timeout'] must be a positive "
                        "number of seconds, not %(value)r."
                    )
                    % {"source": self.source, "value": self._timeout_option},
                    id="connector_outbox.E102",
                )
            )
        url = urlsplit(self._base_url) if isinstance(self._base_url, str) else None
        if url is None or url.scheme not in ("http", "https") or not url.netloc:
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS['base_url'] must be an http(s) "
                        "URL, not %(value)r."
                    )
                    % {"source": self.source, "value": self._base_url},
                    hint=gettext("Leave it out to use %(url)s.") % {"url": DEFAULT_BASE_URL},
                    id="connector_outbox.E103",
                )
            )
        return errors + self._check_installations(uses_installations)

    def _check_installations(self, uses_installations: bool) -> list[checks.CheckMessage]:
        """E104: both a token and installations; E105: installations not True or False; E106:
        installations without client_id or client_secret; E107: scopes or user_scopes not a list
        of scope names (or a comma-separated string); E108: success_url not a non-empty string;
        E109: OAuth options without installations."""
        source = {"source": self.source}
        oauth = {
            name: value
            for name, value in (
                ("client_id", self.client_id),
                ("client_secret", self.client_secret),
                ("scopes", self.scopes),
                ("user_scopes", self.user_scopes),
                ("success_url", self.success_url),
            )
            if value
        }
        if not uses_installations:
            if not oauth:
                return []
            return [
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS set %(names)s without "
                        "'installations': they are used only with it."
                    )
                    % {**source, "names": ", ".join(oauth)},
                    hint=gettext("Set OPTIONS['installations'] to True, or leave them out."),
                    id="connector_outbox.E109",
                )
            ]
        errors: list[checks.CheckMessage] = []
        if self._token:
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS set both 'token' and "
                        "'installations': a source uses one token, or each workspace's installation."
                    )
                    % source,
                    hint=gettext(
                        "Leave out 'token' (an app installed in many workspaces) or 'installations' (one workspace)."
                    ),
                    id="connector_outbox.E104",
                )
            )
        if self._installations_option is not True:
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS['installations'] must be True or "
                        "False, not %(value)r."
                    )
                    % {**source, "value": self._installations_option},
                    id="connector_outbox.E105",
                )
            )
        missing = [name for name in ("client_id", "client_secret") if not getattr(self, name)]
        if missing:
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS with 'installations' need "
                        "%(names)s: token refresh and the install flow authenticate with them."
                    )
                    % {**source, "names": gettext(" and ").join(repr(m) for m in missing)},
                    hint=gettext("Copy them from the app's Basic Information page at api.slack.com/apps."),
                    id="connector_outbox.E106",
                )
            )
        for name in ("scopes", "user_scopes"):
            value = getattr(self, name)
            if not isinstance(value, str) and (
                not isinstance(value, list | tuple)
                or not all(isinstance(s, str) and s.strip() for s in value)
            ):
                errors.append(
                    checks.Error(
                        gettext(
                            "Connector outbox source %(source)r: the Slack OPTIONS[%(name)r] must be a list of "
                            "scope names (or one comma-separated string), not %(value)r."
                        )
                        % {**source, "name": name, "value": value},
                        hint=gettext("For example %(scopes)s.")
                        % {"scopes": '["chat:write", "reactions:write", "channels:history"]'},
                        id="connector_outbox.E107",
                    )
                )
        if self.success_url is not None and (not isinstance(self.success_url, str) or not self.success_url):
            errors.append(
                checks.Error(
                    gettext(
                        "Connector outbox source %(source)r: the Slack OPTIONS['success_url'] must be a URL, a "
                        "path or a URL name, not %(value)r."
                    )
                    % {**source, "value": self.success_url},
                    hint=gettext("Leave it out to show the success page."),
                    id="connector_outbox.E108",
                )
            )
        return errors

    # -- the two doors: blocking (send, find_sent) and coroutine (asend, afind_sent)

    def send(self, post: ClaimedPost) -> Outcome:
        """Make the one Slack call of this post; every failure is mapped to an outcome."""
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        """`send` through AsyncWebClient, on the running loop: what run_outbox awaits."""
        return await self._arun(self._send_plan(post))

    def find_sent(self, post: ClaimedPost) -> str | None:
        """Find the post in the channel (or thread) by its metadata, from just before `sent_at`.

        Returns "channel:ts" or None when every page was read and it is not there. Raises
        CannotCheck for an ephemeral post or a workspace without a usable installation, and
        CheckLater when any page cannot be read.
        """
        return self._run(self._find_plan(post))

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        """`find_sent` through AsyncWebClient, on the running loop."""
        return await self._arun(self._find_plan(post))

    def _run(self, plan: Plan[T]) -> T:
        """Carry `plan` out on this thread: slack-sdk's WebClient, installations in place."""
        driven: Driven[_Request | Offload, T] = Driven(plan)
        while (step := driven.next_step()) is not None:
            try:
                driven.answer = self._request(step) if isinstance(step, _Request) else step.call()
            except Exception as error:  # noqa: BLE001 - thrown into the plan, which decides
                driven.failure = error
        return driven.result

    async def _arun(self, plan: Plan[T]) -> T:
        """Carry `plan` out on the running loop: AsyncWebClient, and installations' database
        work and token refresh off the loop (`blocking`)."""
        driven: Driven[_Request | Offload, T] = Driven(plan)
        while (step := driven.next_step()) is not None:
            try:
                if isinstance(step, _Request):
                    driven.answer = await self._arequest(step)
                else:
                    driven.answer = await blocking(step.call)
            except Exception as error:  # noqa: BLE001 - thrown into the plan, which decides
                driven.failure = error
        return driven.result

    # -- what a post does, as a plan of calls (the same for both doors)

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        try:
            grant = yield from self._grant(post)
            if post.kind == Kind.DELETE:
                return (yield from self._delete(post, grant))
            if post.kind == Kind.REACTION:
                return (yield from self._add_reaction(post, grant))
            if post.kind == Kind.EPHEMERAL:
                return (yield from self._post_ephemeral(post, grant))
            if post.kind == Kind.STATUS and post.message_ref:
                return (yield from self._update(post, grant))
            if post.kind in (Kind.MESSAGE, Kind.STATUS):
                return (yield from self._post_message(post, grant))
        except _Failed as failed:
            return failed.outcome
        return Refused(f"Slack cannot send a post of kind {post.kind!r}")

    def _find_plan(self, post: ClaimedPost) -> Plan[str | None]:
        if post.kind == Kind.EPHEMERAL:
            raise CannotCheck("Slack keeps no copy of an ephemeral message to look up")
        if post.kind == Kind.REACTION:
            # reactions.add is idempotent (a repeat answers already_reacted, which counts as
            # delivered), so "send it again" is always right and no lookup is needed.
            return None
        if post.kind == Kind.STATUS and post.message_ref:
            return post.message_ref
        if post.kind == Kind.DELETE:
            # Sent again: a message deleted already answers message_not_found, which is done.
            return None
        args: dict[str, Any] = {
            "channel": post.container_id,
            "oldest": f"{(post.sent_at - LOOKUP_SKEW).timestamp():.6f}",
            "inclusive": True,
            # Slack returns a message's metadata only when asked for it.
            "include_all_metadata": True,
            "limit": LOOKUP_PAGE_SIZE if self.marketplace else NON_MARKETPLACE_PAGE_SIZE,
        }
        if not self.marketplace:
            # The post's own message is at most a send's timeout after its claim (and the skew
            # of Slack's clock): a window that one page of 15 covers unless the channel is busy.
            latest = post.sent_at + timedelta(seconds=self.timeout or DEFAULT_TIMEOUT) + LOOKUP_SKEW
            args["latest"] = f"{latest.timestamp():.6f}"
        claim = f"{post.post_id}@{post.sent_at.isoformat()}"
        if (cursor := self._lookup_cursors.get(claim)) is not None:
            args["cursor"] = cursor  # a non-Marketplace lookup goes on where the last one stopped
        if post.thread_id:
            # conversations.history lists parent messages only; replies are in the thread.
            method = "conversations.replies"
            args["ts"] = post.thread_id
        else:
            method = "conversations.history"
        try:
            grant = yield from self._grant(post)
            pages = LOOKUP_MAX_PAGES if self.marketplace else 1
            for _ in range(pages):
                response = yield from self._call(grant, method, args, create=False)
                for message in response.get("messages") or []:
                    if _is_post(message, post.post_id):
                        self._lookup_cursors.drop(claim)
                        return f"{post.container_id}:{message['ts']}"
                cursor = (response.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    self._lookup_cursors.drop(claim)
                    return None
                args["cursor"] = cursor
            if not self.marketplace:
                self._lookup_cursors.put(claim, args["cursor"])
                raise CheckLater(
                    f"lookup read a page of {method} (a non-Marketplace app may read one a minute); "
                    "the next lookup reads on"
                )
        except _Failed as failed:
            if failed.uninstalled:
                # The workspace's messages cannot be read any more: the post becomes uncertain.
                raise CannotCheck(f"lookup impossible: {failed.reason}") from None
            raise CheckLater(f"lookup failed: {failed.reason}") from None
        raise CheckLater(f"lookup gave up after {LOOKUP_MAX_PAGES} pages of {method}")

    def close(self) -> None:
        """Close the AsyncWebClient sessions of loops that are idle (an in-process delivery's);
        a running loop's is the sender's, closed by its `aclose`. slack-sdk's WebClient opens
        one connection per call: nothing to release for it."""
        with self._sessions_lock:
            idle = [(loop, s) for loop, s in self._sessions.items() if not loop.is_running()]
            for loop, _ in idle:
                del self._sessions[loop]
        for loop, (session, _) in idle:
            if not loop.is_closed():
                # RuntimeError: called from a thread whose own loop runs; the sockets then go
                # with the session.
                with contextlib.suppress(RuntimeError):
                    loop.run_until_complete(session.close())

    async def aclose(self) -> None:
        """Close this loop's aiohttp session; a later coroutine call opens another."""
        with self._sessions_lock:
            opened = self._sessions.pop(asyncio.get_running_loop(), None)
        if opened is not None:
            await opened[0].close()

    # -- the calls of each kind

    def _post_message(self, post: ClaimedPost, grant: Grant) -> Plan[Outcome]:
        body = _body(post, reserved=RESERVED_ARGS)
        args: dict[str, Any] = {
            "channel": post.container_id,
            **body,
            "metadata": {"event_type": EVENT_TYPE, "event_payload": {"post_id": post.post_id}},
        }
        if post.thread_id:
            args["thread_ts"] = post.thread_id
        try:
            response = yield from self._call(grant, "chat.postMessage", args, create=True)
        except _Failed as failed:
            if isinstance(failed.outcome, RateLimited) and failed.outcome.scope == Scope.CONTAINER:
                raise _Failed(self._widened(post, failed.outcome), failed.code) from None
            raise
        # Slack's channel, not ours: a user id as channel opens a DM whose id (D...) is the one
        # chat.update needs later.
        return Delivered(_ref(response.get("channel") or post.container_id, response.get("ts")))

    def _update(self, post: ClaimedPost, grant: Grant) -> Plan[Outcome]:
        channel, _, ts = (post.message_ref or "").partition(":")
        if not channel or not ts:
            return Refused(f"not a Slack message ref (channel:ts): {post.message_ref!r}")
        body = _body(post, reserved=RESERVED_ARGS)
        args = {"channel": channel, "ts": ts, **{k: v for k, v in body.items() if k in UPDATE_ARGS}}
        yield from self._call(grant, "chat.update", args, create=False)
        return Delivered(post.message_ref)

    def _delete(self, post: ClaimedPost, grant: Grant) -> Plan[Outcome]:
        """chat.delete of the retracted post's message (`message_ref`, "channel:ts")."""
        channel, _, ts = (post.message_ref or "").partition(":")
        if not channel or not ts:
            return Refused(f"not a Slack message ref (channel:ts): {post.message_ref!r}")
        try:
            yield from self._call(grant, "chat.delete", {"channel": channel, "ts": ts}, create=False)
        except _Failed as failed:
            # Deleted already (an earlier try whose reply was lost, a person): what was asked.
            if failed.code != "message_not_found":
                raise
        return Delivered(post.message_ref)

    def _add_reaction(self, post: ClaimedPost, grant: Grant) -> Plan[Outcome]:
        body = _body(post, reserved=RESERVED_ARGS)
        name, timestamp = body.get("name"), body.get("timestamp")
        if not isinstance(name, str) or not name or not isinstance(timestamp, str) or not timestamp:
            raise _Failed(Refused("a reaction body needs 'name' and 'timestamp' strings"))
        args = {"channel": post.container_id, "name": name, "timestamp": timestamp}
        try:
            yield from self._call(grant, "reactions.add", args, create=False)
        except _Failed as failed:
            if failed.code != "already_reacted":
                raise
        # A reaction has no id of its own.
        return Delivered(None)

    def _post_ephemeral(self, post: ClaimedPost, grant: Grant) -> Plan[Outcome]:
        body = _body(post, reserved=RESERVED_ARGS - {"metadata"})
        if not isinstance(body.get("user"), str) or not body["user"]:
            raise _Failed(Refused("an ephemeral body needs a 'user'"))
        args: dict[str, Any] = {"channel": post.container_id, **body}
        if post.thread_id:
            args["thread_ts"] = post.thread_id
        yield from self._call(grant, "chat.postEphemeral", args, create=True)
        # Its message_ts can be neither edited nor looked up, so it is no message ref.
        return Delivered(None)

    def _widened(self, post: ClaimedPost, limited: RateLimited) -> RateLimited:
        """A chat.postMessage 429: the workspace's, once its channels' 429s spread (see
        WORKSPACE_429_CHANNELS); until then the channel's."""
        channels = self.recent_429s.note(post.workspace_id, post.container_id)
        if channels < WORKSPACE_429_CHANNELS:
            return limited
        note = f"; 429s in {channels} channels of workspace {post.workspace_id} within {self.recent_429s.window:g}s"
        return replace(limited, scope=Scope.WORKSPACE, reason=limited.reason + note)

    # -- credentials

    def _grant(self, post: ClaimedPost) -> Plan[Grant]:
        """The client and token of the post's calls; raise _Failed when there are none to use
        (no installation, revoked: refused with no request made; a failed refresh: held)."""
        if self.tokens is None:
            return Grant(post.workspace_id, self.client, self._token, None, (self._token,))
        from django_connector_outbox.connectors.slack_installations import Held
        from django_connector_outbox.installations.store import NotInstalled

        try:
            grant = yield from cached_or(
                self.tokens.cached(post.workspace_id), self.tokens.grant, post.workspace_id
            )
        except NotInstalled as missing:
            raise _Failed(Refused(str(missing)), uninstalled=True) from None
        except Held as held:
            raise _Failed(held.outcome) from None
        return grant

    def _renew(self, grant: Grant, method: str, failed: _Failed) -> Plan[None]:
        """After `failed.code` (RENEWING_CODES) on an installation's token: refresh it
        (token_expired) or revoke the installation; return when `grant` holds a token saved
        since, to call with once more; else raise the post's outcome."""
        from django_connector_outbox.connectors.slack_installations import Held
        from django_connector_outbox.installations.store import NotInstalled

        assert self.tokens is not None and failed.code is not None
        if grant.renewed and failed.code == "token_expired":
            # Refreshed (or re-read) within this send already: no second refresh.
            raise _Failed(RetryLater(f"{failed.reason} just after its token was renewed"), failed.code)
        if failed.code == "token_expired":
            renewal = functools.partial(self.tokens.expired, grant)
        else:
            renewal = functools.partial(self.tokens.revoked, grant, failed.reason)
        try:
            fresh: Grant = yield Offload(renewal)
        except NotInstalled as missing:
            raise _Failed(Refused(str(missing)), failed.code, uninstalled=True) from None
        except Held as held:
            raise _Failed(held.outcome, failed.code) from None
        if grant.renewed:  # installed again since: its token is for the next attempt
            raise _Failed(
                RetryLater(f"{failed.reason}; the workspace was installed again since"), failed.code
            )
        grant.use(fresh)

    # -- one call, and what its failure means

    def _call(self, grant: Grant, method: str, args: Mapping[str, Any], *, create: bool) -> Plan[Any]:
        """Make one call (once more after a token refresh or re-install: `_renew`); raise
        _Failed with its outcome. `create`: a repeat could post twice."""
        while True:
            try:
                return (yield _Request(grant, method, args, create))
            except _Failed as failed:
                # token_expired and revocations are answered before anything is done: calling
                # again with another token cannot post twice.
                if grant.credentials is None or failed.code not in RENEWING_CODES:
                    raise
                yield from self._renew(grant, method, failed)

    def _request(self, step: _Request) -> SlackResponse:
        """`step` through slack-sdk's WebClient (urllib); raise _Failed with its outcome."""
        _check_sendable(step)
        call: Callable[..., SlackResponse] = getattr(step.grant.client, _attribute(step.method))
        try:
            return call(**step.args)
        except SlackApiError as error:
            raise _api_failure(step, error) from None
        except URLError as error:
            # urllib wraps only the errors of connecting and sending (refused, DNS, TLS): the
            # request never reached Slack whole, so sending again is safe.
            raise _not_sent(step, error.reason) from None
        except (OSError, http.client.HTTPException) as error:
            # A read timeout, RemoteDisconnected, a reset after sending: the reply was lost.
            raise _reply_lost(step, error) from None

    async def _arequest(self, step: _Request) -> AsyncSlackResponse:
        """`step` through this loop's AsyncWebClient (aiohttp), with the grant's token as the
        call's; raise _Failed with its outcome."""
        _check_sendable(step)
        call: Callable[..., Awaitable[AsyncSlackResponse]] = getattr(self._aclient(), _attribute(step.method))
        try:
            # slack-sdk takes a `token` argument as the call's credential (RESERVED_ARGS keeps
            # it out of bodies): one client and one connection pool serve every workspace.
            return await call(**step.args, token=step.grant.token or None)
        except SlackApiError as error:
            raise _api_failure(step, error) from None
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, aiohttp.InvalidURL) as error:
            # Connecting failed (refused, DNS, TLS, the connect timeout): nothing was sent.
            raise _not_sent(step, error) from None
        except (aiohttp.ClientError, TimeoutError) as error:
            # Once connected, the request may have reached Slack: a read timeout, a server
            # that closed or reset the connection, a reply cut short.
            raise _reply_lost(step, error) from None

    def _aclient(self) -> AsyncWebClient:
        """This loop's AsyncWebClient and its aiohttp session (a session belongs to the loop
        that opened it: the sender has one loop, in-process deliveries one per thread)."""
        loop = asyncio.get_running_loop()
        opened = self._sessions.get(loop)
        if opened is None:
            with self._sessions_lock:
                opened = self._sessions.get(loop)
                if opened is None:
                    session = aiohttp.ClientSession(
                        # Passed a session, AsyncWebClient leaves its timeout to the session's.
                        timeout=aiohttp.ClientTimeout(total=self.timeout),
                        # limit=0: the sender's --concurrency bounds the requests in flight;
                        # aiohttp's default 100 connections would queue the rest inside
                        # their timeout.
                        connector=aiohttp.TCPConnector(limit=0),
                    )
                    client = AsyncWebClient(
                        base_url=self._base_url if isinstance(self._base_url, str) else DEFAULT_BASE_URL,
                        session=session,
                        retry_handlers=[],  # as the WebClient's (`_client`): the outbox retries
                    )
                    opened = self._sessions[loop] = (session, client)
        return opened[1]

    def reply_thread(self, parent: Parent) -> str:
        """A reply's `thread_ts`: the parent's own thread when it is itself a reply (Slack
        threads are one level deep: a reply to a reply goes into the same thread), else the
        ts of the parent's "channel:ts" ref. No request."""
        if parent.thread_id:
            return parent.thread_id
        channel, _, ts = (parent.message_ref or "").rpartition(":")
        if not channel or not ts:
            raise ValueError(f"not a Slack message ref (channel:ts): {parent.message_ref!r}")
        return ts


def _attribute(method: str) -> str:
    """slack-sdk's method of a Web API method: chat.postMessage -> chat_postMessage."""
    return method.replace(".", "_")


def _check_sendable(step: _Request) -> None:
    if step.grant.token and not is_header_token(step.grant.token):
        # http.client would refuse it (or send a NUL), and slack-sdk logs its error, which
        # quotes the token: never hand it over. check() reports it as E101.
        raise _Failed(
            RetryLater(f"{step.method}: request not sent (the token cannot be sent in an HTTP header)")
        )


def _api_failure(step: _Request, error: SlackApiError) -> _Failed:
    """Slack (or a proxy in front of it) answered: what its answer means."""
    outcome = _outcome_of_api_error(step.method, error.response, create=step.create)
    return _Failed(outcome, error_code(error.response))


def _not_sent(step: _Request, error: BaseException | str) -> _Failed:
    """The request never reached Slack whole: sending again is safe."""
    return _Failed(
        RetryLater(f"{step.method}: request not sent ({scrub(text_of(error), step.grant.secrets)})")
    )


def _reply_lost(step: _Request, error: BaseException) -> _Failed:
    """The request was sent and no answer came: a create may have posted."""
    reason = f"{step.method}: reply lost ({scrub(text_of(error), step.grant.secrets)})"
    return _Failed(MaybeSent(reason) if step.create else RetryLater(reason))


def _outcome_of_api_error(
    method: str, response: SlackResponse | AsyncSlackResponse, *, create: bool
) -> Outcome:
    status = response.status_code
    code = error_code(response)
    if status == 429:
        retry_after = _retry_after(response.headers)
        shown = f"Retry-After {retry_after:g}" if retry_after is not None else "no Retry-After"
        return RateLimited(
            after=retry_after if retry_after is not None else RATE_LIMIT_FALLBACK,
            reason=f"slack error {code or 'ratelimited'} on {method} (HTTP 429, {shown})",
            scope=Scope.WORKSPACE if method in WORKSPACE_TIER_METHODS else Scope.CONTAINER,
        )
    if code is None:
        # Not Slack's JSON: a proxy's or load balancer's page. A 503 was turned away; any
        # other 5xx on a create may have been processed behind it.
        reason = f"{method}: HTTP {status} without a Slack answer"
        if create and status >= 500 and status != 503:
            return MaybeSent(reason)
        return RetryLater(reason)
    reason = f"slack error {code} on {method}"
    if code in RATE_LIMIT_CODES:
        wait = USAGE_LIMIT_WAIT if code == "message_limit_exceeded" else RATE_LIMIT_FALLBACK
        # `message_limit_exceeded`: "Members on this team are sending too many messages";
        # legacy `rate_limited`: "Application has posted too many messages". Both the team's.
        scope = Scope.CONTAINER if code == "ratelimited" else Scope.WORKSPACE
        return RateLimited(after=wait, reason=reason, scope=scope)
    if code in PERMANENT_CODES or (code.startswith("slack_connect_") and code.endswith("_blocked")):
        return Refused(reason)
    if code in AMBIGUOUS_CODES:
        return MaybeSent(reason) if create else RetryLater(reason)
    if code in SLOW_TRANSIENT_CODES:
        return RetryLater(reason, after=MIGRATION_WAIT)
    # TRANSIENT_CODES, and any code Slack adds later: retrying spends attempts and ends in
    # `failed` anyway, while refusing at once would lose posts to a passing error.
    return RetryLater(reason)


def _positive_seconds(value: Any) -> float | None:
    try:
        duration = seconds(value)
    except TypeError:
        return None
    return duration if math.isfinite(duration) and duration > 0 else None


def _retry_after(headers: Mapping[str, Any]) -> float | None:
    for name in ("Retry-After", "retry-after"):
        if name in headers:
            value = headers[name]
            try:
                after = float(value[0] if isinstance(value, list) else value)
            except (TypeError, ValueError):
                return None
            return after if after >= 0 else None
    return None


def _body(post: ClaimedPost, *, reserved: frozenset[str]) -> dict[str, Any]:
    taken = sorted(reserved & post.body.keys())
    if taken:
        raise _Failed(Refused(f"the body may not set {', '.join(taken)}: the outbox sets it"))
    return dict(post.body)


def _is_post(message: Any, post_id: str) -> bool:
    metadata = message.get("metadata") if isinstance(message, dict) else None
    if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
        return False
    payload = metadata.get("event_payload")
    return isinstance(payload, dict) and payload.get("post_id") == post_id and "ts" in message


def _ref(channel: str, ts: Any) -> str | None:
    return f"{channel}:{ts}" if isinstance(ts, str) and ts else None
