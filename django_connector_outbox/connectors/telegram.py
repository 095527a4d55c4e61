"""Telegram, through the Bot API (https://core.telegram.org/bots/api), with httpx.

Place: ``container_id`` is the chat id (a number, or ``@channelusername``), ``thread_id`` a
forum topic (``message_thread_id``; "" for none), ``message_ref`` ``chat_id:message_id``
(the chat's numeric id as Telegram answers it). ``workspace_id`` is not used by Telegram: give
any non-empty name (the bot's, say).

Calls: a message is ``sendMessage``; a status is ``sendMessage`` once, then
``editMessageText``; a reaction is ``setMessageReaction``; a delete (a retract) is
``deleteMessage`` of the ``message_ref``, done also when Telegram answers "message to delete not
found" (deleted already). A reply queued with ``thread_of`` goes to the parent's topic and
replies to the parent's message (``reply_parameters``): Telegram replies by message id, not by
thread. Its ``thread_id`` (`Connector.reply_thread`'s default) is the parent's topic or,
outside topics, the ``message_ref`` of the message its reply chain starts from: a reply's
``thread_id`` with a colon is that chain, not a topic, and is not sent.

No lookup: the Bot API has no method that reads a chat's history (a bot gets only the updates
sent to it, never its own messages), and ``sendMessage`` keeps no idempotency key. So
`find_sent` raises `CannotCheck` for messages and statuses, and a create whose reply was lost
ends ``uncertain`` rather than maybe twice. A reaction is looked up as "not there":
``setMessageReaction`` sets the bot's reactions whole, so sending it again is harmless; so is a
delete, which sent again finds the message gone.

Both forms, one plan (connectors/http.py): run_outbox awaits `asend` on the loop's async
client; `send` carries out the same requests and mapping through the blocking client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox.connectors import telegram_render
from django_connector_outbox.connectors.base import (
    CannotCheck,
    Delivered,
    Hold,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.http import (
    DEFAULT_TIMEOUT,
    HttpConnector,
    LostReply,
    NotSent,
    Plan,
    TransportError,
    http,
    json_or_none,
    parse_retry_after,
)
from django_connector_outbox.connectors.spread import Recent429s
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Scope

DEFAULT_BASE_URL = "https://api.telegram.org"
# "123456789:AAH..." as @BotFather gives it; it goes in the URL path ("/bot<token>/METHOD").
TOKEN_FORMAT = re.compile(r"^\d+:[A-Za-z0-9_-]+$")
#: The place comes from the post: a body that sets it is refused rather than overridden.
PLACE_ARGS = frozenset({"chat_id", "message_thread_id"})
#: editMessageText's arguments besides the place (https://core.telegram.org/bots/api#editmessagetext),
#: Bot API 10's `rich_message` (long-form content, in place of `text`) among them; the rest of a
#: sendMessage body (disable_notification, protect_content ...) cannot be edited.
EDIT_ARGS = frozenset(
    {
        "text",
        "rich_message",
        "parse_mode",
        "entities",
        "link_preview_options",
        "reply_markup",
        "business_connection_id",
    }
)
#: "your bot will not be able to send more than 20 messages per minute to the same group"
#: (core.telegram.org/bots/faq): after each write to a group, supergroup or channel (a
#: negative chat id, or @channelusername) its chat waits 3 s, on top of the chat's pace of one a
#: second, so that no minute holds more than 20 writes.
GROUP_INTERVAL = 3.0
#: Telegram's 429 does not say which limit tripped (the chat's, the group's or the bot's 30 a
#: second). One holds its chat; 429s from this many chats within the window hold the source.
SOURCE_429_CHATS = 2
SOURCE_429_WINDOW = 5.0  # seconds
NOT_MODIFIED = "message is not modified"
#: deleteMessage's refusals: the message is gone already (done), or it may not be deleted.
DELETE_NOT_FOUND = "message to delete not found"
CANT_DELETE = "message can't be deleted"


class TelegramError:
    """A refusal: ``{"ok": false, "error_code", "description", "parameters"}`` (the Bot API's
    "Making requests"), or an answer that is not Telegram's JSON (a proxy's page)."""

    def __init__(self, response: httpx.Response) -> None:
        data = json_or_none(response)
        data = data if isinstance(data, dict) else {}
        code = data.get("error_code")
        self.status = response.status_code
        self.code = code if isinstance(code, int) and not isinstance(code, bool) else response.status_code
        self.description = str(data.get("description") or response.reason_phrase or "")[:300]
        parameters = data.get("parameters")
        parameters = parameters if isinstance(parameters, dict) else {}
        retry_after = parameters.get("retry_after")
        if isinstance(retry_after, (int, float)) and not isinstance(retry_after, bool) and retry_after >= 0:
            self.retry_after: float | None = float(retry_after)
        else:
            self.retry_after = parse_retry_after(response.headers.get("Retry-After"))
        migrate_to = parameters.get("migrate_to_chat_id")
        self.migrate_to = (
            str(migrate_to) if isinstance(migrate_to, int) and not isinstance(migrate_to, bool) else None
        )
        self.json = bool(data)

    @property
    def reason(self) -> str:
        if not self.json:
            return f"telegram HTTP {self.status} {self.description}".strip()
        return f"telegram {self.code} {self.description}".strip()


class TelegramConnector(HttpConnector):
    """Messages, statuses, reactions and deletes through a Telegram bot token."""

    kinds = frozenset({Kind.MESSAGE, Kind.STATUS, Kind.REACTION, Kind.DELETE})
    lookup_requests = 0  # find_sent never makes a request
    #: "avoid sending more than one message per second" in a chat, "not more than 30 messages
    #: per second or so" in all (core.telegram.org/bots/faq). One a second per chat, with no
    #: burst of ours (Telegram allows "short bursts", which absorb the claim-to-request jitter);
    #: a group waits GROUP_INTERVAL more after each write (`Delivered.hold`). The source: 3 at
    #: once, then one each 36 ms (27.8 a second), so that no second holds more than 30 however
    #: Telegram counts them (bench/rate_limits.py measures it against the fake).
    pace = {Scope.CONTAINER: (1, 1.0), Scope.SOURCE: (3, 0.108)}

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return telegram_render.problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return telegram_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        token: Any = None,
        base_url: Any = DEFAULT_BASE_URL,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source, timeout=timeout)
        # A token read from a secrets file ends with a newline; Telegram's never has whitespace.
        self._token = token.strip() if isinstance(token, str) else token
        self._base_url_option = base_url
        self.base_url = str(base_url).rstrip("/")
        self._limits = Recent429s(SOURCE_429_WINDOW)

    def __repr__(self) -> str:  # never show the token
        return f"<TelegramConnector source={self.source!r}>"

    def secrets(self) -> list[str]:
        return [self._token] if isinstance(self._token, str) else []

    # -- requests ---------------------------------------------------------------------

    def _call(self, method: str, args: dict[str, Any]) -> Plan[httpx.Response]:
        # The token is part of the path: https://api.telegram.org/bot<token>/METHOD_NAME.
        return (yield from http("POST", f"{self.base_url}/bot{self._token}/{method}", json=args))

    # -- the two forms, one plan (connectors/http.py) ---------------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        return await self._arun(self._send_plan(post))

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        taken = sorted(PLACE_ARGS & post.body.keys())
        if taken:
            return Refused(f"telegram body may not set {', '.join(taken)}: the outbox sets it from the post")
        if post.kind == Kind.REACTION:
            return (yield from self._react(post))
        if post.kind == Kind.DELETE:
            return (yield from self._delete(post))
        if post.kind == Kind.STATUS and post.message_ref:
            return (yield from self._edit(post, post.message_ref))
        if post.kind in (Kind.MESSAGE, Kind.STATUS):
            return (yield from self._create(post))
        return Refused(f"telegram cannot send a {post.kind!r} post")

    def _create(self, post: ClaimedPost) -> Plan[Outcome]:
        args: dict[str, Any] = {"chat_id": _chat_arg(post.container_id), **post.body}
        if post.thread_id and not (post.parent is not None and ":" in post.thread_id):
            args["message_thread_id"] = _int_arg(post.thread_id)
        if post.parent is not None:
            if "reply_parameters" in post.body:
                return Refused(
                    "telegram body may not set reply_parameters in a reply (thread_of): the outbox sets it"
                )
            if not post.parent.message_ref:
                return Refused(f"telegram reply: the parent {post.parent.post_id!r} has no message")
            # Without allow_sending_without_reply, a deleted parent refuses the reply (400)
            # instead of posting it outside its thread.
            args["reply_parameters"] = {"message_id": _int_arg(_message_id(post.parent.message_ref))}
        try:
            response = yield from self._call("sendMessage", args)
        except NotSent as exc:
            return RetryLater(str(exc))
        except LostReply as exc:
            return MaybeSent(str(exc))
        ok, message = _answer(response)
        if not ok:
            return self._map_error(post, response, create=True)
        chat = message.get("chat") if isinstance(message, dict) else None
        message_id = message.get("message_id") if isinstance(message, dict) else None
        if not isinstance(chat, dict) or "id" not in chat or not isinstance(message_id, int):
            return MaybeSent("telegram answered ok without a message id")
        return self._delivered(post.container_id, f"{chat['id']}:{message_id}")

    def _edit(self, post: ClaimedPost, ref: str) -> Plan[Outcome]:
        chat, _, message_id = ref.rpartition(":")
        args = {
            "chat_id": _chat_arg(chat),
            "message_id": _int_arg(message_id),
            **{k: v for k, v in post.body.items() if k in EDIT_ARGS},
        }
        try:
            response = yield from self._call("editMessageText", args)
        except TransportError as exc:
            # An edit sets state: sending it again is harmless, so a lost reply is a retry.
            return RetryLater(str(exc))
        if _answer(response)[0]:
            return self._delivered(post.container_id, ref)
        error = TelegramError(response)
        if error.code == 400 and NOT_MODIFIED in error.description.lower():
            # The message already reads so: an earlier try of this edit got through.
            return self._delivered(post.container_id, ref)
        return self._map_error(post, response, create=False)

    def _delete(self, post: ClaimedPost) -> Plan[Outcome]:
        if not post.message_ref:
            return Refused("telegram delete needs the message_ref of the message to delete")
        chat, _, message_id = post.message_ref.rpartition(":")
        try:
            response = yield from self._call(
                "deleteMessage", {"chat_id": _chat_arg(chat), "message_id": _int_arg(message_id)}
            )
        except TransportError as exc:
            # Deleting twice is harmless: the second answers "message to delete not found".
            return RetryLater(str(exc))
        error = None if _answer(response)[0] else TelegramError(response)
        if error is None or (error.code == 400 and DELETE_NOT_FOUND in error.description.lower()):
            return self._delivered(post.container_id, post.message_ref)
        if error.code == 400 and CANT_DELETE in error.description.lower():
            # "A message can only be deleted if it was sent less than 48 hours ago", and in a
            # group or channel a bot deletes another's message only as an administrator.
            return Refused(
                f"{self.scrub(error.reason)} (Telegram lets a bot delete a message only within 48 hours "
                "of its sending; anyone else's only as an administrator with can_delete_messages)"
            )
        return self._map_error(post, response, create=False)

    def _react(self, post: ClaimedPost) -> Plan[Outcome]:
        message_id, reaction = post.body.get("message_id"), post.body.get("reaction")
        if isinstance(reaction, str) and reaction:  # one emoji, as a shorthand
            reaction = [{"type": "emoji", "emoji": reaction}]
        if (
            not isinstance(message_id, (int, str))
            or isinstance(message_id, bool)
            or not isinstance(reaction, list)
        ):
            return Refused("telegram reaction body needs 'message_id' and 'reaction' (a list, or one emoji)")
        args = {**post.body, "chat_id": _chat_arg(post.container_id), "message_id": _int_arg(str(message_id))}
        args["reaction"] = reaction
        try:
            response = yield from self._call("setMessageReaction", args)
        except TransportError as exc:
            # setMessageReaction sets the bot's reactions whole: sending it again is harmless.
            return RetryLater(str(exc))
        if _answer(response)[0]:
            return self._delivered(post.container_id, None)
        return self._map_error(post, response, create=False)

    def _delivered(self, chat: str, ref: str | None) -> Delivered:
        if _is_group(chat):
            return Delivered(ref, Hold(GROUP_INTERVAL, "telegram group: at most 20 messages a minute"))
        return Delivered(ref)

    def _map_error(self, post: ClaimedPost, response: httpx.Response, *, create: bool) -> Outcome:
        error = TelegramError(response)
        reason = self.scrub(error.reason)
        if error.migrate_to is not None:
            # "The group has been migrated to a supergroup with the specified identifier"
            # (ResponseParameters): every later post of this chat would be refused too.
            return Refused(
                f"{reason}: the group is now the supergroup {error.migrate_to}; queue its posts there"
            )
        if error.code == 429 or error.status == 429:
            after = error.retry_after if error.retry_after is not None else 1.0
            chats = self._limits.note("", post.container_id)  # the bot's limit: one place
            if chats >= SOURCE_429_CHATS:
                return RateLimited(
                    after, f"{reason} (429s from {chats} chats: the bot's limit)", Scope.SOURCE
                )
            return RateLimited(after, reason)
        if error.status >= 500 or error.code >= 500:
            if create:
                # The request reached Telegram, which may have posted it: with no lookup, a
                # second send could post it twice.
                return MaybeSent(reason)
            return RetryLater(reason, error.retry_after)
        # 400 (chat not found, message to edit not found, can't parse entities ...), 401 (bad
        # token), 403 (bot blocked or kicked), 404: the same request would get the same answer.
        return Refused(reason)

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return self.find_sent(post)  # no request: nothing to await

    def find_sent(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.REACTION:
            return None  # setMessageReaction is idempotent: "not there" sends it again
        if post.kind == Kind.DELETE:
            return None  # a delete is sent again: a message deleted already is "not found", done
        raise CannotCheck(
            "the Telegram Bot API cannot read a chat's history: whether the message was posted cannot be checked"
        )

    # -- configuration ----------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E251 token, E252 base_url, E253 timeout.

        An unknown option name is a TypeError when the connector is built (E005).
        """
        errors: list[checks.CheckMessage] = []
        if not isinstance(self._token, str) or not self._token:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: Telegram needs a bot token in OPTIONS['token']."
                    )
                    % {"source": self.source},
                    hint=gettext("@BotFather gives it (/newbot or /token); read it from the environment."),
                    id="connector_outbox.E251",
                )
            )
        elif not TOKEN_FORMAT.match(self._token):
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['token'] is not a Telegram bot token "
                        "(digits, ':', then letters, digits, '_' or '-'), without the 'bot' prefix of the URL."
                    )
                    % {"source": self.source},
                    id="connector_outbox.E251",
                )
            )
        errors += self.check_http_url("base_url", self._base_url_option, "connector_outbox.E252")
        errors += self.check_timeout("connector_outbox.E253")
        return errors


def _answer(response: httpx.Response) -> tuple[bool, Any]:
    """Whether Telegram took the request (``{"ok": true}``), and its ``result``."""
    data = json_or_none(response) if response.status_code == 200 else None
    if isinstance(data, dict) and data.get("ok") is True:
        return True, data.get("result")
    return False, None


def _is_group(chat: str) -> bool:
    """Groups, supergroups and channels have negative ids; a channel may be named by @username."""
    return chat.startswith(("-", "@"))


def _int_arg(value: str) -> int | str:
    """Ids are Integers in the Bot API; a string that is not one is sent as is (and refused)."""
    try:
        return int(value)
    except ValueError:
        return value


def _chat_arg(chat: str) -> int | str:
    """``chat_id`` is "Integer or String": a number, or @channelusername."""
    return chat if chat.startswith("@") else _int_arg(chat)


def _message_id(ref: str) -> str:
    return ref.rpartition(":")[2]
