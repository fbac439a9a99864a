"""One CLI, local or remote: the main a command acts on.

A workstation pairs with one or more mains (`letsinfer controller pair
--name NAME`); `letsinfer controller use NAME`, ``--controller NAME`` or
``LETSINFER_CONTROLLER`` selects one (in that order of precedence: option,
environment, `use`). With one selected, a command that has an operation in
the main's admin API runs there over mutual TLS, with the output and exit
code it has on the main; a command scoped to the main without one is refused
here, and so is one the controller's role does not allow (the main still
records that refusal in its audit chain).

Light to import (every scoped command looks here): HTTP and TLS load only
when a command goes to a main.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from letsinfer.home import Home

if TYPE_CHECKING:
    from letsinfer.bundle.progress import Progress

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
DEFAULT = "default"  # a pairing made without --name (its files at the top)


@dataclass(frozen=True)
class Pairing:
    """One paired main: its files on this workstation and what pairing said."""

    name: str
    root: Path

    @property
    def key(self) -> Path:
        return self.root / "controller.key"

    @property
    def cert(self) -> Path:
        return self.root / "controller.crt"

    @property
    def ca(self) -> Path:
        return self.root / "ca.crt"

    @property
    def meta(self) -> Path:
        return self.root / "controller.json"

    def said(self) -> dict[str, Any]:
        return json.loads(self.meta.read_text())  # type: ignore[no-any-return]

    @property
    def main(self) -> str:
        return str(self.said()["main"])

    @property
    def role(self) -> str:
        return str(self.said()["role"])


def pairing_named(home: Home, name: str) -> Pairing:
    """Where pairing NAME's files are (or go): the unnamed pairing's at the
    top of the controller directory, as before names existed."""
    if name == DEFAULT:
        return Pairing(name, home.controller_dir)
    if not NAME.match(name):
        raise click.BadParameter(
            f"{name!r}: a name is letters, digits, '.', '_' and '-' (at most 63)"
        )
    return Pairing(name, home.controller_dir / "mains" / name)


def pairings(home: Home) -> list[Pairing]:
    """Every main this workstation is paired with."""
    found = [pairing_named(home, DEFAULT)]
    mains = home.controller_dir / "mains"
    if mains.is_dir():
        found += [Pairing(p.name, p) for p in sorted(mains.iterdir()) if NAME.match(p.name)]
    return [p for p in found if p.meta.is_file()]


def use_file(home: Home) -> Path:
    return home.controller_dir / "use"


def selected_name(home: Home, given: str | None) -> str | None:
    """``given`` (option or environment), else what `controller use` chose."""
    if given:
        return given
    try:
        return use_file(home).read_text().strip() or None
    except OSError:
        return None


def selected(home: Home, given: str | None) -> Pairing | None:
    name = selected_name(home, given)
    if name is None:
        return None
    pairing = pairing_named(home, name)
    if not pairing.meta.is_file():
        raise click.ClickException(
            f"no main paired as {name!r} on this workstation (`letsinfer controller list`; "
            "`letsinfer controller use --clear` to act locally)"
        )
    return pairing


class RoleRefused(click.ClickException):
    """The controller's role lacks what a command needs: refused here."""


def admit(pairing: Pairing, command: str, needs: str | None) -> None:
    """Refuse ``command`` unless the admin API has its operation and this
    controller's role allows it. A role refusal sends the main only a notice
    (the command and the role it needs, no operation), which it audits."""
    if needs == "shell":  # letsinfer.cli.scope.SHELL_ONLY
        raise NoRemoteOperation(
            f"`{command}` runs only from a shell on the main, never from a controller: a "
            "shell on the main is what makes an administrator of people and projects. "
            f"Nothing was sent to the main {pairing.name} ({pairing.main}); run it there."
        )
    if needs is None:
        raise NoRemoteOperation(
            f"`{command}` has no operation in the admin API yet, so it cannot run on "
            f"the main {pairing.name} ({pairing.main}) from here; nothing was sent. Run it "
            "on the main itself, or without a selected controller "
            "(`letsinfer controller use --clear`, no --controller, no LETSINFER_CONTROLLER)."
        )
    from letsinfer.authority.controllers import allows

    if allows(pairing.role, needs):
        return
    try:
        call(pairing, "POST", "/v1/ops/denied", {"command": command, "needs": needs})
        noted = "the main recorded the refusal in its audit chain"
    except click.ClickException as exc:
        noted = f"the main could not be told ({exc.message})"
    raise RoleRefused(
        f"this operation needs the {needs} role; this controller ({pairing.name}) is "
        f"{pairing.role}. `{command}` was not sent; {noted}."
    )


class NoRemoteOperation(click.ClickException):
    exit_code = 3  # as a command refused for its scope (letsinfer.cli.scope)


