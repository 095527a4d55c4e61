"""The Markdown subset of a Message's `text` and `context`, parsed once for every platform.

The subset is what every shipped platform can show: ``**bold**``, ``_italic_``,
``~~strike~~``, ``` `code` ```, fenced code blocks, ``[label](url)`` links and line breaks.
Everything else (headings, lists, quotes, HTML, a marker left open) is literal text, so that a
Message reads the same on Slack, Telegram and in an email rather than as each platform's own
Markdown dialect would take it. A backslash before a marker character keeps it literal.

`parse` gives a small tree of blocks and inlines; a platform renders it with a `Markup`
(one method per node), like `to_plain` and `to_html` here. Hand-written rather than
markdown-it-py: the subset is a few rules, and CommonMark's many others would each have to be
switched off to keep "everything else is literal" (and it would be a runtime dependency).

Inline spans never cross a line break: Slack's mrkdwn and Telegram's entities end at one, so a
span over two lines would render differently per platform.
"""

from __future__ import annotations

import bisect
import html
import re
from dataclasses import dataclass

#: Characters that a backslash makes literal; a backslash before any other stays itself.
ESCAPABLE = frozenset("\\`*_~[]()")

#: Link targets a renderer may emit: a ``javascript:`` or ``data:`` link in an email's HTML
#: would run or hide code, so a link to any other scheme stays literal text.
LINK_SCHEMES = ("http://", "https://", "mailto:")

_FENCE = re.compile(r"(`{3,})([^`]*)")


@dataclass(frozen=True, slots=True)
class Text:
    """Literal text."""

    text: str


@dataclass(frozen=True, slots=True)
class Bold:
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Italic:
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Strike:
    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Code:
    """An inline code span; its text is literal (no markup inside)."""

    text: str


@dataclass(frozen=True, slots=True)
class Hyperlink:
    """``[label](url)``: `children` the label, `url` one of `LINK_SCHEMES`."""

    children: tuple[Inline, ...]
    url: str


@dataclass(frozen=True, slots=True)
class LineBreak:
    """A newline inside a paragraph."""


Inline = Text | Bold | Italic | Strike | Code | Hyperlink | LineBreak


@dataclass(frozen=True, slots=True)
class Paragraph:
    """Lines of text between blank lines (their breaks are `LineBreak` nodes)."""

    children: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class CodeBlock:
    """A fenced code block: `text` literal, `language` the fence's first word or ""."""

    text: str
    language: str = ""


Block = Paragraph | CodeBlock


