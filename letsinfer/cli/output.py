"""Tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
errors = Console(stderr=True)


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
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    console.print(table)
