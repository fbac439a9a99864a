"""The CLI's consoles (letsinfer/cli/output.py) are made at their first use;
rich's live displays must work on them as on a Console, on a terminal too."""

from __future__ import annotations

import io

import pytest
from rich.live import Live
from rich.progress import Progress

from letsinfer.cli import output


@pytest.mark.parametrize("terminal", [False, True])
def test_live_displays_and_progress_bars_run_on_the_cli_s_consoles(
    terminal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(out, "isatty", lambda: terminal)
    monkeypatch.setattr(err, "isatty", lambda: terminal)
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    console, errors = output._FirstUse(stderr=False), output._FirstUse(stderr=True)
    with Live("working", console=console, auto_refresh=False) as live:  # type: ignore[arg-type]
        live.update("done", refresh=True)
    console.print("after the live display")
    with Progress(console=errors) as bar:  # type: ignore[arg-type]
        task = bar.add_task("copying", total=2)
        bar.advance(task, 2)
    assert "after the live display" in out.getvalue()
    assert "copying" in err.getvalue()
