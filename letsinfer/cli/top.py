"""``letsinfer top``: nodes, GPUs, placement groups, requests and tokens per
second, refreshed in the terminal from the main's own metrics endpoint."""

from __future__ import annotations

import time

import click
import httpx

from letsinfer import config
from letsinfer.cli import cli
from letsinfer.cli.output import console
from letsinfer.cli.scope import CliContext, scoped


def _metrics_url(ctx: CliContext) -> str:
    gw = config.load(ctx.home.config_file).gateway
    if gw.metrics_port == 0:
        raise click.ClickException(
            "metrics are off ([gateway] metrics_port = 0); top reads them: set a port"
        )
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
        gw.metrics_host, gw.metrics_host
    )
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{gw.metrics_port}/metrics"


@scoped(cli, "top", scope="main")
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

    from letsinfer.telemetry.top import render, scrape

    url = _metrics_url(ctx)
    try:
        prev = scrape(url)
        if once:
            time.sleep(interval)
            console.print(render(prev, scrape(url)))
            return
        if not console.is_terminal:
            # Not a terminal (a pipe, a file): no live redraw to write into;
            # one whole view per interval, one after another, as `top -b` does.
            while True:
                time.sleep(interval)
                cur = scrape(url)
                console.print(render(prev, cur))
                console.file.flush()
                prev = cur
        with Live(render(None, prev), console=console, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                cur = scrape(url)
                live.update(render(prev, cur), refresh=True)
                prev = cur
    except httpx.HTTPError as exc:
        raise click.ClickException(
            f"cannot read the metrics at {url}: {exc} (is the main node running here?)"
        ) from exc
    except KeyboardInterrupt:
        return
