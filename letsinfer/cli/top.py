"""``letsinfer top``: nodes, GPUs, placement groups, requests and tokens per
second, refreshed in the terminal from the main's own metrics endpoint (from
a paired controller: the same text, read by the main and passed on by its
admin API)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from letsinfer import config
from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped

if TYPE_CHECKING:
    from letsinfer.telemetry.top import Scrape


def _sampler(ctx: CliContext) -> Callable[[], Scrape]:
    """One sample of the main's metrics each call (ClickException: none to read)."""
    from letsinfer.telemetry.top import MetricsUnread, metrics_text, metrics_url, scrape

    if ctx.remote is not None:
        from letsinfer.cli.remote import call

        return lambda: scrape(str(call(ctx.remote, "GET", "/v1/ops/metrics")["text"]))
    gw = config.load(ctx.home.config_file).gateway

    def sample() -> Scrape:
        try:
            return scrape(metrics_text(gw))
        except MetricsUnread as exc:
            raise click.ClickException(str(exc)) from None

    try:
        metrics_url(gw)  # metrics off: said before the first sample
    except MetricsUnread as exc:
        raise click.ClickException(str(exc)) from None
    return sample


@scoped(cli, "top", scope="main", remote="viewer")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes (and between the two samples of --once).",
)
@click.option("--once", is_flag=True, help="Print one view (two samples apart) and exit.")
@click.pass_obj
def top(ctx: CliContext, interval: float, once: bool) -> None:
    """A live view of the cluster: models (ready groups, queue, requests and
    tokens per second), placement groups, nodes and GPUs, from the main's
    metrics endpoint (the same numbers Prometheus scrapes). Ctrl-C to leave.
    When the output is not a terminal, it prints one view per interval."""
    from rich.live import Live

    from letsinfer.telemetry.top import render

    sample = _sampler(ctx)
    try:
        prev = sample()
        if once:
            time.sleep(interval)
            console.print(render(prev, sample()))
            return
        if not console.is_terminal:
            # Not a terminal (a pipe, a file): no live redraw to write into;
            # one whole view per interval, one after another, as `top -b` does.
            while True:
                time.sleep(interval)
                cur = sample()
                console.print(render(prev, cur))
                console.file.flush()
                prev = cur
        with Live(render(None, prev), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                cur = sample()
                live.update(render(prev, cur), refresh=True)
                prev = cur
    except KeyboardInterrupt:
        return
