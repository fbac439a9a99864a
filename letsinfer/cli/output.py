"""Tables for people, JSON for scripts.

To a terminal, output fits its width. To a pipe or a file, every value is
printed whole: nothing is cut with an ellipsis and no line is wrapped, so a
script can `grep` or `cut` a name it will pass back to the CLI.

JSON is data only (no display text): one object for one thing, a list of
objects for a listing, each kind with one schema (docs/json.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from rich.console import Console

# Wide enough that rich never cuts or wraps anything written to a pipe.
_UNBOUNDED = 100_000


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=_UNBOUNDED, soft_wrap=True)


class _FirstUse:
    """A console made when first used: a call that prints only JSON never
    imports rich (about 30 ms of every such CLI call)."""

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._made: Console | None = None

    def _console(self) -> Console:
        if self._made is None:
            self._made = _console(self._stderr)
        return self._made

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console(), name)

    # rich's Live and Progress hold the console as a context manager, and a
    # `with` looks these up on the class, never through __getattr__.
    def __enter__(self) -> Console:
        return self._console().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._console().__exit__(*exc)  # type: ignore[arg-type]


console = cast("Console", _FirstUse(stderr=False))
errors = cast("Console", _FirstUse(stderr=True))


def brief(text: str, n: int) -> str:
    """The first ``n`` characters and an ellipsis on a terminal; the whole of
    ``text`` anywhere else (a script gets values it can use)."""
    if not sys.stdout.isatty() or len(text) <= n:
        return text
    return text[:n] + "…"


def emit_object(value: dict[str, Any]) -> None:
    json.dump(value, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def emit(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    *,
    as_json: bool,
    title: str | None = None,
) -> None:
    if as_json:
        json.dump(list(rows), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return
    if not rows:
        console.print(f"[dim]no {title or 'entries'}[/dim]")
        return
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)
