"""A fake Telegram Bot API on 127.0.0.1, faithful for the methods the Telegram connector uses.

Methods, at ``POST /bot<token>/<method>`` with a JSON body, answered the way the Bot API does
(core.telegram.org/bots/api): ``sendMessage`` (``message_thread_id`` of a forum topic,
``reply_parameters``), ``editMessageText`` (the bot's own messages; the same content is
"message is not modified"; a ``rich_message`` in place of ``text``, Bot API 10's long-form
content: exactly one of ``markdown``, ``html`` or ``blocks``, at most 32,768 characters or 500
blocks), ``setMessageReaction``, ``deleteMessage`` (``true``; a message
deleted is "message to delete not found" after; one sent 48 hours ago or more by the fake's
clock, or a forum topic's creation message, "message can't be deleted") and ``getMe``. A text with ``parse_mode:
"HTML"`` is parsed as the Bot API parses it (telegram_html.py: its tags and entities, 4,096
characters after parsing, inline keyboards), refused with its "can't parse entities" answers. Message ids count up from
1 in each chat. Answers are ``{"ok": true, "result"}`` or ``{"ok": false, "error_code",
"description", "parameters"}``: 400 "chat not found", "message thread not found", "message to
be replied not found", "message to edit not found", a group that became a supergroup
(``migrate_to_chat_id``), 403 "bot was blocked by the user", 401 for a wrong token, 404 for
an unknown method.

Rate limits (none unless given), as core.telegram.org/bots/faq states them, counted over
every accepted write: `chat_limit` per chat (a token bucket: Telegram allows short bursts),
`group_limit` per group, supergroup or channel (negative ids), `bot_limit` over all chats
(fixed one-second windows, the strictest reading of "30 messages per second"). A refused write
is a 429 ``"Too Many Requests: retry after N"`` with ``parameters.retry_after`` N, whole
seconds, and no hint of which limit tripped (Telegram gives none); `limited` counts them by
limit.

Scripting: the next calls of a method can fail (an error, a 429, a proxy's HTML page, a
dropped connection after the message was stored, a slow reply). From another process:
``python -m django_connector_outbox.fakes.telegram [--token T] [--channel CHAT] [--port N]`` prints
its base URL, then the settings to paste, and serves until SIGTERM (in a project's tests, the
``fake_telegram`` fixture of the package's pytest plugin is one); ``GET /_fake/state``, ``POST /_fake/script`` (``{"route": METHOD,
"action", "times"}``), ``POST /_fake/chats`` (``{"id", "forum"}``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Self
from urllib.parse import urlsplit

from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    Bucket,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    Window,
    add_chat_arguments,
    chat_channels,
    chat_limits,
    command_line,
    parse_json,
)
from django_connector_outbox.fakes.telegram_html import (
    TEXT_CHARS,
    EntitiesError,
    keyboard_problem,
    visible_text,
)

BOT: JSON = {"id": 7000000001, "is_bot": True, "first_name": "Outbox", "username": "outbox_bot"}
WRITES = frozenset({"sendMessage", "editMessageText", "setMessageReaction", "deleteMessage"})
#: "A message can only be deleted if it was sent less than 48 hours ago" (deleteMessage).
DELETE_WITHIN = 48 * 3600
NOT_MODIFIED = (
    "Bad Request: message is not modified: specified new message content and reply markup are "
    "exactly the same as a current content and reply markup of the message"
)


@dataclass
class Call:
    """One request the fake received (the token is never kept)."""

    method: str
    args: Any
    authorized: bool


@dataclass
class Action(CommonActions):
    """How to answer one scripted call: "pass", "error" (`status`, `description`,
    `migrate_to`), "ratelimit" (429, `retry_after`), "html" (a proxy's page with `status`),
    "drop", "drop_before", "reset", "delay" (`seconds`)."""

    kind: str
    status: int = 400
    description: str = ""
    retry_after: int = 1
    migrate_to: int | None = None
    seconds: float = 0.0


def error(status: int, description: str, *, migrate_to: int | None = None) -> Action:
    return Action("error", status=status, description=description, migrate_to=migrate_to)


def ratelimit(retry_after: int = 2) -> Action:
    return Action("ratelimit", status=429, retry_after=retry_after)


html = Action.html
drop = Action.drop
reset = Action.reset
delay = Action.delay


class TelegramError(Exception):
    def __init__(self, status: int, description: str, parameters: JSON | None = None) -> None:
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters


#: setMessageReaction: "bots can set up to one reaction per message" (as non-premium users).
BOT_REACTIONS = 1
#: editMessageText's `rich_message` (InputRichMessage, core.telegram.org/bots/api#editmessagetext):
#: "Set exactly one of markdown, html or blocks"; at most 32,768 characters and 500 blocks.
RICH_FORMS = ("markdown", "html", "blocks")
RICH_CHARS = 32_768
RICH_BLOCKS = 500


def _checked_rich(rich: Any) -> str:
    """An edit's `rich_message`, refused as the Bot API refuses it; what the message then reads
    (its markdown or HTML as given, or its blocks as JSON)."""
    given = [form for form in RICH_FORMS if isinstance(rich, dict) and rich.get(form) not in (None, "")]
    if len(given) != 1 or set(rich) - set(RICH_FORMS):
        raise TelegramError(
            400, "Bad Request: rich message must have exactly one of markdown, html or blocks"
        )
    content = rich[given[0]]
    if given[0] == "blocks":
        if not isinstance(content, list) or len(content) > RICH_BLOCKS:
            raise TelegramError(400, "Bad Request: too many rich message blocks")
        return json.dumps(content, sort_keys=True)
    if not isinstance(content, str) or len(content) > RICH_CHARS:
        raise TelegramError(400, "Bad Request: rich message is too long")
    return content


def _checked_text(args: JSON) -> str:
    """sendMessage's and editMessageText's `text`, `parse_mode` and `reply_markup`, refused as
    the Bot API refuses them; the text's limit counts it after entities parsing."""
    text = args.get("text")
    if not isinstance(text, str):
        raise TelegramError(400, "Bad Request: message text is empty")
    parse_mode = args.get("parse_mode")
    if parse_mode in (None, ""):
        shown = text
    elif parse_mode == "HTML":
        try:
            shown = visible_text(text)
        except EntitiesError as err:
            raise TelegramError(400, str(err)) from None
    elif parse_mode in ("Markdown", "MarkdownV2"):
        shown = text  # not parsed here: the connector sends HTML or plain text
    else:
        raise TelegramError(400, "Bad Request: unsupported parse_mode")
    if not shown.strip():
        raise TelegramError(400, "Bad Request: message text is empty")
    if len(shown) > TEXT_CHARS:
        raise TelegramError(400, "Bad Request: message is too long")
    problem = keyboard_problem(args.get("reply_markup"))
    if problem is not None:
        raise TelegramError(400, problem)
    return text


@dataclass
class Message:
    message_id: int
    chat_id: int
    text: str
    thread_id: int | None = None
    reply_to: int | None = None
    reply_markup: Any = None
    edited: bool = False
    reactions: list[JSON] = field(default_factory=list)
    date: int = 0

    def as_telegram(self, chat: Chat) -> JSON:
        data: JSON = {
            "message_id": self.message_id,
            "from": dict(BOT),
            "chat": {"id": chat.id, "type": chat.type},
            "date": self.date,
            "text": self.text,
        }
        if self.thread_id is not None:
            data["message_thread_id"] = self.thread_id
            data["is_topic_message"] = True
        if self.reply_to is not None:
            data["reply_to_message"] = {
                "message_id": self.reply_to,
                "chat": {"id": chat.id, "type": chat.type},
            }
        if self.reply_markup is not None:
            data["reply_markup"] = self.reply_markup
        return data


@dataclass
class Chat:
    id: int
    forum: bool = False
    blocked: bool = False
    migrate_to: int | None = None
    topics: set[int] = field(default_factory=set)
    messages: dict[int, Message] = field(default_factory=dict)
    next_id: int = 1

    @property
    def type(self) -> str:
        return "private" if self.id > 0 else "supergroup" if str(self.id).startswith("-100") else "group"


class FakeTelegram(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-telegram"
    action_class = Action
    route_field = "method"
    platform = "Telegram"
    source_name = "telegram"
    backend = "django_connector_outbox.connectors.telegram.TelegramConnector"
    routes = frozenset({"sendMessage", "editMessageText", "setMessageReaction", "deleteMessage", "getMe"})

    def __init__(
        self,
        token: str = "123456789:fake-telegram-bot-token",
        *,
        chats: tuple[str, ...] = ("1001",),
        chat_limit: Limit | None = None,
        group_limit: Limit | None = None,
        bot_limit: Limit | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.token = token
        self.chat_limit, self.group_limit = chat_limit, group_limit
        self._buckets: dict[tuple[str, int], Bucket] = {}
        self._bot_window = Window(bot_limit) if bot_limit else None
        self.limited: Counter[str] = Counter()  # "chat", "group", "bot" -> its 429s
        self.chats: dict[int, Chat] = {}
        for chat in chats:
            self.add_chat(int(chat))

    @property
    def base_url(self) -> str:
        """What to give the connector as `base_url`."""
        return self.origin

    # -- the settings of a source it delivers, and python -m

    def connector_options(self) -> JSON:
        return {"token": self.token, "base_url": self.base_url}

    def guide(self, source: str) -> str:
        with self._lock:
            chats = ", ".join(str(c) for c in self.chats) or "none"
        return f"""\
Queue posts with a container_id of its chats: {chats} (more: POST {self.origin}/_fake/chats
{{"id": -1001234567890, "forum": true}}; negative ids are groups and channels).
thread_id is a forum topic's message_thread_id; workspace_id is not used by Telegram."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_chat_arguments(
            parser, token="123456789:fake-telegram-bot-token", channel="1001", limits="chat, group or bot"
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        limits = chat_limits(options)
        return cls(
            options.token,
            chats=chat_channels(options),
            chat_limit=limits.get("chat"),
            group_limit=limits.get("group"),
            bot_limit=limits.get("bot"),
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_chat(
        self, chat_id: int, *, forum: bool = False, blocked: bool = False, migrate_to: int | None = None
    ) -> None:
        with self._lock:
            self.chats[chat_id] = Chat(chat_id, forum=forum, blocked=blocked, migrate_to=migrate_to)

    def add_topic(self, chat_id: int) -> int:
        """A forum topic of a forum chat; returns its message_thread_id (its creation message)."""
        with self._lock:
            chat = self.chats[chat_id]
            topic = self._new_message(chat, "topic created").message_id
            chat.topics.add(topic)
            return topic

    def add_message(self, chat_id: int, text: str = "a person's message") -> int:
        with self._lock:
            return self._new_message(self.chats[chat_id], text).message_id

    def messages(self, chat_id: int) -> list[Message]:
        with self._lock:
            return sorted(self.chats[chat_id].messages.values(), key=lambda m: m.message_id)

    def state(self) -> JSON:
        with self._lock:
            return {
                "calls": [asdict(c) for c in self.calls],
                "chats": {
                    str(cid): [{**m.as_telegram(c), "edited": m.edited} for m in self.messages(cid)]
                    for cid, c in self.chats.items()
                },
                "limited": dict(self.limited),
                **self.records(),
            }

    # -- limits

    def limit(self, chat_id: Any) -> JSON | None:
        """The body of a 429 when a limit refuses this write to `chat_id`, else None (and the
        write counts against the limits)."""
        with self._lock:
            now = self.clock()
            chat = _as_int(chat_id)
            buckets = []
            if self.chat_limit is not None and chat is not None:
                buckets.append(("chat", self._buckets.setdefault(("chat", chat), Bucket(self.chat_limit))))
            if self.group_limit is not None and chat is not None and chat < 0:
                buckets.append(("group", self._buckets.setdefault(("group", chat), Bucket(self.group_limit))))
            waits = [(name, bucket.wait(now)) for name, bucket in buckets]
            if self._bot_window is not None:
                waits.append(("bot", self._bot_window.wait(now)))
            name, wait = max(waits, key=lambda w: w[1], default=("", 0.0))
            if wait > 0:
                self.limited[name] += 1
                retry_after = max(1, math.ceil(wait))
                return _refusal(
                    429, f"Too Many Requests: retry after {retry_after}", {"retry_after": retry_after}
                )
            for _, bucket in buckets:
                bucket.take(now)
            if self._bot_window is not None:
                self._bot_window.take(now)
            return None

    # -- the API

    def handle(self, method: str, args: JSON) -> Answer:
        with self._lock:
            try:
                result = getattr(self, f"_{method}")(args)
            except TelegramError as err:
                return err.status, _refusal(err.status, err.description, err.parameters)
            if method in WRITES:
                self.accept(method, str(args.get("chat_id")))
            return 200, {"ok": True, "result": result}

    def _getMe(self, args: JSON) -> Any:  # noqa: N802 - the Bot API's method name
        return dict(BOT)

    def _sendMessage(self, args: JSON) -> Any:  # noqa: N802
        chat = self._chat(args.get("chat_id"))
        text = _checked_text(args)
        thread = args.get("message_thread_id")
        if thread is not None and (not isinstance(thread, int) or thread not in chat.topics):
            raise TelegramError(400, "Bad Request: message thread not found")
        reply = args.get("reply_parameters")
        reply_to = None
        if reply is not None:
            reply_to = reply.get("message_id") if isinstance(reply, dict) else None
            if reply_to not in chat.messages:
                raise TelegramError(400, "Bad Request: message to be replied not found")
        message = self._new_message(chat, text, thread_id=thread, reply_to=reply_to)
        message.reply_markup = args.get("reply_markup")
        return message.as_telegram(chat)

    def _editMessageText(self, args: JSON) -> Any:  # noqa: N802
        chat = self._chat(args.get("chat_id"))
        message = chat.messages.get(args.get("message_id"))  # type: ignore[arg-type]
        if message is None:
            raise TelegramError(400, "Bad Request: message to edit not found")
        # Bot API 10: "text ... required if rich_message isn't specified".
        text = _checked_rich(args["rich_message"]) if "rich_message" in args else _checked_text(args)
        if text == message.text and args.get("reply_markup") == message.reply_markup:
            raise TelegramError(400, NOT_MODIFIED)
        message.text, message.reply_markup, message.edited = text, args.get("reply_markup"), True
        return message.as_telegram(chat)

    def _setMessageReaction(self, args: JSON) -> Any:  # noqa: N802
        chat = self._chat(args.get("chat_id"))
        message = chat.messages.get(args.get("message_id"))  # type: ignore[arg-type]
        if message is None:
            raise TelegramError(400, "Bad Request: message to react not found")
        reaction = args.get("reaction") or []
        if not isinstance(reaction, list) or not all(
            isinstance(r, dict) and r.get("type") == "emoji" and r.get("emoji") for r in reaction
        ):
            raise TelegramError(400, "Bad Request: REACTION_INVALID")
        if len(reaction) > BOT_REACTIONS:
            raise TelegramError(400, "Bad Request: REACTIONS_TOO_MANY")
        message.reactions = list(reaction)  # set whole, as the Bot API does
        return True

    def _deleteMessage(self, args: JSON) -> Any:  # noqa: N802
        chat = self._chat(args.get("chat_id"))
        message = chat.messages.get(args.get("message_id"))  # type: ignore[arg-type]
        if message is None:
            raise TelegramError(400, "Bad Request: message to delete not found")
        if self.clock() - message.date >= DELETE_WITHIN or message.message_id in chat.topics:
            # Too old, or a "service message about a ... forum topic creation".
            raise TelegramError(400, "Bad Request: message can't be deleted")
        del chat.messages[message.message_id]
        return True

    def _chat(self, chat_id: Any) -> Chat:
        chat = self.chats.get(_as_int(chat_id))  # type: ignore[arg-type]
        if chat is None:
            raise TelegramError(400, "Bad Request: chat not found")
        if chat.blocked:
            raise TelegramError(403, "Forbidden: bot was blocked by the user")
        if chat.migrate_to is not None:
            raise TelegramError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": chat.migrate_to},
            )
        return chat

    def _new_message(self, chat: Chat, text: str, **fields: Any) -> Message:
        message = Message(chat.next_id, chat.id, text, date=int(self.clock()), **fields)
        chat.messages[message.message_id] = message
        chat.next_id += 1
        return message


def _as_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _refusal(status: int, description: str, parameters: JSON | None = None) -> JSON:
    body: JSON = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return body


class _Handler(FakeHandler):
    fake: FakeTelegram
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool is exercised
    normal_kind = "pass"

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._reply(404, _refusal(404, "Not Found"))

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/_fake/chats":
            spec = self._read_json()
            self.fake.add_chat(int(spec["id"]), forum=bool(spec.get("forum")))
            self._reply(200, {"ok": True})
            return
        raw = self._read_body()
        token, _, method = path.removeprefix("/bot").partition("/")
        args = parse_json(raw, empty={}, invalid=None)
        authorized = path.startswith("/bot") and token == self.fake.token
        self.fake.record(Call(method, args, authorized))
        if not authorized:
            self._reply(401, _refusal(401, "Unauthorized"))
            return
        if method not in self.fake.routes:
            self._reply(404, _refusal(404, "Not Found"))
            return
        if not isinstance(args, dict):
            self._reply(400, _refusal(400, "Bad Request: can't parse JSON object"))
            return
        if method in WRITES:
            refused = self.fake.limit(args.get("chat_id"))
            if refused is not None:
                self._reply(429, refused)
                return
        self._answer(self.fake._next_action(method), lambda: self.fake.handle(method, args))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            parameters = {"migrate_to_chat_id": action.migrate_to} if action.migrate_to is not None else None
            self._reply(action.status, _refusal(action.status, action.description, parameters))
        elif action.kind == "ratelimit":
            description = f"Too Many Requests: retry after {action.retry_after}"
            self._reply(429, _refusal(429, description, {"retry_after": action.retry_after}))
        else:
            super()._answer_own(action, work)


FakeTelegram.handler_class = _Handler
running = FakeTelegram.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeTelegram, argv)


if __name__ == "__main__":
    main()
