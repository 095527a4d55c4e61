"""The Messages of the golden tests, and per platform the largest it can show and one just over.

Each case exercises something a renderer could get wrong: every element at once, the Markdown
subset's edges, text beyond ASCII, characters that a platform's markup would take as its own,
a text longer than one of Slack's sections. tests/golden/<platform>/<case>.json holds each
rendered (regenerate with ``UPDATE_GOLDEN=1``).
"""

from __future__ import annotations

import json

from django_connector_outbox import Link, Message
from django_connector_outbox.connectors import google_chat_render, teams_render

CASES: dict[str, Message] = {
    "text": Message("Deploy of **api** finished."),
    "every_element": Message(
        "Build **#4521** of _main_ passed.\nSee [the log](https://ci.example.com/builds/4521).",
        title="Deploy finished",
        fields=[("Service", "api"), ("Duration", "4 min 12 s"), ("Commit", "a1b2c3d")],
        actions=[
            Link("Open build", "https://ci.example.com/builds/4521"),
            Link("Roll back", "https://ci.example.com/builds/4521/rollback"),
        ],
        image_url="https://ci.example.com/builds/4521/chart.png",
        context="Queued by _deploy-bot_ at 12:04 UTC",
    ),
    "markdown": Message(
        "**bold** _italic_ ~~strike~~ `code` and **_nested_ bold**\n"
        "a [link](https://example.com/a_(b)?q=1&r=2) and snake_case_name and 2*3*4\n"
        "left open: **not bold, _not italic, `not code\n"
        "escaped: \\*\\*not bold\\*\\* and \\_not italic\\_\n"
        "\n"
        "```python\n"
        "def f(x):\n"
        "    return x < 1 and x > -1  # **not bold**\n"
        "```\n"
        "\n"
        "# not a heading\n"
        "> not a quote\n"
        "- not a list"
    ),
    "unicode": Message(
        "Déploiement réussi ✅ — 完成しました — تم النشر — שלום 👩\u200d💻 🇫🇷 e\u0301",
        title="Ünïcödé 🚀",
        fields=[("Région", "Île-de-France"), ("状態", "完了")],
        actions=[Link("Voir 👀", "https://example.com/d%C3%A9ploiement")],
        context="🕐 _maintenant_",
    ),
    "escaping": Message(
        "<!channel> <@U123> @everyone @here & &amp; 1 < 2 > 0 <b>not html</b> | pipe :smile:\n"
        "\"quotes\" and 'apostrophes' and a bare https://example.com/a_b*c link",
        title='<Alert> & "friends" **not bold**',
        fields=[("<key>", "a & b < c"), ("[label](x)", "*stars* _under_")],
        actions=[Link("Open <it> & see", "https://example.com/?a=1&b=<2>")],
        context="<@U999> & more",
    ),
    "long_text": Message(
        "\n\n".join(f"Paragraph {n}: " + "lorem ipsum dolor sit amet " * 18 for n in range(7))
    ),
}


def largest(platform: str) -> Message:
    """The largest Message `platform` can show: each element at (or near) its limit."""
    return _SIZES[platform](0)


def just_over(platform: str) -> Message:
    """`largest(platform)` with one character too many."""
    return _SIZES[platform](1)


def _slack(extra: int) -> Message:
    # 50 blocks: a header of 150, 45 sections of text, a section of 10 fields of 2,000 (the
    # "*label*\n" around the label counted), an image (a url of 3,000), 25 buttons of 75, a context.
    return Message(
        "\n\n".join(["x" * 2990] * 45),
        title="T" * (150 + extra),
        fields=[("L", "v" * (2000 - len("*L*\n")))] * 10,
        actions=[Link("B" * 75, f"https://example.com/{n}") for n in range(25)],
        image_url="https://example.com/" + "i" * 2980,
        context="c" * 2000,
    )


def _discord(extra: int) -> Message:
    # The embed's 6,000 characters, the connector's marker footer (29) included.
    title, text = "T" * 256, "x" * 4096
    fields = [(f"F{n}", "v" * 98) for n in range(10)]  # 100 each
    context = "c" * (6000 - 29 - 256 - 4096 - 1000 + extra)
    return Message(
        text,
        title=title,
        fields=fields,
        actions=[Link("B" * 80, f"https://example.com/{n}") for n in range(25)],
        context=context,
    )


def _telegram(extra: int) -> Message:
    # 4,096 characters after entities parsing: the title, two blank lines, the text.
    return Message("x & y < z " * 200 + "x" * (4096 - 2000 - len("Title\n\n") + extra), title="Title")


def _mattermost(extra: int) -> Message:
    return Message("x" * (16383 + extra), title="Title", actions=[Link("Open", "https://example.com/")])


def _teams(extra: int) -> Message:
    # About 100 KB in UTF-16: the longest text whose card (and summary) fits, found by halving.
    low, high = 0, 100 * 1024
    while low < high:
        middle = (low + high + 1) // 2
        if (
            _teams_bytes(Message("x" * middle, title="Title"))
            <= teams_render.MESSAGE_BYTES - teams_render.ENVELOPE_BYTES
        ):
            low = middle
        else:
            high = middle - 1
    return Message("x" * (low + extra), title="Title")


def _teams_bytes(message: Message) -> int:
    return len(json.dumps(teams_render.render(message), ensure_ascii=False).encode("utf-16-le"))


def _google_chat(extra: int) -> Message:
    # 4,096 characters of text, and a card of 100 widgets (97 fields, the image, the buttons, the
    # context) within the message's 32,000 bytes.
    return Message(
        "x" * (google_chat_render.TEXT_CHARS + extra),
        title="T" * 200,
        fields=[(f"F{n}", "v" * 200) for n in range(97)],
        actions=[Link("B" * 40, f"https://example.com/{n}") for n in range(10)],
        image_url="https://example.com/chart.png",
        context="c" * 500,
    )


_SIZES = {
    "slack": _slack,
    "discord": _discord,
    "telegram": _telegram,
    "mattermost": _mattermost,
    "teams": _teams,
    "google_chat": _google_chat,
}