def main_only(pairing: Pairing, command: str, why: str) -> NoRemoteOperation:
    """The refusal of a form of a command the admin API has (``command``:
    `node add --ssh`) that runs only on the main's own machine: the main is
    sent a notice, which it audits as denied, and nothing else."""
    try:
        call(pairing, "POST", "/v1/ops/denied", {"command": command, "needs": "main"})
        noted = "the main recorded the refusal in its audit chain"
    except click.ClickException as exc:
        noted = f"the main could not be told ({exc.message})"
    return NoRemoteOperation(
        f"`{command}` runs only on the main itself, never from a controller: {why}. "
        f"Only a notice was sent to the main {pairing.name} ({pairing.main}) and {noted}; "
        "run it there."
    )


def call(
    pairing: Pairing,
    method: str,
    path: str,
    body: Any = None,
    timeout: float | None = 60,
    shown: Progress | None = None,
) -> Any:
    """The main's answer over mutual TLS, or ClickException with its message.
    With ``shown``, a long operation's answer streamed: what it says printed
    as it is said and its steps' progress on ``shown``, as on the main (the
    answer's ``said`` is printed by then, even from a main that answers
    only whole)."""
    import ssl

    import httpx

    from letsinfer.trust.peer import client_context

    main = pairing.main
    try:
        tls = client_context(pairing.ca, pairing.cert, pairing.key)
    except (OSError, ssl.SSLError) as exc:
        raise click.ClickException(
            f"cannot use controller {pairing.name}'s key and certificate in {pairing.root}: "
            f"{exc}; pair again (`letsinfer controller pair --name {pairing.name}`)"
        ) from exc
    url, printed = f"https://{main}{path}", False
    try:
        if shown is None:
            resp = httpx.request(method, url, json=body, verify=tls, timeout=timeout)
            status, data, text = resp.status_code, _answer_of(resp), resp.text
        else:
            with httpx.stream(
                method, url, json=body, verify=tls, timeout=timeout, headers={"accept": STREAM}
            ) as resp:
                printed = resp.headers.get("content-type", "").startswith(STREAM)
                if printed:
                    status, data = _streamed(resp.iter_lines(), shown, main)
                    text = json.dumps(data)
                else:  # refused before it began (or a main without the stream)
                    resp.read()
                    status, data, text = resp.status_code, _answer_of(resp), resp.text
    except (httpx.HTTPError, ssl.SSLError) as exc:
        if printed:
            raise click.ClickException(
                f"the connection to the main at {main} broke before its answer ({exc}); "
                "what it was doing goes on there"
            ) from exc
        raise click.ClickException(
            f"the main at {main} refused the connection ({exc}); is this controller still paired?"
        ) from exc
    if status != 200:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        message = err.get("message") if isinstance(err, dict) else None
        said = err.get("said") if isinstance(err, dict) else None
        if isinstance(said, list) and not printed:  # said before it was refused
            from letsinfer.cli.said import replay

            replay(said)
        param = err.get("param") if isinstance(err, dict) else None
        if isinstance(param, str):  # a value the CLI on the main refuses as bad (exit 2)
            raise click.BadParameter(str(message), param_hint=param)
        raise click.ClickException(str(message or text))
    if shown is not None and not printed and isinstance(data, dict):
        from letsinfer.cli.said import replay

        replay(data.get("said") or [])
    return data


STREAM = "application/x-ndjson"  # letsinfer.control.ops.streamed


def _answer_of(resp: Any) -> Any:
    try:
        return resp.json()
    except ValueError:
        return {"error": {"message": resp.text}}


def _streamed(lines: Iterator[str], shown: Progress, main: str) -> tuple[int, Any]:
    """The status and body of the answer that ends the events, each event
    shown as it comes."""
    from letsinfer.cli.said import replay

    try:
        for text in lines:
            if not text.strip():
                continue
            event = json.loads(text)
            kind = event.get("event")
            if kind == "said":
                replay([event["line"]])
            elif kind == "start":
                shown.start(str(event["description"]), event.get("total"))
            elif kind == "advance":
                shown.advance(int(event["amount"]))
            elif kind == "finish":
                shown.finish()
            elif kind == "answer":
                return int(event["status"]), event["body"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise click.ClickException(
            f"the main at {main} sent an event this CLI cannot read ({exc!r}); "
            "what it was doing goes on there"
        ) from exc
    finally:
        shown.finish()
    raise click.ClickException(
        f"the main at {main} ended its answer early; what it was doing goes on there"
    )


def ask_main(ctx: Any, method: str, path: str, json: Any = None, timeout: float | None = 60) -> Any:
    """The main's answer: over mutual TLS when this command runs from a
    controller (``ctx.remote``), else the local node's (its admin socket;
    None when no node runs here)."""
    if ctx.remote is not None:
        return call(ctx.remote, method, path, json, timeout)
    from letsinfer.cli.local import ask_node

    return ask_node(ctx.home, method, path, json=json, timeout=timeout)
