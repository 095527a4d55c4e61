"""The fakes refuse what their platforms refuse, and answer as the platforms answer.

Each test sends one request over HTTP, as a connector would, and checks the fake's answer: its
status and its body in the platform's own shape (Slack's invalid_blocks with its json-pointer
messages, Discord's 50035 errors tree, the Bot Connector's ErrorResponse, the Bot API's
description, Mattermost's error id). Limits are those of the fakes' modules, which cite them.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.fakes import slack as fs
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.fakes import telegram as ftg
from django_connector_outbox.fakes.adaptive_card import CONTENT_TYPE, card_errors
from django_connector_outbox.fakes.block_kit import block_errors
from django_connector_outbox.fakes.telegram_html import EntitiesError, visible_text


def send(url: str, body: Any, **headers: str) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"null")


# -- Slack ----------------------------------------------------------------------------------


@pytest.fixture
def slack() -> Iterator[fs.FakeSlack]:
    with fs.running() as fake:
        yield fake


def post_message(fake: fs.FakeSlack, method: str = "chat.postMessage", **args: Any) -> tuple[int, Any]:
    return send(
        f"{fake.base_url}{method}", {"channel": "C0000000001", **args}, Authorization=f"Bearer {fake.token}"
    )


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def test_slack_refuses_a_section_over_3000_characters_as_slack_does(slack):
    status, answer = post_message(slack, text="x", blocks=[section("x" * 3001)])

    assert status == 200
    assert answer == {
        "ok": False,
        "error": "invalid_blocks",
        "errors": ["must be less than 3001 characters [json-pointer:/blocks/0/text/text]"],
        "response_metadata": {
            "messages": ["[ERROR] must be less than 3001 characters [json-pointer:/blocks/0/text/text]"]
        },
    }
    assert slack.messages("C0000000001") == []


def test_slack_takes_a_section_of_exactly_3000_characters(slack):
    status, answer = post_message(slack, text="x", blocks=[section("x" * 3000)])

    assert (status, answer["ok"]) == (200, True)


@pytest.mark.parametrize(
    ("blocks", "error"),
    [
        ([section("x")] * 51, "no more than 50 items allowed [json-pointer:/blocks]"),
        ([{"type": "paragraph"}], "failed to match all allowed schemas [json-pointer:/blocks/0]"),
        (
            [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}],
            "must be a valid enum value [json-pointer:/blocks/0/text/type]",
        ),
        (
            [{"type": "header", "text": {"type": "plain_text", "text": "x" * 151}}],
            "must be less than 151 characters [json-pointer:/blocks/0/text/text]",
        ),
        (
            [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f"}] * 11}],
            "no more than 10 items allowed [json-pointer:/blocks/0/fields]",
        ),
        (
            [{"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * 2001}]}],
            "must be less than 2001 characters [json-pointer:/blocks/0/fields/0/text]",
        ),
        (
            [
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "text": {"type": "plain_text", "text": "b" * 76},
                            "url": "https://x.io",
                        }
                    ],
                }
            ],
            "must be less than 76 characters [json-pointer:/blocks/0/elements/0/text/text]",
        ),
        (
            [
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "text": {"type": "plain_text", "text": "b"},
                            "url": "https://x.io/" + "u" * 2988,
                        }
                    ],
                }
            ],
            "must be less than 3001 characters [json-pointer:/blocks/0/elements/0/url]",
        ),
        (
            [{"type": "context", "elements": [{"type": "mrkdwn", "text": "c"}] * 11}],
            "no more than 10 items allowed [json-pointer:/blocks/0/elements]",
        ),
        (
            [{"type": "image", "image_url": "https://x.io/i.png"}],
            "must be a string [json-pointer:/blocks/0/alt_text]",
        ),
        (
            [{"type": "section", "text": {"type": "mrkdwn", "text": "x", "emoji": True}}],
            "invalid additional property: emoji [json-pointer:/blocks/0/text]",
        ),
        (
            [{"type": "section", "text": {"type": "mrkdwn", "text": ""}}],
            "must be more than 0 characters [json-pointer:/blocks/0/text/text]",
        ),
    ],
)
def test_slack_refuses_what_block_kit_refuses(blocks, error):
    assert error in block_errors(blocks)


def test_slack_update_refuses_a_text_over_4000_characters(slack):
    _, posted = post_message(slack, text="v1")
    status, answer = post_message(slack, "chat.update", ts=posted["ts"], text="x" * 4001)

    assert (status, answer) == (200, {"ok": False, "error": "msg_too_long"})
    assert slack.message("C0000000001", posted["ts"]).text == "v1"


def test_slack_post_message_keeps_the_first_40000_characters_of_a_longer_text(slack):
    _, posted = post_message(slack, text="x" * 40001)

    assert slack.message("C0000000001", posted["ts"]).text == "x" * 40000


# -- Discord --------------------------------------------------------------------------------


@pytest.fixture
def discord() -> Iterator[fd.FakeDiscord]:
    with fd.running() as fake:
        yield fake


def create_message(fake: fd.FakeDiscord, body: dict[str, Any]) -> tuple[int, Any]:
    return send(
        f"{fake.base_url}/channels/111111111111111111/messages", body, Authorization=f"Bot {fake.token}"
    )


def test_discord_refuses_content_over_2000_with_its_invalid_form_body(discord):
    status, answer = create_message(discord, {"content": "x" * 2001})

    assert status == 400
    assert answer == {
        "code": 50035,
        "message": "Invalid Form Body",
        "errors": {
            "content": {
                "_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]
            }
        },
    }
    assert discord.messages("111111111111111111") == []


def test_discord_refuses_embeds_over_6000_characters_in_all(discord):
    embeds = [{"description": "x" * 4000}, {"description": "y" * 2001}]
    status, answer = create_message(discord, {"embeds": embeds})

    assert (status, answer["code"]) == (400, 50035)
    assert answer["errors"]["embeds"]["_errors"] == [
        {"code": "MAX_EMBED_SIZE_EXCEEDED", "message": "Embed size exceeds maximum size of 6000"}
    ]


def test_discord_takes_embeds_of_exactly_6000_characters(discord):
    embeds = [{"description": "x" * 4000}, {"title": "t" * 256, "description": "y" * 1744}]

    assert create_message(discord, {"embeds": embeds})[0] == 200


@pytest.mark.parametrize(
    ("body", "path", "message"),
    [
        ({"embeds": [{"title": "t" * 257}]}, ("embeds", "0", "title"), "Must be 256 or fewer in length."),
        (
            {"embeds": [{"title": "t", "fields": [{"name": "n", "value": "v"}] * 26}]},
            ("embeds", "0", "fields"),
            "Must be 25 or fewer in length.",
        ),
        (
            {"embeds": [{"fields": [{"name": "n", "value": "v" * 1025}]}]},
            ("embeds", "0", "fields", "0", "value"),
            "Must be 1024 or fewer in length.",
        ),
        (
            {"embeds": [{"fields": [{"name": "n", "value": ""}]}]},
            ("embeds", "0", "fields", "0", "value"),
            "This field is required",
        ),
        (
            {
                "content": "x",
                "components": [{"type": 1, "components": [{"type": 2, "style": 5, "label": "b"}]}],
            },
            ("components", "0", "components", "0", "url"),
            "This field is required",
        ),
        (
            {
                "content": "x",
                "components": [
                    {
                        "type": 1,
                        "components": [{"type": 2, "style": 5, "label": "b" * 81, "url": "https://x.io"}],
                    }
                ],
            },
            ("components", "0", "components", "0", "label"),
            "Must be 80 or fewer in length.",
        ),
        (
            {
                "content": "x",
                "components": [
                    {
                        "type": 1,
                        "components": [{"type": 2, "style": 5, "label": "b", "url": "https://x.io"}] * 6,
                    }
                ],
            },
            ("components", "0", "components"),
            "Must be between 1 and 5 in length.",
        ),
        (
            {
                "content": "x",
                "components": [{"type": 1, "components": [{"type": 2, "style": 1, "label": "b"}]}],
            },
            ("components", "0", "components", "0", "custom_id"),
            "This field is required",
        ),
    ],
)
def test_discord_refuses_what_its_api_refuses_and_says_where(discord, body, path, message):
    status, answer = create_message(discord, body)

    assert (status, answer["code"], answer["message"]) == (400, 50035, "Invalid Form Body")
    node = answer["errors"]
    for key in path:
        node = node[key]
    assert node["_errors"][0]["message"] == message


def test_discord_takes_link_buttons_five_to_a_row(discord):
    row = {"type": 1, "components": [{"type": 2, "style": 5, "label": "b" * 80, "url": "https://x.io"}] * 5}

    assert create_message(discord, {"content": "x", "components": [row] * 5})[0] == 200


# -- Teams ------------------------------------------------------------------------------------


def card(*body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "AdaptiveCard", "version": "1.5", "body": list(body), **extra}


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ({"type": "HeroCard"}, "type: must be 'AdaptiveCard'"),
        ({"type": "AdaptiveCard", "body": []}, "version: None is not a version Teams renders (1.0-1.5)"),
        (card({"type": "Paragraph", "text": "x"}), "body[0].type: unknown element type 'Paragraph'"),
        (card({"type": "TextBlock"}), "body[0].text: required"),
        (
            card({"type": "TextBlock", "text": "x", "weight": "heavy"}),
            "body[0].weight: 'heavy' is not one of",
        ),
        (card({"type": "FactSet", "facts": [{"title": "t"}]}), "body[0].facts[0].value: required"),
        (card({"type": "Image"}), "body[0].url: required"),
        (card(actions=[{"type": "Action.OpenUrl", "title": "t"}]), "actions[0].url: required"),
        (
            card(actions=[{"type": "Action.Http", "url": "https://x.io"}]),
            "actions[0].type: unknown action type",
        ),
        (card({"type": "ActionSet"}), "body[0].actions: required array"),
    ],
)
def test_teams_refuses_a_card_the_adaptive_card_schema_refuses(content, error):
    assert any(e.startswith(error) for e in card_errors(content)), card_errors(content)


def test_teams_answers_a_bad_card_with_a_bad_argument_error_response():
    with ft.running() as fake:
        body = {
            "type": "message",
            "attachments": [{"contentType": CONTENT_TYPE, "content": card({"type": "Image"})}],
        }
        status, answer = fake.handle("create", ft.CHANNEL, "", body)

        assert status == 400
        assert answer == {
            "error": {
                "code": "BadArgument",
                "message": "Invalid attachment: attachments[0].content.body[0].url: required",
            }
        }
        assert fake.activities(ft.CHANNEL) == []


def test_teams_answers_a_message_over_100_kb_with_413_message_size_too_big():
    with ft.running() as fake:
        big = card({"type": "TextBlock", "text": "x" * 52000})
        status, answer = fake.handle(
            "create",
            ft.CHANNEL,
            "",
            {"type": "message", "attachments": [{"contentType": CONTENT_TYPE, "content": big}]},
        )

        assert (status, answer["error"]["code"]) == (413, "MessageSizeTooBig")


# -- Telegram -------------------------------------------------------------------------------


@pytest.fixture
def telegram() -> Iterator[ftg.FakeTelegram]:
    with ftg.running() as fake:
        yield fake


def send_message(fake: ftg.FakeTelegram, **args: Any) -> tuple[int, Any]:
    return send(f"{fake.base_url}/bot{fake.token}/sendMessage", {"chat_id": 1001, **args})


@pytest.mark.parametrize(
    ("text", "description"),
    [
        ("<div>x</div>", 'Unsupported start tag "div" at byte offset 0'),
        ("<b>x", 'Can\'t find end tag corresponding to start tag "b"'),
        ("<b>x</i>", 'Unmatched end tag at byte offset 4, expected "</b>", found "</i>"'),
        ("x</b>", "Unexpected end tag at byte offset 1"),
        ("1 < 2", "Unsupported start tag at byte offset 2"),
        ("<a>x</a>", 'Unsupported start tag "a" at byte offset 0: no href'),
        ("<pre><b>x</b></pre>", 'Unsupported start tag "b" inside code at byte offset 5'),
    ],
)
def test_telegram_refuses_html_the_bot_api_cannot_parse(telegram, text, description):
    status, answer = send_message(telegram, text=text, parse_mode="HTML")

    assert status == 400
    assert answer == {
        "ok": False,
        "error_code": 400,
        "description": f"Bad Request: can't parse entities: {description}",
    }


def test_telegram_counts_4096_characters_after_entities_parsing(telegram):
    exactly = "<b>" + "&lt;" * 4000 + "</b>" + "x" * 96

    assert send_message(telegram, text=exactly, parse_mode="HTML")[0] == 200
    status, answer = send_message(telegram, text=exactly + "x", parse_mode="HTML")
    assert (status, answer["description"]) == (400, "Bad Request: message is too long")


def test_telegram_reads_the_html_entities_it_supports():
    assert visible_text('<a href="https://x.io">a &amp; b &lt;c&gt; &quot;d&quot; &#128512;</a> & e') == (
        'a & b <c> "d" 😀 & e'
    )
    with pytest.raises(EntitiesError):
        visible_text('<span class="other">x</span>')


@pytest.mark.parametrize(
    ("markup", "description"),
    [
        (
            {"inline_keyboard": [{"text": "x"}]},
            'field "inline_keyboard" of the InlineKeyboardMarkup must be an Array of Arrays',
        ),
        (
            {"inline_keyboard": [[{"text": "x"}]]},
            "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard",
        ),
        (
            {"inline_keyboard": [[{"text": "x", "url": "ftp://x.io"}]]},
            "inline keyboard button URL 'ftp://x.io' is invalid: Unsupported URL protocol",
        ),
    ],
)
def test_telegram_refuses_an_inline_keyboard_the_bot_api_refuses(telegram, markup, description):
    status, answer = send_message(telegram, text="x", reply_markup=markup)

    assert (status, answer["description"]) == (400, f"Bad Request: {description}")


# -- Mattermost -------------------------------------------------------------------------------


@pytest.fixture
def mattermost() -> Iterator[fm.FakeMattermost]:
    with fm.running() as fake:
        yield fake


def create_post(fake: fm.FakeMattermost, **body: Any) -> tuple[int, Any]:
    return send(
        f"{fake.url}/api/v4/posts",
        {"channel_id": "channelchannelchannelchan1", **body},
        Authorization=f"Bearer {fake.token}",
    )


def test_mattermost_refuses_a_message_over_16383_characters(mattermost):
    assert create_post(mattermost, message="x" * 16383)[0] == 201
    status, answer = create_post(mattermost, message="x" * 16384)

    assert (status, answer["id"]) == (400, "model.post.is_valid.message_length.app_error")


@pytest.mark.parametrize(
    "props",
    [
        {"attachments": {"title": "not a list"}},
        {"attachments": [{"fields": [{"title": 3, "value": "v"}]}]},
        {"attachments": [{"fields": [{"title": "t", "value": "v", "short": "yes"}]}]},
    ],
)
def test_mattermost_refuses_attachments_that_do_not_decode(mattermost, props):
    status, answer = create_post(mattermost, message="x", props=props)

    assert (status, answer["id"]) == (400, "api.context.invalid_body_param.app_error")


def test_mattermost_refuses_props_over_what_a_client_may_send(mattermost):
    status, answer = create_post(mattermost, message="x", props={"attachments": [{"text": "x" * 400000}]})

    assert (status, answer["id"]) == (400, "model.post.is_valid.props.app_error")


def test_mattermost_refuses_more_than_five_files_a_post(mattermost):
    assert create_post(mattermost, message="x", file_ids=[f"file{n}" for n in range(5)])[0] == 201
    status, answer = create_post(mattermost, message="x", file_ids=[f"file{n}" for n in range(6)])

    assert (status, answer["id"]) == (400, "model.post.is_valid.file_ids.app_error")


def test_telegram_lets_a_bot_set_one_reaction_a_message():
    with ftg.running() as fake:
        send_message(fake, text="hi")
        react = f"{fake.base_url}/bot{fake.token}/setMessageReaction"
        one = [{"type": "emoji", "emoji": "👍"}]
        assert send(react, {"chat_id": 1001, "message_id": 1, "reaction": one})[0] == 200
        status, answer = send(react, {"chat_id": 1001, "message_id": 1, "reaction": one * 2})

    assert (status, answer["description"]) == (400, "Bad Request: REACTIONS_TOO_MANY")


def test_teams_refuses_a_text_block_of_an_unknown_font_type_or_spacing():
    errors = card_errors(card({"type": "TextBlock", "text": "x", "fontType": "Courier", "spacing": "tight"}))

    assert [e.split(":")[0] for e in errors] == ["body[0].spacing", "body[0].fontType"]
