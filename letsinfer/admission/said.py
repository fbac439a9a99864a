"""What an operation says as it goes: printed at once by the CLI on the main,
kept in order by the admin API and printed again by a paired controller, with
the same markup and the same print options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol


class Say(Protocol):
    def __call__(
        self,
        text: str,
        *,
        err: bool = False,
        highlight: bool | None = None,
        soft_wrap: bool | None = None,
    ) -> None:
        """One line (rich markup): on stdout, or stderr with ``err``."""


@dataclass(frozen=True)
class Line:
    to: Literal["out", "err"]
    text: str
    highlight: bool | None = None
    soft_wrap: bool | None = None


@dataclass
class Transcript:
    """A Say that keeps every line, for an answer to carry; ``heard`` is told
    each one as it is said (a controller shown them as they happen)."""

    lines: list[Line] = field(default_factory=list)
    heard: Callable[[Line], None] | None = None

    def __call__(
        self,
        text: str,
        *,
        err: bool = False,
        highlight: bool | None = None,
        soft_wrap: bool | None = None,
    ) -> None:
        line = Line("err" if err else "out", text, highlight, soft_wrap)
        self.lines.append(line)
        if self.heard is not None:
            self.heard(line)

    def unheard(self) -> Transcript:
        """The same lines, kept without telling ``heard``: for what a
        controller is shown its own way (a step's progress)."""
        return Transcript(self.lines)

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(line) for line in self.lines]


class SaidProgress:
    """Download progress as the CLI shows it off a terminal: each step named
    once, on stderr (no bars: an answer comes back whole)."""

    def __init__(self, say: Say) -> None:
        self.say = say

    def start(self, description: str, total: int | None) -> None:
        self.say(f"{description} …", err=True)

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
