"""`exposure enable` and `disable`: what the CLI on the main and a
controller's admin operation both do, and the words both print.

Enabling checks everything (options, sources, ports, the certificate) before
anything changes, then writes the certificate (if the cluster CA issues it or
a controller sent it) and ``<etc>/exposure.json``; the caller has the running
node apply it and, if the node cannot, puts the previous settings back
(`restore`). Three kinds of certificate:

- ``--cluster-ca --san ...``: issued into ``<etc>/exposure/server.{crt,key}``;
- ``--cert FILE --key FILE`` on the main: the operator's files, served in
  place (a renewed file is picked up without a restart);
- ``--cert FILE --key FILE`` from a controller: the workstation's files'
  text (`SentPair`), checked on the main and stored where the cluster CA's
  go; a renewal is `exposure enable` sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer import config
from letsinfer.exposure import settings as stored
from letsinfer.exposure.certificate import (
    CertificateRefused,
    ServedCert,
    check_pair,
    cluster_files,
    issue_from_cluster_ca,
    store_sent_pair,
)
from letsinfer.exposure.report import ca_file
from letsinfer.exposure.settings import Exposure, ExposureSettingsError
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity


class PublishRefused(Exception):
    """Nothing changed; the message says why (``status``: for the admin API)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class OwnFiles:
    """The operator's certificate and key files on the main, served in place."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class SentPair:
    """A certificate and key a controller read from its workstation's files
    (named in refusals as the workstation named them)."""

    cert_pem: bytes
    key_pem: bytes
    cert_name: str
    key_name: str


@dataclass(frozen=True)
class Wanted:
    """What `exposure enable` was asked, but the certificate."""

    port: int
    sources: tuple[str, ...]
    address: str
    plain: str
    sans: tuple[str, ...] = ()


@dataclass(frozen=True)
class Staged:
    """Written, not applied yet."""

    exposure: Exposure
    previous: Exposure | None
    served: ServedCert


def check_choice(cluster_ca: bool, has_cert: bool, has_key: bool, has_sans: bool) -> None:
    """Either --cert and --key, or --cluster-ca (with --san)."""
    if cluster_ca == (has_cert or has_key) or (not cluster_ca and not (has_cert and has_key)):
        raise PublishRefused(
            "give either --cert FILE and --key FILE, or --cluster-ca with --san NAME_OR_ADDRESS"
        )
    if has_sans and not cluster_ca:
        raise PublishRefused("--san goes with --cluster-ca (your own certificate names itself)")


def _refuse_ports(home: Home, port: int) -> None:
    settings = config.load(home.config_file)
    taken = {
        settings.gateway.port: "the plain gateway",
        settings.control.port: "the control plane",
        settings.agent.api_port: "the agent plane",
        settings.gateway.metrics_port: "metrics",
    }
    if port in taken:
        raise PublishRefused(
            f"--port {port} is {taken[port]}'s port: choose another (e.g. 443). Nothing changed.",
            409,
        )


def stage(
    home: Home,
    identity: NodeIdentity,
    wanted: Wanted,
    pair: OwnFiles | SentPair | None,
) -> Staged:
    """Check, then write the certificate (``pair`` None: the cluster CA
    issues one for ``wanted.sans``) and the exposure file. PublishRefused:
    nothing changed."""
    check_choice(pair is None, pair is not None, pair is not None, bool(wanted.sans))
    try:
        nets = stored.parse_sources(wanted.sources)
        previous = stored.load(home)
    except ExposureSettingsError as exc:
        raise PublishRefused(f"{exc}. Nothing changed.") from exc
    _refuse_ports(home, wanted.port)

    def settle(*paths: Path) -> None:
        stored.owned_like_home(home, *paths)

    try:
        if pair is None:
            cert, key = cluster_files(home)
            served = issue_from_cluster_ca(
                home.ca_key, ca_file(home, identity), wanted.sans, cert, key, settle=settle
            )
        elif isinstance(pair, SentPair):
            cert, key = cluster_files(home)
            served = store_sent_pair(
                pair.cert_pem, pair.key_pem, pair.cert_name, pair.key_name, cert, key, settle
            )
        else:
            cert, key = pair.cert.absolute(), pair.key.absolute()
            served = check_pair(cert, key)
    except CertificateRefused as exc:
        raise PublishRefused(f"{exc}. Nothing changed.") from exc
    exposure = Exposure(
        port=wanted.port,
        cert=str(cert),
        key=str(key),
        sources=nets,
        host=wanted.address,
        cluster_ca=pair is None,
        sans=wanted.sans,
        plain=wanted.plain,
    )
    stored.save(home, exposure)
    return Staged(exposure, previous, served)


def restore(home: Home, previous: Exposure | None) -> None:
    """The running node could not serve what was staged: the settings before."""
    if previous is None:
        stored.remove(home)
    else:
        stored.save(home, previous)


def firewall_vars(exposure: Exposure | None) -> str:
    port = exposure.port if exposure else 0
    sources = list(exposure.sources) if exposure else []
    return (
        f"set firewall_exposure_port: {port} and firewall_exposure_sources: {sources} for the "
        "main, then `letsinfer fleet apply firewall -i INVENTORY` (docs/exposure.md)"
    )


def audit_detail(staged: Staged) -> str:
    exposure = staged.exposure
    whose = "issued by the cluster CA" if exposure.cluster_ca else f"from {exposure.cert}"
    return (
        f"to {', '.join(exposure.sources)}; certificate sha256:{staged.served.fingerprint} "
        f"{whose}; plain {exposure.plain}"
    )


def enabled(
    home: Home, identity: NodeIdentity, staged: Staged, node_serving: bool
) -> dict[str, Any]:
    """What `exposure enable` says (the admin API's answer)."""
    exposure, previous, cert = staged.exposure, staged.previous, staged.served
    return {
        "url": f"https://{exposure.host}:{exposure.port}/v1",
        "sources": list(exposure.sources),
        "certificate": cert.to_json(),
        "ca_file": str(ca_file(home, identity)) if exposure.cluster_ca else None,
        "node_serving": node_serving,
        "plain": exposure.plain,
        "plain_changes": exposure.plain == "off"
        or (previous is not None and previous.plain != exposure.plain),
        "firewall": firewall_vars(exposure),
    }


def enabled_lines(said: dict[str, Any]) -> list[str]:
    cert = said["certificate"]
    lines = [
        f"published: {said['url']} (and /health) to {', '.join(said['sources'])}",
        f"  subject   {cert['subject']}",
        f"  names     {', '.join(cert['sans']) or '(none: clients check the subject)'}",
        f"  expires   {_minutes(cert['not_after'])} UTC",
    ]
    if said["ca_file"]:
        lines.append(f"  trust     clients trust the cluster CA: {said['ca_file']}")
    lines.append(
        "  node      serving now"
        if said["node_serving"]
        else "  node      not running: published at its next start"
    )
    if said["plain_changes"]:
        lines.append(
            f"  plain     {said['plain']}: takes effect at the next start "
            "(letsinfer service restart)"
        )
    lines.append(f"  firewall  the firewall role opens only this port: {said['firewall']}")
    return lines


def _minutes(iso: str) -> str:
    """``2027-01-01T00:00:00+00:00`` as ``2027-01-01 00:00``."""
    return iso[:16].replace("T", " ")


def unpublish(home: Home) -> tuple[bool, Exposure | None]:
    """Forget the exposure: whether there was one, and what it was (None
    also for a damaged file, which goes all the same)."""
    try:
        previous = stored.load(home)
    except ExposureSettingsError:
        previous = None
    return stored.remove(home), previous


def disabled(closed: bool, previous: Exposure | None, node_running: bool) -> dict[str, Any]:
    """What `exposure disable` says (the admin API's answer)."""
    return {
        "closed": closed,
        "node_running": node_running,
        "plain_returns": previous is not None and previous.plain == "off",
        "firewall": firewall_vars(None),
    }


def disabled_lines(said: dict[str, Any]) -> list[str]:
    if not said["closed"]:
        return ["not published: nothing to close"]
    lines = [
        "closed: the inference plane serves the LAN only"
        + ("" if said["node_running"] else " (node not running)")
    ]
    if said["plain_returns"]:
        lines.append(
            "  plain     the LAN listener returns at the next start (letsinfer service restart)"
        )
    lines.append(f"  firewall  close the port with the firewall role: {said['firewall']}")
    return lines
