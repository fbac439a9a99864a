"""What a check found: a level, a one-line message and a one-line fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Level = Literal["ok", "warn", "fail"]
LEVELS: tuple[Level, ...] = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Finding:
    check: str  # short and stable: "disk", "port 8000", "clock", "gpu GPU-1"
    level: Level
    message: str
    fix: str = ""  # empty when there is nothing to do

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ok(check: str, message: str) -> Finding:
    return Finding(check, "ok", message)


def warn(check: str, message: str, fix: str) -> Finding:
    return Finding(check, "warn", message, fix)


def fail(check: str, message: str, fix: str) -> Finding:
    return Finding(check, "fail", message, fix)


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "fail"]


def report(host: str, findings: list[Finding]) -> dict[str, Any]:
    """The ``--json`` shape: the host, whether nothing failed, and every finding."""
    return {
        "host": host,
        "ok": not failures(findings),
        "failures": len(failures(findings)),
        "warnings": sum(1 for f in findings if f.level == "warn"),
        "findings": [f.to_json() for f in findings],
    }


def plain_text(findings: list[Finding]) -> str:
    """One line per finding, with its fix: for logs and for Ansible's message."""
    lines = []
    for f in findings:
        line = f"{f.level.upper():4} {f.check}: {f.message}"
        if f.fix:
            line += f" -- fix: {f.fix}"
        lines.append(line)
    return "\n".join(lines)
