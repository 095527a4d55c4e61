"""The Markdown subset of a Message: the tree every renderer walks, and its text and HTML."""

from __future__ import annotations

import time

import pytest

from django_connector_outbox.connectors.markdown import (
    Bold,
    Code,
    CodeBlock,
    Hyperlink,
    Italic,
    LineBreak,
    Markup,
    Paragraph,
    Strike,
    Text,
    parse,
    parse_inlines,
    to_html,
    to_plain,
)


@pytest.mark.parametrize(
    ("line", "nodes"),
    [
        ("plain", (Text("plain"),)),
        ("**bold**", (Bold((Text("bold"),)),)),
        ("_italic_", (Italic((Text("italic"),)),)),
        ("~~strike~~", (Strike((Text("strike"),)),)),
        ("`code`", (Code("code"),)),
        ("[label](https://example.com/a?b=1)", (Hyperlink((Text("label"),), "https://example.com/a?b=1"),)),
        ("[mail](mailto:ops@example.com)", (Hyperlink((Text("mail"),), "mailto:ops@example.com"),)),
        ("a **b** c", (Text("a "), Bold((Text("b"),)), Text(" c"))),
    ],
)
def test_each_element(line: str, nodes: tuple) -> None:
    assert parse_inlines(line) == nodes


def test_nesting() -> None:
    assert parse_inlines("**bold _italic ~~both~~_**") == (
        Bold((Text("bold "), Italic((Text("italic "), Strike((Text("both"),)))))),
    )
    assert parse_inlines("[**big** `x`](https://e.com)") == (
        Hyperlink((Bold((Text("big"),)), Text(" "), Code("x")), "https://e.com"),
    )
    assert parse_inlines("_a [b](https://e.com) c_") == (
        Italic((Text("a "), Hyperlink((Text("b"),), "https://e.com"), Text(" c"))),
    )


@pytest.mark.parametrize(
    "line",
    [
        "**open",
        "open**",
        "~~open",
        "_open",
        "`open",
        "``open`",
        "** spaced**",
        "**spaced **",
        "_ spaced_",
        "_spaced _",
        "~~ x~~",
        "****",
        "__",
        "snake_case_name",
        "__dunder__",
        "2*3*4",
        "*single*",
        "[label]",
        "[label] (https://e.com)",
        "[](https://e.com)",
        "[label]()",
        "[label](https://e.com",
        "[label](https://e.com/a b)",
        "[label](javascript:alert(1))",
        "[label](data:text/html,x)",
        "[label](/relative)",
        "[a[b]](https://e.com)",
        "# heading",
        "> quote",
        "- item",
        "1. item",
        "<b>html</b>",
        "https://e.com/bare",
    ],
)
def test_what_is_not_the_subset_stays_literal(line: str) -> None:
    assert parse_inlines(line) == (Text(line),)
    assert to_plain(line) == line


def test_code_spans_keep_their_content_literal() -> None:
    assert parse_inlines("`**not bold** _x_ [a](https://e.com) \\*`") == (
        Code("**not bold** _x_ [a](https://e.com) \\*"),
    )
    # A run of two backticks closes only on two, so a backtick can be shown inside.
    assert parse_inlines("``a ` b``") == (Code("a ` b"),)
    # A closing marker inside a code span does not close the span around it.
    assert parse_inlines("**a `**` b**") == (Bold((Text("a "), Code("**"), Text(" b"))),)


def test_backslash_keeps_a_marker_literal() -> None:
    assert parse_inlines(r"\*\*not bold\*\*") == (Text("**not bold**"),)
    assert parse_inlines(r"\_x\_ \~~y\~~ \`z\` \[a](https://e.com) \\") == (
        Text(r"_x_ ~~y~~ `z` [a](https://e.com) \ ".rstrip()),
    )
    # Before any other character a backslash is itself (Windows paths read as written).
    assert parse_inlines(r"C:\Users\me") == (Text(r"C:\Users\me"),)
    assert parse_inlines(r"**a\**b**") == (Bold((Text("a**b"),)),)
    assert parse_inlines("trailing \\") == (Text("trailing \\"),)


def test_an_escaped_marker_inside_a_span() -> None:
    assert parse_inlines(r"**a\*\*b**") == (Bold((Text("a**b"),)),)
    assert parse_inlines(r"_a\_b_") == (Italic((Text("a_b"),)),)


def test_underscores_inside_words_are_literal_but_italic_at_word_edges() -> None:
    assert parse_inlines("call my_func_name, _really_.") == (
        Text("call my_func_name, "),
        Italic((Text("really"),)),
        Text("."),
    )
    assert parse_inlines("_a_b_") == (Italic((Text("a_b"),)),)


def test_the_first_closing_marker_closes() -> None:
    assert parse_inlines("**a**b**") == (Bold((Text("a"),)), Text("b**"))
    assert parse_inlines("***x***") == (Bold((Text("*x"),)), Text("*"))


def test_links_keep_balanced_parentheses_in_their_url() -> None:
    assert parse_inlines("see [it](https://en.wikipedia.org/wiki/Go_(game)).") == (
        Text("see "),
        Hyperlink((Text("it"),), "https://en.wikipedia.org/wiki/Go_(game)"),
        Text("."),
    )
    assert parse_inlines("[x](HTTPS://E.COM)") == (Hyperlink((Text("x"),), "HTTPS://E.COM"),)


