"""The shell blocks of README.md, as the commands a reader types: which section and block each comes
from, its README line number, and the command text with its comments kept (they state outcomes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\s*$")
SHELLS = ("sh", "bash", "shell", "console")


@dataclass(frozen=True)
class Line:
    """One command line of a shell block (continuation lines joined)."""

    number: int  # 1-based line number in README.md
    text: str  # the command as written, comment included

    @property
    def command(self) -> str:
        """The command without its trailing ``# comment`` (quotes respected)."""
        return split_comment(self.text)[0]

    @property
    def comment(self) -> str:
        return split_comment(self.text)[1]


@dataclass(frozen=True)
class Block:
    section: str  # the ``## `` heading it is under
    first_line: int  # README line number of its opening fence
    preceding: str  # the prose between the previous block (or the heading) and this block
    lines: tuple[Line, ...]


def split_comment(text: str) -> tuple[str, str]:
    """(command, comment) of a shell line: the comment starts at the first ``#`` outside quotes that
    begins a word."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1 :].strip()
    return text.rstrip(), ""


def blocks(text: str) -> list[Block]:
    """Every shell block of a Markdown text, in order."""
    out: list[Block] = []
    section, prose, fence, body, start = "", [], None, [], 0
    for number, raw in enumerate(text.splitlines(), start=1):
        match = FENCE.match(raw)
        if fence is not None:
            if match and not match.group(1):
                if fence in SHELLS:
                    out.append(Block(section, start, "\n".join(prose).strip(), tuple(command_lines(body))))
                fence, body, prose = None, [], []
            else:
                body.append((number, raw))
        elif match:
            fence, start = match.group(1), number
        elif raw.startswith("## "):
            section, prose = raw[3:].strip(), []
        else:
            prose.append(raw)
    return out


def command_lines(body: list[tuple[int, str]]) -> list[Line]:
    """The commands of a block's lines: comment-only and blank lines dropped, ``\\`` continuations joined."""
    out: list[Line] = []
    pending: tuple[int, str] | None = None
    for number, raw in body:
        if pending is not None:
            number, raw = pending[0], pending[1] + " " + raw.strip()
            pending = None
        if raw.rstrip().endswith("\\"):
            pending = (number, raw.rstrip()[:-1].rstrip())
            continue
        if split_comment(raw)[0].strip():
            out.append(Line(number, raw.strip()))
    if pending is not None:
        out.append(Line(*pending))
    return out


def readme_blocks(path: Path = README) -> list[Block]:
    return blocks(path.read_text())
