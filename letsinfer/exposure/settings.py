"""What this main publishes, persisted next to its config (``<etc>/exposure.json``).

No file: nothing is published and the plain listener serves the LAN as
configured. The CLI writes the file whole (atomically) only after the
certificate and key passed every check; the running node reads it when the
CLI asks it to apply (the admin socket) and at every start.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from letsinfer.home import Home

PLAIN_CHOICES = ("lan", "off")
ANYWHERE = ("0.0.0.0/0", "::/0")


class ExposureSettingsError(Exception):
    """The exposure file or an option is not acceptable; the message says why."""


@dataclass(frozen=True)
class Exposure:
    port: int
    cert: str  # absolute paths: the node reads them again on every change on disk
    key: str
    sources: tuple[str, ...] = ANYWHERE  # CIDR networks that may connect
    host: str = "0.0.0.0"
    cluster_ca: bool = False  # the cluster CA issued the certificate (`--cluster-ca`)
    sans: tuple[str, ...] = field(default=())  # what it was issued for, with --cluster-ca
    plain: str = "lan"  # the plain HTTP listener: the LAN (as configured) or loopback only

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["sources"] = list(self.sources)
        data["sans"] = list(self.sans)
        return data


def exposure_file(home: Home) -> Path:
    return home.etc / "exposure.json"


def parse_sources(values: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """CIDR networks (an address alone is one host), normalised; none: anywhere."""
    if not values:
        return ANYWHERE
    nets: list[str] = []
    for value in values:
        try:
            net = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise ExposureSettingsError(
                f"--from {value!r} is not an address or CIDR network (e.g. 203.0.113.0/24)"
            ) from None
        if str(net) not in nets:
            nets.append(str(net))
    return tuple(nets)


def load(home: Home) -> Exposure | None:
    """The published exposure, or None. A damaged file is an error, not silence."""
    path = exposure_file(home)
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        exposure = Exposure(
            port=int(data["port"]),
            cert=str(data["cert"]),
            key=str(data["key"]),
            sources=parse_sources(data.get("sources") or []),
            host=str(data.get("host", "0.0.0.0")),
            cluster_ca=bool(data.get("cluster_ca", False)),
            sans=tuple(str(s) for s in data.get("sans") or ()),
            plain=str(data.get("plain", "lan")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ExposureSettingsError(
            f"{path} is damaged ({exc}): run `letsinfer exposure enable` again or `disable`"
        ) from exc
    if exposure.plain not in PLAIN_CHOICES or not 1 <= exposure.port <= 65535:
        raise ExposureSettingsError(f"{path} is damaged (port or plain out of range)")
    return exposure


def owned_like_home(home: Home, *paths: Path) -> None:
    """Files root writes for the node (which runs as the home's owner) become
    the node's, or it could not read them."""
    if os.geteuid() != 0:
        return
    st = home.etc.stat()
    for path in paths:
        os.chown(path, st.st_uid, st.st_gid)


def save(home: Home, exposure: Exposure) -> None:
    path = exposure_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".exposure.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w") as fh:
        json.dump(exposure.to_json(), fh, indent=2)
        fh.write("\n")
    owned_like_home(home, tmp)
    tmp.replace(path)


def remove(home: Home) -> bool:
    """Forget the exposure; True if there was one."""
    try:
        exposure_file(home).unlink()
    except FileNotFoundError:
        return False
    return True


def plain_host(home: Home) -> str | None:
    """The plain listener's address the exposure asks for (`--plain off`:
    loopback only), or None to keep the configured one. Read at start."""
    try:
        exposure = load(home)
    except ExposureSettingsError:
        return None  # the node logs the damaged file when it applies the exposure
    if exposure is not None and exposure.plain == "off":
        return "127.0.0.1"
    return None