def parse(text: str) -> tuple[Block, ...]:
    """The blocks of `text`: paragraphs (split at blank lines) and closed fenced code blocks."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[Block] = []
    paragraph: list[str] = []

    def end_paragraph() -> None:
        if paragraph:
            blocks.append(Paragraph(_lines(paragraph)))
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.fullmatch(line.rstrip())
        close = _closing_fence(lines, i + 1, len(fence.group(1))) if fence else None
        if fence and close is not None:
            end_paragraph()
            words = fence.group(2).split()
            blocks.append(CodeBlock("\n".join(lines[i + 1 : close]), words[0] if words else ""))
            i = close + 1
        elif not line.strip():
            end_paragraph()
            i += 1
        else:
            paragraph.append(line)
            i += 1
    end_paragraph()
    return tuple(blocks)


def _closing_fence(lines: list[str], start: int, length: int) -> int | None:
    """The index of the line closing a fence of `length` backticks, or None (left open)."""
    for k in range(start, len(lines)):
        candidate = lines[k].strip()
        if len(candidate) >= length and candidate == "`" * len(candidate):
            return k
    return None


def _lines(lines: list[str]) -> tuple[Inline, ...]:
    nodes: list[Inline] = []
    for number, line in enumerate(lines):
        if number:
            nodes.append(LineBreak())
        nodes.extend(parse_inlines(line))
    return tuple(nodes)


def parse_inlines(line: str) -> tuple[Inline, ...]:
    """The inline nodes of one line (no line breaks in it)."""
    return _Inlines(line).parse(0, len(line))


class _Inlines:
    """The spans of one line, found left to right; a span's content is parsed in place.

    Each scan for a closing marker that fails is remembered (`unclosed`: (marker, where the
    scanned range ends) -> where its first failed scan started): a later opener of that marker
    in that range would walk the same rest of it and fail too, so it is not scanned again;
    code spans look their closing run up among the runs of backticks found once (`runs`).
    Without these, "_a _a _a ..." or open backtick runs of many lengths are quadratic: seconds
    for a few thousand characters, at send time, of text a project's users may have written.
    """

    def __init__(self, line: str) -> None:
        self.line = line
        self.unclosed: dict[tuple[str, int], int] = {}
        # length -> where each run of backticks of that length starts, in order
        self.runs: dict[int, list[int]] = {}
        for found in re.finditer("`+", line):
            self.runs.setdefault(len(found[0]), []).append(found.start())

    def parse(self, start: int, end: int) -> tuple[Inline, ...]:
        line = self.line
        nodes: list[Inline] = []
        literal: list[str] = []
        i = start
        while i < end:
            char = line[i]
            if char == "\\" and i + 1 < end and line[i + 1] in ESCAPABLE:
                literal.append(line[i + 1])
                i += 2
                continue
            found = self.span_at(i, end)
            if found is None:
                run = self.run_length(i, end, "`") if char == "`" else 1  # an open code run stays whole
                literal.append(line[i : i + run])
                i += run
                continue
            node, i = found
            if literal:
                nodes.append(Text("".join(literal)))
                literal.clear()
            nodes.append(node)
        if literal:
            nodes.append(Text("".join(literal)))
        return tuple(nodes)

    def span_at(self, i: int, end: int) -> tuple[Inline, int] | None:
        """The span that starts at `i` (ending by `end`) and the index after it, or None."""
        line = self.line
        if line[i] == "`":
            return self.code_at(i, end)
        if line.startswith("**", i):
            return self.delimited(i, end, "**", Bold)
        if line.startswith("~~", i):
            return self.delimited(i, end, "~~", Strike)
        if line[i] == "_":
            return self.italic_at(i, end)
        if line[i] == "[":
            return self.link_at(i, end)
        return None

    def run_length(self, i: int, end: int, char: str) -> int:
        j = i
        while j < end and self.line[j] == char:
            j += 1
        return j - i

    def closes_nowhere(self, marker: str, i: int, end: int) -> bool:
        return self.unclosed.get((marker, end), end) <= i

    def note_unclosed(self, marker: str, i: int, end: int) -> None:
        self.unclosed.setdefault((marker, end), i)

    def code_at(self, i: int, end: int) -> tuple[Inline, int] | None:
        """A code span opened by a run of backticks, closed by the next run of the same length
        (looked up in `runs`, so that many open runs of many lengths are not scanned again)."""
        run = self.run_length(i, end, "`")
        starts = self.runs.get(run, [])
        after = bisect.bisect_right(starts, i)
        if after == len(starts) or starts[after] + run > end:
            return None
        close = starts[after]
        return Code(self.line[i + run : close]), close + run

    def skip_code(self, j: int, end: int) -> int:
        """The index after a code span at `j`, or after its lone backtick run."""
        span = self.code_at(j, end)
        return span[1] if span else j + self.run_length(j, end, "`")

    def delimited(
        self, i: int, end: int, marker: str, kind: type[Bold] | type[Strike]
    ) -> tuple[Inline, int] | None:
        """``**x**`` or ``~~x~~``: the content must not start or end with a space."""
        line = self.line
        start = i + len(marker)
        if start >= end or line[start].isspace() or self.closes_nowhere(marker, i, end):
            return None
        j = start
        while j < end:
            if line[j] == "\\":
                j += 2
            elif line[j] == "`":
                j = self.skip_code(j, end)
            elif (
                line.startswith(marker, j)
                and j + len(marker) <= end
                and j > start
                and not line[j - 1].isspace()
            ):
                return kind(self.parse(start, j)), j + len(marker)
            else:
                j += 1
        self.note_unclosed(marker, i, end)
        return None

    def italic_at(self, i: int, end: int) -> tuple[Inline, int] | None:
        """``_x_`` with single underscores at word edges, so that snake_case_names stay literal."""
        line = self.line
        start = i + 1
        if (
            not self.lone_underscore(i, end)
            or (i > 0 and line[i - 1].isalnum())
            or start >= end
            or line[start].isspace()
            or self.closes_nowhere("_", i, end)
        ):
            return None
        j = start
        while j < end:
            if line[j] == "\\":
                j += 2
            elif line[j] == "`":
                j = self.skip_code(j, end)
            elif (
                line[j] == "_"
                and self.lone_underscore(j, end)
                and not line[j - 1].isspace()
                and not (j + 1 < end and line[j + 1].isalnum())
            ):
                return Italic(self.parse(start, j)), j + 1
            else:
                j += 1
        self.note_unclosed("_", i, end)
        return None

    def lone_underscore(self, i: int, end: int) -> bool:
        line = self.line
        return not (i > 0 and line[i - 1] == "_") and not (i + 1 < end and line[i + 1] == "_")

    def link_at(self, i: int, end: int) -> tuple[Inline, int] | None:
        """``[label](url)``: a label without brackets; a url without spaces or brackets, its
        parentheses balanced. Each scan stops at the next bracket, so none is repeated."""
        line = self.line
        j = i + 1
        while j < end and line[j] != "]":
            if line[j] == "[":
                return None
            j += 2 if line[j] == "\\" else 1
        if j >= end or j == i + 1 or j + 1 >= end or line[j + 1] != "(":
            return None
        label_end, url_start = j, j + 2
        depth, k = 0, url_start
        while k < end:
            char = line[k]
            if char.isspace() or char in "[]":
                return None
            if char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    break
                depth -= 1
            k += 1
        url = line[url_start:k]
        if k >= end or not url.lower().startswith(LINK_SCHEMES):
            return None
        return Hyperlink(self.parse(i + 1, label_end), url), k + 1


class Markup:
    """How one output format writes each node: subclass it and override what differs.

    Each method gets its children already rendered. This base writes plain text: markers
    dropped, a link as its label and its url in parentheses (its url alone when they agree).
    """

    #: What goes between two blocks.
    block_separator = "\n\n"

    def text(self, text: str) -> str:
        return text

    def bold(self, inner: str) -> str:
        return inner

    def italic(self, inner: str) -> str:
        return inner

    def strike(self, inner: str) -> str:
        return inner

    def code(self, text: str) -> str:
        return self.text(text)

    def link(self, inner: str, url: str) -> str:
        return url if inner == self.text(url) else f"{inner} ({self.text(url)})"

    def line_break(self) -> str:
        return "\n"

    def paragraph(self, inner: str) -> str:
        return inner

    def code_block(self, text: str, language: str) -> str:
        return self.text(text)

    def inlines(self, nodes: tuple[Inline, ...]) -> str:
        return "".join(self.inline(node) for node in nodes)

    def inline(self, node: Inline) -> str:
        match node:
            case Text(text):
                return self.text(text)
            case Bold(children):
                return self.bold(self.inlines(children))
            case Italic(children):
                return self.italic(self.inlines(children))
            case Strike(children):
                return self.strike(self.inlines(children))
            case Code(text):
                return self.code(text)
            case Hyperlink(children, url):
                return self.link(self.inlines(children), url)
            case LineBreak():
                return self.line_break()
        raise TypeError(f"not an inline node: {node!r}")

    def block(self, node: Block) -> str:
        if isinstance(node, CodeBlock):
            return self.code_block(node.text, node.language)
        return self.paragraph(self.inlines(node.children))

    def render(self, text: str) -> str:
        """`text` (Markdown of the subset) in this format."""
        return self.block_separator.join(self.block(block) for block in parse(text))


class HtmlMarkup(Markup):
    """HTML for an email's body: every text escaped, every url quoted in its attribute."""

    block_separator = "\n"

    def text(self, text: str) -> str:
        return html.escape(text, quote=False)

    def bold(self, inner: str) -> str:
        return f"<strong>{inner}</strong>"

    def italic(self, inner: str) -> str:
        return f"<em>{inner}</em>"

    def strike(self, inner: str) -> str:
        return f"<s>{inner}</s>"

    def code(self, text: str) -> str:
        return f"<code>{self.text(text)}</code>"

    def link(self, inner: str, url: str) -> str:
        return f'<a href="{html.escape(url, quote=True)}">{inner}</a>'

    def line_break(self) -> str:
        return "<br>\n"

    def paragraph(self, inner: str) -> str:
        return f"<p>{inner}</p>"

    def code_block(self, text: str, language: str) -> str:
        attribute = f' class="language-{html.escape(language, quote=True)}"' if language else ""
        return f"<pre><code{attribute}>{self.text(text)}</code></pre>"


PLAIN = Markup()
HTML = HtmlMarkup()


def to_plain(text: str) -> str:
    """`text` as plain text: the subset's markers dropped, links as "label (url)"."""
    return PLAIN.render(text)


def to_html(text: str) -> str:
    """`text` as HTML paragraphs, everything escaped."""
    return HTML.render(text)
