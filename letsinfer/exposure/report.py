"""`exposure status`: what is published, to whom, the certificate and the
running node's TLS port, as one object. The same for the CLI on the main and
for a controller (the admin API), so both print the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from letsinfer.exposure import settings as stored
from letsinfer.exposure.certificate import CertificateRefused, check_pair
from letsinfer.exposure.settings import Exposure
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity


def ca_file(home: Home, identity: NodeIdentity) -> Path:
    assert identity.cluster is not None
    return home.cluster_dir(identity.cluster) / "ca.crt"


def described(exposure: Exposure) -> dict[str, Any]:
    """The served certificate's subject, names and expiry, or why it is refused."""
    try:
        cert: dict[str, Any] = check_pair(Path(exposure.cert), Path(exposure.key)).to_json()
    except CertificateRefused as exc:
        cert = {"error": str(exc)}
    return cert


def exposure_report(
    home: Home, identity: NodeIdentity | None, node: dict[str, Any] | None
) -> dict[str, Any]:
    """``node``: the running node's exposure state (None: no node runs).
    ExposureSettingsError: ``<etc>/exposure.json`` cannot be read."""
    current = stored.load(home)
    if current is None:
        return {"published": False, "node": node}
    report: dict[str, Any] = {
        "published": True,
        "url": f"https://{current.host}:{current.port}/v1",
        "port": current.port,
        "sources": list(current.sources),
        "plain": current.plain,
        "certificate_file": current.cert,
        "key_file": current.key,
        "cluster_ca": current.cluster_ca,
        "certificate": described(current),
        "node": node,
    }
    if current.cluster_ca and identity is not None:
        report["ca_file"] = str(ca_file(home, identity))
    return report
