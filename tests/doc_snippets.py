"""The Python snippets of the docs that save or load a block (``.save(`` / ``.load(``): the ones a
user pastes to set the project up, which must reach the project's API as written.

A snippet that cannot run in the tests (a real S3 server, TLS files) is marked on the line right
before its fence with ``<!-- snippet: skip (reason) -->``; a mark without a reason is an error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/platform.md")
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\b(.*?)-->\s*$")
REASON = re.compile(r"^\s*\((.*\S.*)\)\s*$")
BLOCK_CALL = re.compile(r"\.(save|load)\(")
SAVED_NAME = re.compile(r"""\.save\(\s*["']([a-z0-9-]+)["']""")


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    def saved_names(self) -> list[str]:
        return SAVED_NAME.findall(self.code)


def snippets(text: str, path: str = "<text>") -> list[Snippet]:
    """Every ```python block of ``text`` that saves or loads a block, with its skip mark."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, body = i, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            code = "\n".join(body) + "\n"
            mark = SKIP.match(lines[start - 1].strip()) if start else None
            reason = None
            if mark:
                found = REASON.match(mark.group(1))
                if not found:
                    raise ValueError(f"{path}:{start}: `<!-- snippet: skip -->` needs a reason: "
                                     f"<!-- snippet: skip (why it cannot run in the tests) -->")
                reason = found.group(1)
            if BLOCK_CALL.search(code):
                out.append(Snippet(path, start + 1, code, reason))
        i += 1
    return out


def doc_snippets() -> list[Snippet]:
    return [s for doc in DOCS for s in snippets((REPO / doc).read_text(), doc)]
