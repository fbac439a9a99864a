"""``letsinfer model pull``: a model by repository name, from the hub or the mirror."""

from __future__ import annotations

from typing import Any

import click

from letsinfer.admission import gguf
from letsinfer.cli.model import model
from letsinfer.cli.model_add import Where, placement_options
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.output import errors
from letsinfer.cli.remote import call
from letsinfer.cli.said import say_here
from letsinfer.cli.scope import CliContext, scoped


@scoped(model, "pull", scope="main", remote="operator")
@click.argument("repo")
@click.option("--file", "file", metavar="NAME", help="The GGUF file in the repository.")
@click.option("--quant", metavar="Q", help="Pick the GGUF file by quantisation (e.g. Q4_K_M).")
@click.option(
    "--revision",
    default="main",
    show_default=True,
    help="Branch, tag or commit; recorded as the commit it resolves to.",
)
@click.option("--name", metavar="N", help="Model name (default: REPO, or REPO:QUANT).")
@click.option("--alias", "aliases", multiple=True, help="Another name clients may use.")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    metavar="ENGINE",
    help="Engine to run it: xllamacpp or llama-server (default: the node's configured one).",
)
@click.option(
    "--no-serve",
    is_flag=True,
    help="Only register it; place it later with `letsinfer model install`.",
)
@placement_options
@scale_options
@click.pass_obj
def pull(
    ctx: CliContext,
    repo: str,
    file: str | None,
    quant: str | None,
    revision: str,
    name: str | None,
    aliases: tuple[str, ...],
    engine: str | None,
    no_serve: bool,
    nodes: tuple[str, ...],
    target: str,
    gpus: int,
    **scaling: Any,
) -> None:
    """Pull a GGUF model from a Hugging Face-compatible hub ([hub] endpoint), or from
    this node's mirror when the hub is off or unreachable: resolve the revision to
    a commit, download with resume, verify the published sha256, then add and
    serve it like `model add` (where it fits: this node by default, --node to
    choose). Repo, commit and sha256 are recorded with it."""
    from letsinfer.admission.gguf import Refused
    from letsinfer.admission.pull import Pull, pull_model
    from letsinfer.cli.bundle import TerminalProgress
    from letsinfer.hub.pull import PullRequest

    if file and quant:
        raise click.UsageError("give --file or --quant, not both")
    where = Where(nodes, target, gpus)
    where.refuse_with_no_serve(no_serve)
    scale = checked_policy(scaling)
    if scale.get("min_groups") == 0:  # on demand: loaded where it fits at its first request
        where.refuse_on_demand()
        no_serve = True
    ask = Pull(
        PullRequest(repo=repo, revision=revision, file=file, quant=quant),
        name,
        aliases,
        engine,
        no_serve,
        gguf.Where(where.nodes, where.target, where.gpus),
    )
    if ctx.remote is not None:
        answer = call(
            ctx.remote,
            "POST",
            "/v1/ops/models/pull",
            {
                "repo": repo,
                "revision": revision,
                "file": file,
                "quant": quant,
                "name": name,
                "aliases": list(aliases),
                "engine": engine,
                "no_serve": no_serve,
                "nodes": list(nodes),
                "target": target,
                "gpus": gpus,
            },
            timeout=None,
            shown=TerminalProgress(errors),
        )
        pulled = answer["model"]
    else:
        assert ctx.identity is not None
        try:
            svc = pull_model(ctx.home, ctx.identity, say_here, TerminalProgress(errors), ask)
        except Refused as exc:
            raise click.ClickException(str(exc)) from exc
        pulled = svc.name if svc is not None else None
    if pulled is not None:
        said_policy(ctx, pulled, scale)
