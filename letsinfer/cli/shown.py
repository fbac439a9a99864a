"""The scene a display command derives every state from (letsinfer.authority.
states): the authority as stored, whether this home's node runs, and which
groups that node is draining right now (only it knows)."""

from __future__ import annotations

import click

from letsinfer.authority.states import Scene
from letsinfer.cli.local import ask_node, node_runs_here
from letsinfer.cli.scope import CliContext
from letsinfer.home import Home
from letsinfer.store import AuthorityStore


def read_store(home: Home) -> AuthorityStore:
    """The authority for a display: opened without its audit anchor, since a
    display appends nothing (and so loads no signing code)."""
    return AuthorityStore(home.database)


def read_scene(ctx: CliContext, store: AuthorityStore) -> Scene:
    """The running node's word where it runs (it holds its settings already);
    the home's settings otherwise."""
    running = node_runs_here(ctx.home)
    answer = None
    if running:
        try:
            answer = ask_node(ctx.home, "GET", "/v1/local/scene", timeout=10)
        except click.ClickException:  # a node of an older release (mid-upgrade)
            answer = None
    if answer is not None:
        draining, stale_after_s = answer["draining"], float(answer["stale_after_s"])
    else:
        from letsinfer import config

        draining = []
        stale_after_s = config.load(ctx.home.config_file).control.node_stale_after_s
    return Scene.read(store, main_running=running, draining=draining, stale_after_s=stale_after_s)
