"""Golden tests: each Message of golden_cases rendered per platform, compared with the payload
checked in under tests/golden/<platform>/<case>.json.

A change of a renderer shows as a diff of those files: ``UPDATE_GOLDEN=1 python -m pytest
tests/connectors/test_golden.py`` writes them anew, to be read and committed. That the fakes,
which refuse what the platforms refuse, take each payload is tests/test_e2e_messages.py's part.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from django_connector_outbox.connectors import (
    discord_render,
    google_chat_render,
    mattermost_render,
    slack_render,
    teams_render,
    telegram_render,
)
from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.google_chat import GoogleChatConnector
from django_connector_outbox.connectors.limits import possessive
from django_connector_outbox.connectors.mattermost import MattermostConnector
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.connectors.teams import TeamsConnector
from django_connector_outbox.connectors.telegram import TelegramConnector
from django_connector_outbox.fakes.adaptive_card import card_errors
from django_connector_outbox.fakes.block_kit import block_errors
from django_connector_outbox.fakes.discord_form import form_errors
from django_connector_outbox.fakes.google_chat import content_errors
from django_connector_outbox.fakes.telegram_html import keyboard_problem, visible_text
from django_connector_outbox.message import Message
from tests.connectors.golden_cases import CASES, just_over, largest

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

RENDERERS: dict[str, ModuleType] = {
    "slack": slack_render,
    "discord": discord_render,
    "teams": teams_render,
    "mattermost": mattermost_render,
    "telegram": telegram_render,
    "google_chat": google_chat_render,
}
CONNECTORS = {
    "slack": SlackConnector,
    "discord": DiscordConnector,
    "teams": TeamsConnector,
    "mattermost": MattermostConnector,
    "telegram": TelegramConnector,
    "google_chat": GoogleChatConnector,
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("platform", RENDERERS)
def test_a_message_renders_as_its_golden_payload(platform: str, case: str) -> None:
    message = CASES[case]
    rendered = RENDERERS[platform].render(message)
    path = GOLDEN / platform / f"{case}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        golden = {"message": message.to_json(), "payload": rendered}
        path.write_text(json.dumps(golden, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert golden["message"] == message.to_json(), f"{path} is of another Message: UPDATE_GOLDEN=1"
    assert rendered == golden["payload"]
    assert schema_problems(platform, rendered) == []


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("platform", RENDERERS)
def test_every_case_is_within_the_platforms_limits(platform: str, case: str) -> None:
    assert CONNECTORS[platform].message_problem(CASES[case], {}) is None


@pytest.mark.parametrize("platform", RENDERERS)
def test_the_largest_message_a_platform_shows_is_taken_and_one_character_more_is_refused(
    platform: str,
) -> None:
    connector = CONNECTORS[platform]
    assert connector.message_problem(largest(platform), {}) is None
    assert schema_problems(platform, RENDERERS[platform].render(largest(platform))) == []
    problem = connector.message_problem(just_over(platform), {})
    assert problem is not None and f"over {possessive(PLATFORM_NAMES[platform])} " in problem


PLATFORM_NAMES = {
    "slack": "Slack",
    "discord": "Discord",
    "teams": "Teams",
    "mattermost": "Mattermost",
    "telegram": "Telegram",
    "google_chat": "Google Chat",
}


def test_a_limit_is_worded_with_the_field_the_count_and_the_platforms_limit() -> None:
    assert CONNECTORS["telegram"].message_problem(Message("x" * 4210), {}) == (
        "the text (title, text, fields and context after entities parsing) is 4,210 characters, over Telegram's 4,096"
    )
    assert TeamsConnector.message_problem(just_over("teams"), {}).endswith("over Teams' 101,376")


def schema_problems(platform: str, payload: dict) -> list[str]:
    """What the platform's fake would refuse in `payload` (the HTTP round trip is the e2e's)."""
    if platform == "slack":
        return block_errors(payload["blocks"])
    if platform == "discord":
        return [json.dumps(form_errors(payload))] if form_errors(payload) else []
    if platform == "teams":
        return [e for a in payload["attachments"] for e in card_errors(a["content"])]
    if platform == "telegram":
        visible_text(payload["text"])  # raises what the Bot API would answer
        problem = keyboard_problem(payload.get("reply_markup"))
        return [problem] if problem else []
    if platform == "google_chat":
        return content_errors(payload)
    return []


def test_slack_splits_a_long_text_into_sections_of_at_most_3000_characters_at_paragraphs() -> None:
    message = CASES["long_text"]
    sections = [b["text"]["text"] for b in slack_render.render(message)["blocks"]]
    assert len(sections) > 1
    assert all(len(text) <= slack_render.SECTION_TEXT_CHARS for text in sections)
    assert "\n\n".join(sections) == slack_render.MRKDWN.render(message.text)


def test_slack_cuts_a_paragraph_longer_than_a_section_at_a_space_and_never_inside_an_entity() -> None:
    words = Message("&" * 2999 + " tail " + "& " * 1000)
    texts = [b["text"]["text"] for b in slack_render.render(words)["blocks"]]
    assert all(len(text) <= 3000 for text in texts)
    assert all(not text.endswith(("&", "&a", "&am", "&amp")) for text in texts)
    assert "".join(texts).replace("&amp;", "&").replace(" ", "") == ("&" * 2999 + "tail" + "&" * 1000)


def test_slack_keeps_a_code_block_split_over_sections_fenced_in_each() -> None:
    code = Message("```\n" + "\n".join(["line of code " * 10] * 40) + "\n```")
    texts = [b["text"]["text"] for b in slack_render.render(code)["blocks"]]
    assert len(texts) > 1
    assert all(text.startswith("```\n") and text.endswith("\n```") and len(text) <= 3000 for text in texts)


def test_slack_fallback_text_is_escaped_and_cut_to_what_chat_update_takes() -> None:
    long = Message("<&> " * 2000)
    text = slack_render.render(long)["text"]
    assert len(text) <= slack_render.FALLBACK_CHARS and text.endswith("…")
    assert "<" not in text and ">" not in text


def test_telegram_counts_the_text_after_entities_parsing() -> None:
    message = Message("**bold** & <tag>")
    assert visible_text(telegram_render.render(message)["text"]) == "bold & <tag>"
    assert telegram_render.shown_length(telegram_render.text(message)) == len("bold & <tag>")


def test_discord_text_alone_is_the_content_and_a_longer_one_the_embed_description() -> None:
    short = discord_render.render(Message("hi"))
    assert (short["content"], short["embeds"]) == ("hi", [])
    long = discord_render.render(Message("x" * 2001))
    assert long["content"] == "" and long["embeds"][0]["description"] == "x" * 2001


def test_slack_and_discord_break_a_fence_inside_a_code_block_so_it_does_not_end_it() -> None:
    code = Message("````\nbefore ``` after\n````")
    [section] = slack_render.render(code)["blocks"]
    assert section["text"]["text"] == "```\nbefore `\u200b`` after\n```"
    assert discord_render.render(code)["content"] == "```\nbefore `\u200b`` after\n```"


def test_slack_sets_apart_literal_markers_at_word_edges_but_not_inside_words_or_urls() -> None:
    text = slack_render.literal("*not bold* snake_case https://x.io/a_b_")
    assert text == "\u200b*\u200bnot bold\u200b*\u200b snake_case https://x.io/a_b_"
