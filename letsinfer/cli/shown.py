"""The scene a display command derives every state from (letsinfer.authority.
states): the authority as stored, whether this home's node runs, and which
groups that node is draining right now (only it knows)."""

from __future__ import annotations

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
    from letsinfer import config

    running = node_runs_here(ctx.home)
    draining: list[str] = []
    if running:
        answer = ask_node(ctx.home, "GET", "/v1/local/draining", timeout=10)
        draining = list((answer or {}).get("draining", []))
    settings = config.load(ctx.home.config_file)
    return Scene.read(
        store,
        main_running=running,
        draining=draining,
        stale_after_s=settings.control.node_stale_after_s,
    )
