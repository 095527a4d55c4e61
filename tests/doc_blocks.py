"""The fenced Python blocks of a Markdown file, with the docs-test marker before each.

Plain text work, no Django: tests/test_docs_examples.py runs the blocks, tests/test_quickstart.py
(and .ci/try_the_wheel.py through it) reads the README's quickstart from them.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<mode>[\w-]+)\s*(?::\s*(?P<why>.*?))?\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    code: str
    mode: str  # "" (run) or a marker's mode
    why: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), len(lines))
        if opening["info"].lower() in LANGUAGES:
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            marker = MARKER.fullmatch(before)
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            found.append(
                Block(path, i + 1, code, marker["mode"] if marker else "", (marker and marker["why"]) or "")
            )
        i = end + 1
    return found
