"""What an operation says (letsinfer.admission.said), printed here: at once
when it runs on this machine, or line by line from the main's answer when it
ran there for a paired controller. The same print either way."""

from __future__ import annotations

from typing import Any

from letsinfer.cli.output import console, errors


def say_here(
    text: str, *, err: bool = False, highlight: bool | None = None, soft_wrap: bool | None = None
) -> None:
    (errors if err else console).print(text, highlight=highlight, soft_wrap=soft_wrap)


def replay(lines: list[dict[str, Any]]) -> None:
    """The main's Transcript, printed as the main's CLI would have printed it."""
    for line in lines:
        say_here(
            str(line["text"]),
            err=line["to"] == "err",
            highlight=line.get("highlight"),
            soft_wrap=line.get("soft_wrap"),
        )
