"""How long steps report progress, without tying the bundle code to a terminal."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, description: str, total: int | None) -> None:
        """Begin a step; ``total`` in bytes, or None when unknown (a spinner)."""

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None: ...


class Silent:
    def start(self, description: str, total: int | None) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass
