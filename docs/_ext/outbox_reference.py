"""The reference pages that are read from the code, so that they cannot drift from it.

- ``{outbox-settings}``: each setting of ``conf.DEFAULTS``, its default as written in conf.py,
  the comment beside it, and the rule that checks it (``conf.RULES``, with its check id);
- ``{outbox-checks}``: each system check id the package raises, found in its source, with the
  summary of checks.py's docstring (the core checks) and the messages it shows;
- ``{outbox-commands}``: each management command's usage and options, from its argparse parser;
- ``{outbox-metrics}``: each Prometheus metric of ``metrics.py``, its type, labels and help.

Where code and words disagree (a setting without a comment or a rule, an id raised but not
summarized, or summarized but never raised), the directive warns: the docs build (-W) fails.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

import django_connector_outbox

logger = logging.getLogger(__name__)
PACKAGE = Path(django_connector_outbox.__file__).resolve().parent
CHECK_ID = re.compile(r"\b(?:connector_outbox\.)?([EW]\d{3})\b")
# The options every Django command has: the commands' pages list their own.
DJANGO_OPTIONS = {
    "--version", "--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color",
    "--force-color", "--skip-checks", "--help",
}  # fmt: skip


class GeneratedMarkdown(SphinxDirective):
    """A directive whose body is Markdown made from the code, parsed as the page's own text."""

    def markdown(self) -> Iterator[str]:
        raise NotImplementedError(type(self).__name__)

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        self.state.nested_parse(StringList(list(self.markdown())), self.content_offset, container)
        return list(container.children)

    def warn(self, message: str) -> None:
        logger.warning(message, location=(self.env.docname, self.lineno))


def cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def placeholders(message: str) -> str:
    """A gettext message as a code span, its %(name)s / %(name)r placeholders shown as <name>."""
    text = cell(re.sub(r"%\((\w+)\)[srd]", r"<\1>", message).replace("%%", "%"))
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def sentence(text: str) -> str:
    """`text` as a sentence: a capital (unless it starts with a name such as django.contrib)
    and a full stop."""
    text = " ".join(text.split())
    first = text.split(" ", 1)[0]
    if first.isalpha() and first.islower():
        text = text[:1].upper() + text[1:]
    return text if text.endswith(".") else text + "."


# -- settings ------------------------------------------------------------------------------------


def defaults_source() -> tuple[dict[str, str], dict[str, str]]:
    """The defaults of conf.py as written (``7 * 24 * 3600``), and the comments beside each key
    (on its line, or the lines just above it)."""
    path = PACKAGE / "conf.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    [dictionary] = [
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and isinstance(node.value, ast.Dict)
        and "DEFAULTS" in ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
    ]
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("# ").strip()
    written: dict[str, str] = {}
    said: dict[str, str] = {}
    for key, value in zip(dictionary.keys, dictionary.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(key.value, str)
        written[key.value] = ast.get_source_segment(text, value) or ""
        above: list[str] = []
        line = key.lineno - 1
        while line in comments and not text.splitlines()[line - 1].split("#")[0].strip():
            above.insert(0, comments[line])
            line -= 1
        beside = [
            comments[n] for n in range(key.lineno, (value.end_lineno or key.lineno) + 1) if n in comments
        ]
        said[key.value] = " ".join(above + beside)
    return written, said


def is_literal(source: str) -> bool:
    try:
        ast.literal_eval(source)
    except ValueError:
        return False
    return True


def with_constants(text: str) -> str:
    """A rule's summary with conf.py's constants it names given by value: "one of STORES" is
    'one of "auto", "orm"', "MAX_DURATION" is "MAX_DURATION (315,360,000)"."""
    from django_connector_outbox import conf

    def value(match: re.Match[str]) -> str:
        name = match[0]
        constant = getattr(conf, name, None)
        if name in conf.DEFAULTS or constant is None:
            return name
        if isinstance(constant, tuple):
            return ", ".join(f'`"{item}"`' for item in constant)
        return f"`{name}` ({constant:,})" if isinstance(constant, int) else name

    return re.sub(r"\b[A-Z][A-Z_]{2,}\b", value, text)


class SettingsDirective(GeneratedMarkdown):
    def markdown(self) -> Iterator[str]:
        from django_connector_outbox.conf import DEFAULTS, RULES

        written, said = defaults_source()
        for name in DEFAULTS:
            if name == "CONNECTORS":
                continue  # the sources: a page of their own
            if not said[name]:
                self.warn(f"the setting {name} has no comment in conf.py's DEFAULTS to document it")
            rule = RULES.get(name)
            if rule is None:
                self.warn(f"the setting {name} has no rule in conf.RULES")
                continue
            summary = (rule.__doc__ or "").split("\n\n")[0]
            ids = CHECK_ID.findall(summary)
            if not ids:
                self.warn(f"the rule of {name} ({rule.__name__}) does not name its check id")
            checked = with_constants(" ".join(summary.replace("`value`", "it").split()))
            for check_id in dict.fromkeys(ids):
                checked = checked.replace(check_id, f"[{check_id}](checks.md#{check_id.lower()})", 1)
            yield from (
                f"### `{name}`",
                "",
                f"Default: `{written[name]}`"
                + ("" if is_literal(written[name]) else f" (`{DEFAULTS[name]!r}`)"),
                "",
                sentence(said[name]),
                "",
                f"Checked: {checked}",
                "",
            )


# -- system checks -------------------------------------------------------------------------------


@dataclass
class RaisedCheck:
    id: str
    modules: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)