def test_lines_paragraphs_and_breaks() -> None:
    assert parse("one\ntwo\n\n\nthree") == (
        Paragraph((Text("one"), LineBreak(), Text("two"))),
        Paragraph((Text("three"),)),
    )
    assert parse("a\r\nb\rc") == (Paragraph((Text("a"), LineBreak(), Text("b"), LineBreak(), Text("c"))),)
    assert parse("") == ()
    assert parse("\n \n\t\n") == ()


def test_spans_do_not_cross_a_line_break() -> None:
    assert parse("**a\nb**") == (Paragraph((Text("**a"), LineBreak(), Text("b**"))),)
    assert parse("`a\nb`") == (Paragraph((Text("`a"), LineBreak(), Text("b`"))),)


def test_fenced_code_blocks() -> None:
    text = "before\n```python extra\ndef f(x):\n    return **x** _y_\n\n<tag>\n```\nafter"
    assert parse(text) == (
        Paragraph((Text("before"),)),
        CodeBlock("def f(x):\n    return **x** _y_\n\n<tag>", "python"),
        Paragraph((Text("after"),)),
    )
    # A longer fence closes a shorter one; a shorter does not close a longer.
    assert parse("````\n```\n````") == (CodeBlock("```"),)
    assert parse("```\n```") == (CodeBlock(""),)


def test_an_unclosed_fence_is_literal_text() -> None:
    assert parse("```sh\nrm -rf **x**") == (
        Paragraph((Text("```sh"), LineBreak(), Text("rm -rf "), Bold((Text("x"),)))),
    )
    assert to_plain("```sh\nrm") == "```sh\nrm"


def test_three_backticks_on_one_line_are_a_code_span() -> None:
    assert parse("```a```") == (Paragraph((Code("a"),)),)


def test_unicode() -> None:
    text = "**héllo** _wörld_ ~~日本語~~ `ü` [€](https://e.com/ü) 🎉 日本_語_"
    assert parse_inlines(text) == (
        Bold((Text("héllo"),)),
        Text(" "),
        Italic((Text("wörld"),)),
        Text(" "),
        Strike((Text("日本語"),)),
        Text(" "),
        Code("ü"),
        Text(" "),
        Hyperlink((Text("€"),), "https://e.com/ü"),
        Text(" 🎉 日本_語_"),
    )
    assert to_plain(text) == "héllo wörld 日本語 ü € (https://e.com/ü) 🎉 日本_語_"


def test_to_plain() -> None:
    text = "**Deploy** of _api_ ~~failed~~ `v2`\nsee [the log](https://ci.example.com/1)\n\n```\n**raw**\n```"
    assert to_plain(text) == "Deploy of api failed v2\nsee the log (https://ci.example.com/1)\n\n**raw**"
    assert to_plain("[https://e.com](https://e.com)") == "https://e.com"


def test_to_html() -> None:
    text = "**Deploy** of _api_ ~~failed~~ `v2`\nsee [the log](https://ci.example.com/1?a=1&b=2)\n\n```sh\nmake <all>\n```"
    assert to_html(text) == (
        "<p><strong>Deploy</strong> of <em>api</em> <s>failed</s> <code>v2</code><br>\n"
        'see <a href="https://ci.example.com/1?a=1&amp;b=2">the log</a></p>\n'
        '<pre><code class="language-sh">make &lt;all&gt;</code></pre>'
    )


def test_to_html_escapes_everything() -> None:
    assert to_html('<script>alert("x")</script> & **<b>**') == (
        '<p>&lt;script&gt;alert("x")&lt;/script&gt; &amp; <strong>&lt;b&gt;</strong></p>'
    )
    assert to_html('[x](https://e.com/"onmouseover="a)') == (
        '<p><a href="https://e.com/&quot;onmouseover=&quot;a">x</a></p>'
    )
    assert to_html("`<i>&</i>`") == "<p><code>&lt;i&gt;&amp;&lt;/i&gt;</code></p>"
    assert (
        to_html('```"><x\n<y>\n```') == '<pre><code class="language-&quot;&gt;&lt;x">&lt;y&gt;</code></pre>'
    )


def test_a_markup_subclass_renders_each_node_its_way() -> None:
    class Starred(Markup):
        block_separator = " | "

        def bold(self, inner: str) -> str:
            return f"*{inner}*"

        def link(self, inner: str, url: str) -> str:
            return f"<{url}|{inner}>"

        def code_block(self, text: str, language: str) -> str:
            return f"```{text}```"

    assert Starred().render("**a** [b](https://e.com)\n\n```\nc\n```") == "*a* <https://e.com|b> | ```c```"


@pytest.mark.parametrize(
    "text",
    [
        "_a " * 13_000,
        "**a " * 10_000,
        "~~a _b `c " * 4_000,
        "**_a " * 8_000,
        "[a](" * 10_000,
        "".join("`" * n + " " for n in range(1, 280)),  # open code runs of every length
    ],
    ids=["italics", "bolds", "mixed", "nested", "links", "code-runs"],
)
def test_open_markers_in_long_text_take_linear_time(text: str) -> None:
    # Each opener rescanning the rest of the line took 13 s for 12,000 characters of "_a ";
    # these 40,000 take about 0.1 s. The bound is loose for a loaded machine, and far below
    # what a quadratic scan takes.
    started = time.perf_counter()
    blocks = parse(text)
    assert time.perf_counter() - started < 3
    assert [type(block) for block in blocks] == [Paragraph]
