"""A child's work before a move: what the main holds for it and what its agent
runs now. Said by the agent's admin socket to the CLI on the child (the main's
part comes from ``GET /v1/agent/work``); see authority/adoption.py for the rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildWork:
    """A child's work as far as it can tell: the main's answer (or why there
    is none) and the engines its agent runs now (None: no agent runs)."""

    main: list[dict[str, Any]] | None
    main_error: str | None
    engines: list[dict[str, Any]] | None

    def blockers(self) -> list[str]:
        found = []
        if self.main:
            names = ", ".join(f"{g['id']} ({g['model']})" for g in self.main)
            found.append(
                f"active placement groups on this node: {names} (the main holds them; "
                "stop or move them there first)"
            )
        held = {g["id"] for g in self.main or []}
        running = [e for e in self.engines or [] if e["pg_id"] not in held]
        if running:
            names = ", ".join(f"{e['pg_id']} ({e['state']})" for e in running)
            found.append(f"engines running here: {names} (wait for them to stop)")
        return found

    def note(self) -> str | None:
        """Said with a move that went ahead without the main's word."""
        if self.main_error is None:
            return None
        live = (
            "no agent runs here, so no engine runs"
            if self.engines is None
            else "its agent runs no engine"
        )
        return f"the main could not be asked ({self.main_error}); {live}"

    def to_json(self) -> dict[str, Any]:
        return {"main": self.main, "main_error": self.main_error, "engines": self.engines}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChildWork:
        return cls(data.get("main"), data.get("main_error"), data.get("engines"))