def _gettext_strings(node: ast.AST) -> list[str]:
    """The messages of ``gettext("...")`` (and ngettext's singulars) in `node`, in order."""
    return [
        inner.args[0].value
        for inner in ast.walk(node)
        if isinstance(inner, ast.Call)
        and isinstance(inner.func, ast.Name)
        and inner.func.id in ("gettext", "ngettext", "_")
        and inner.args
        and isinstance(inner.args[0], ast.Constant)
        and isinstance(inner.args[0].value, str)
    ]


def _gettext_string(node: ast.AST) -> str | None:
    """The first message of a ``gettext("...")`` in `node`."""
    return next(iter(_gettext_strings(node)), None)


def _messages_of(call: ast.Call, function: ast.AST, helpers: dict[str, list[str]]) -> list[str]:
    """The English messages a check call shows: the gettext string of its first argument; for
    a variable (``problem % {...}``), each gettext string assigned to it in `function`; for a
    helper (``self.check_timeout("...E214")``), the helper's messages about that option."""
    if call.args and (message := _gettext_string(call.args[0])):
        return [message]
    if call.args:
        names = {n.id for n in ast.walk(call.args[0]) if isinstance(n, ast.Name)}
        assigned = [
            message
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
            and (message := _gettext_string(node.value))
        ]
        if assigned:
            return assigned
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name in helpers:
        option = next(
            (
                a.value
                for a in call.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and not CHECK_ID.fullmatch(a.value)
            ),
            None,
        )
        about = "the option" if option is None else repr(option)
        return [m.replace("%(option)r", about) for m in helpers[name]]
    return []


def raised_checks() -> dict[str, RaisedCheck]:
    """Every check id that the package's code passes to a check message or an InvalidSetting."""
    helpers: dict[str, list[str]] = {}  # check helpers of the connectors' base class: name -> messages
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(PACKAGE.rglob("*.py"))}
    for tree in trees.values():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.FunctionDef)
                and node.name.startswith("check_")
                and "check_id" in {a.arg for a in node.args.args}
            ):
                helpers[node.name] = _gettext_strings(node)
    found: dict[str, RaisedCheck] = {}
    for path, tree in trees.items():
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in [tree, *functions]:
            for node in ast.walk(function):
                if not isinstance(node, ast.Call):
                    continue
                for value in [*node.args, *(k.value for k in node.keywords if k.arg == "id")]:
                    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                        continue
                    match = CHECK_ID.fullmatch(value.value)
                    bare = value.value == (match and match[1])
                    if match is None or (bare and getattr(node.func, "id", "") != "InvalidSetting"):
                        continue
                    check = found.setdefault(match[1], RaisedCheck(match[1]))
                    check.modules.add(module)
                    for message in _messages_of(node, function, helpers):
                        if message not in check.messages:
                            check.messages.append(message)
    return found


def core_summaries() -> dict[str, str]:
    """checks.py's docstring list: ``- connector_outbox.E001  what it reports`` (and its
    continuation lines)."""
    from django_connector_outbox import checks

    summaries: dict[str, str] = {}
    current = None
    for line in (checks.__doc__ or "").splitlines():
        if match := re.match(r"- connector_outbox\.([EW]\d{3})\s+(.*)", line):
            current = match[1]
            summaries[current] = match[2]
        elif current and line.startswith("  ") and line.strip():
            summaries[current] += " " + line.strip()
        else:
            current = None
    return summaries


class ChecksDirective(GeneratedMarkdown):
    def markdown(self) -> Iterator[str]:
        raised, summaries = raised_checks(), core_summaries()
        for check_id in sorted(set(summaries) - set(raised)):
            self.warn(f"checks.py documents {check_id}, which no code raises")
        for check_id in sorted(raised):
            check = raised[check_id]
            summary = summaries.get(check_id)
            if summary is None and not check.messages:
                self.warn(
                    f"{check_id} is raised by {', '.join(sorted(check.modules))} with no message to show"
                )
            level = "Error" if check_id.startswith("E") else "Warning"
            where = ", ".join(f"`{m}`" for m in sorted(check.modules))
            yield from (
                f"### {check_id}",
                "",
                f"`connector_outbox.{check_id}`, {level.lower()}, raised by {where}.",
                "",
            )
            if summary:
                yield from (sentence(summary), "")
            if check.messages:
                yield from ("Its messages:", "")
                yield from (f"- {placeholders(m)}" for m in check.messages)
                yield ""


# -- commands ------------------------------------------------------------------------------------


def command_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    from django.core.management import load_command_class

    for path in sorted((PACKAGE / "management" / "commands").glob("[!_]*.py")):
        command = load_command_class("django_connector_outbox", path.stem)
        yield path.stem, command.create_parser("manage.py", path.stem)


def option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    # A lazy (translated) help is a proxy: argparse's % needs a str.
    action.help = str(action.help) if action.help is not None else ""
    return formatter._expand_help(action) if action.help else ""


class CommandsDirective(GeneratedMarkdown):
    def markdown(self) -> Iterator[str]:
        for name, parser in command_parsers():
            own = [a for a in parser._actions if not DJANGO_OPTIONS & set(a.option_strings)]
            usage = argparse.ArgumentParser(prog=f"python manage.py {name}", add_help=False)
            for action in own:
                usage._add_action(action)
            if not parser.description:
                self.warn(f"the command {name} has no help")
            yield from (f"### {name}", "", str(parser.description or "") + "", "", "```text")
            # argparse's usage, less its "usage: " prefix and the indent that follows it
            first, *more = usage.format_usage().rstrip().splitlines()
            yield first.removeprefix("usage: ")
            yield from (line.removeprefix(" " * len("usage: ")) for line in more)
            yield from ("```", "", "| argument | what it does |", "| --- | --- |")
            formatter = parser._get_formatter()
            for action in own:
                # As --help writes it: "--state {queued,...}", "POST_ID".
                invocation = formatter._format_action_invocation(action)
                if not action.help:
                    self.warn(f"{name} {invocation}: no help")
                yield f"| `{cell(invocation)}` | {cell(option_help(parser, action))} |"
            yield from (
                "",
                "And Django's own options of every command: `--settings`, `--pythonpath`, `--verbosity`, `--traceback`, `--no-color`, `--force-color`, `--skip-checks`.",
                "",
            )


# -- metrics -------------------------------------------------------------------------------------


class MetricsDirective(GeneratedMarkdown):
    def markdown(self) -> Iterator[str]:
        from prometheus_client.metrics import MetricWrapperBase

        from django_connector_outbox import metrics

        families: list[tuple[str, str, str, list[str]]] = []
        for value in vars(metrics).values():
            if isinstance(value, MetricWrapperBase):
                [family] = value.describe()
                suffix = {"counter": "_total", "histogram": "_bucket, _sum, _count"}.get(family.type, "")
                families.append((family.name, family.type, family.documentation, list(value._labelnames)))
                if suffix:
                    families[-1] = (f"{family.name} ({suffix})", *families[-1][1:])
        for family in metrics.OutboxCollector._families():
            families.append(
                (family.name, "gauge", family.documentation, list(getattr(family, "_labelnames", ())))
            )
        yield from ("| metric | type | labels | what it counts |", "| --- | --- | --- | --- |")
        for name, kind, documentation, labels in families:
            yield f"| `{cell(name)}` | {kind} | {', '.join(f'`{label}`' for label in labels)} | {cell(documentation)} |"
        yield ""


# -- links out of docs/ ---------------------------------------------------------------------------

REPOSITORY = "https://github.com/django-connector-outbox/django-connector-outbox/blob/main/"
LINK = re.compile(r"(\]\()([^)#\s]+)((?:#[^)\s]*)?\))")


def links_out_of_the_docs(app: Sphinx, docname: str, source: list[str]) -> None:
    """A page links a file of the repository outside docs/ by its relative path, which works on
    GitHub and in a clone. On the site, such a link goes to the page that includes the file
    (docs/RELEASING.md includes ../RELEASING.md) or, for any other file (bench/README.md), to
    the file on GitHub; a path that names no file is left alone, for MyST to report."""
    docs = Path(app.srcdir).resolve()
    page = (docs / docname).parent

    def rewrite(match: re.Match[str]) -> str:
        target = match[2]
        if "://" in target or target.startswith(("mailto:", "/")):
            return match[0]
        path = (page / target).resolve()
        if path.is_relative_to(docs) or not path.exists() or not path.is_relative_to(docs.parent):
            return match[0]
        if (docs / path.name).is_file() and path.parent == docs.parent:
            return f"{match[1]}{Path(*(['..'] * len(page.relative_to(docs).parts)), path.name).as_posix()}{match[3]}"
        return f"{match[1]}{REPOSITORY}{path.relative_to(docs.parent).as_posix()}{match[3]}"

    source[0] = LINK.sub(rewrite, source[0])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", links_out_of_the_docs)
    app.add_directive("outbox-settings", SettingsDirective)
    app.add_directive("outbox-checks", ChecksDirective)
    app.add_directive("outbox-commands", CommandsDirective)
    app.add_directive("outbox-metrics", MetricsDirective)
    return {"parallel_read_safe": True}
