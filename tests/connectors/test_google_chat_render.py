"""A Message rendered for Google Chat: its text in Chat's formatting, a cardsV2 card for the
rest, and the limits a Message is held to at queue time (no network but the fake's)."""

from __future__ import annotations

import asyncio

import pytest

from django_connector_outbox.connectors.google_chat import GoogleChatConnector
from django_connector_outbox.connectors.google_chat_render import message_problem, render
from django_connector_outbox.fakes import google_chat as fg
from django_connector_outbox.message import Link, Message
from tests.connectors.helpers import claimed_post


@pytest.mark.parametrize(
    ("markdown", "chat"),
    [
        ("plain words", "plain words"),
        ("**bold** _italic_ ~~strike~~ `code`", "*bold* _italic_ ~strike~ `code`"),
        ("see [the log](https://ci.example/1?a=1&b=2)", "see <https://ci.example/1?a=1&b=2|the log>"),
        ("line one\nline two\n\nnext paragraph", "line one\nline two\n\nnext paragraph"),
        ("```python\nprint('**not bold**')\n```", "```\nprint('**not bold**')\n```"),
        ("snake_case_name and **open", "snake_case_name and **open"),
        ("ünïcödé 🚀 **fett**", "ünïcödé 🚀 *fett*"),
    ],
)
def test_text_is_in_google_chats_formatting(markdown, chat):
    assert render(Message(markdown)) == {"text": chat}


def test_a_title_without_a_card_is_the_texts_first_line_in_bold():
    assert render(Message("done", title="Deploy")) == {"text": "*Deploy*\ndone"}
    assert render(Message("", title="Deploy")) == {"text": "*Deploy*"}


def test_fields_actions_image_and_context_make_a_card_under_the_text():
    message = Message(
        "Deploy **done**",
        title="api",
        fields=[("Env", "prod"), ("By", "ana")],
        actions=[Link("Open", "https://ci.example/1"), Link("Logs", "https://ci.example/1/logs")],
        image_url="https://ci.example/chart.png",
        context="_took_ 4 min",
    )

    assert render(message) == {
        "text": "Deploy *done*",
        "cardsV2": [
            {
                "cardId": "message",
                "card": {
                    "header": {"title": "api"},
                    "sections": [
                        {
                            "widgets": [
                                {"decoratedText": {"topLabel": "Env", "text": "prod", "wrapText": True}},
                                {"decoratedText": {"topLabel": "By", "text": "ana", "wrapText": True}},
                            ]
                        },
                        {
                            "widgets": [
                                {"image": {"imageUrl": "https://ci.example/chart.png", "altText": "api"}}
                            ]
                        },
                        {
                            "widgets": [
                                {
                                    "buttonList": {
                                        "buttons": [
                                            {
                                                "text": "Open",
                                                "onClick": {"openLink": {"url": "https://ci.example/1"}},
                                            },
                                            {
                                                "text": "Logs",
                                                "onClick": {"openLink": {"url": "https://ci.example/1/logs"}},
                                            },
                                        ]
                                    }
                                }
                            ]
                        },
                        {"widgets": [{"textParagraph": {"text": "<i>took</i> 4 min"}}]},
                    ],
                },
            }
        ],
    }


def test_card_widgets_escape_their_text_since_they_read_chats_html_subset():
    body = render(Message("", fields=[("a<b", "x & <y>")], context='[a&b](https://e.example/?q="1") <br>'))

    sections = body["cardsV2"][0]["card"]["sections"]
    assert "text" not in body
    assert sections[0]["widgets"][0]["decoratedText"] == {
        "topLabel": "a&lt;b",
        "text": "x &amp; &lt;y&gt;",
        "wrapText": True,
    }
    assert sections[1]["widgets"][0]["textParagraph"]["text"] == (
        '<a href="https://e.example/?q=&quot;1&quot;">a&amp;b</a> &lt;br&gt;'
    )


# -- limits at queue time -------------------------------------------------------------


def test_the_largest_text_is_allowed_and_one_character_more_is_refused():
    assert message_problem(Message("x" * 4096)) is None
    assert message_problem(Message("x" * 4097)) == (
        "text is 4,097 characters in Google Chat's formatting, over Google Chat's 4,096"
    )
    # Counted as sent: "**b**" is "*b*" in Chat's formatting, and a title joins the text.
    assert message_problem(Message("**" + "b" * 4094 + "**")) is None
    assert message_problem(Message("x" * 4090, title="Title")) is not None


def test_a_card_of_more_than_100_widgets_is_refused():
    fields = [(f"f{n}", "v") for n in range(97)]
    assert (
        message_problem(Message("t", fields=fields, actions=[Link("a", "https://e.example")], context="c"))
        is None
    )
    problem = message_problem(
        Message(
            "t",
            fields=[*fields, ("one", "more")],
            actions=[Link("a", "https://e.example")],
            context="c",
            image_url="https://e.example/i.png",
        )
    )
    assert (
        problem == "fields, image, actions and context make 101 card widgets, over Google Chat's 100 a card"
    )


def test_a_message_over_32000_bytes_is_refused():
    fields = [(f"f{n}", "é" * 200) for n in range(80)]  # 400 bytes a value

    problem = message_problem(Message("t", fields=fields))

    assert (
        problem is not None
        and problem.startswith("the message is ")
        and problem.endswith("bytes as Google Chat's JSON, over Google Chat's 32,000")
    )


def test_the_connector_class_reads_the_limits_without_being_built():
    assert GoogleChatConnector.message_problem(Message("x" * 5000), {}) is not None
    assert GoogleChatConnector.message_problem(Message("ok"), {}) is None


@pytest.mark.parametrize(
    ("message", "accepted"),
    [
        (Message("x" * 4096), True),
        (Message("t", fields=[(f"f{n}", "v") for n in range(100)]), True),
        (Message("x" * 4097), False),
        (Message("t", fields=[(f"f{n}", "v") for n in range(101)]), False),
        (Message("t", fields=[(f"f{n}", "é" * 200) for n in range(80)]), False),
    ],
)
def test_the_fake_google_chat_accepts_what_message_problem_allows_and_refuses_the_rest(message, accepted):
    assert (message_problem(message) is None) is accepted
    with fg.running() as fake:
        connector = GoogleChatConnector(source="gc", **fake.connector_options(), timeout=2)

        async def send():
            try:
                return await connector.asend(claimed_post("gc", "p1", render(message), container_id=fg.SPACE))
            finally:
                await connector.aclose()

        outcome = asyncio.run(send())
    assert (type(outcome).__name__ == "Delivered") is accepted, outcome
