"""mDNS discovery (``_letsinfer._tcp``) with python-zeroconf.

A node advertises public identity and pairing hints only: node id,
certificate fingerprint, role, pairing state — and, on the main, the
inference endpoint. Never credentials, models, telemetry or admin state.
Discovery is never authorization: it only supplies the pin for enrollment.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass

import ifaddr
from zeroconf import IPVersion, ServiceBrowser, ServiceListener, Zeroconf
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

SERVICE_TYPE = "_letsinfer._tcp.local."
#: The only TXT keys a node may publish.
TXT_KEYS = frozenset({"id", "fp", "role", "pairing", "gateway"})


@dataclass(frozen=True)
class Advert:
    name: str
    node_id: str
    fingerprint: str
    role: str
    pairing: str
    addresses: tuple[str, ...]
    port: int
    gateway: str | None = None

    @property
    def label(self) -> str:
        """The node's name as advertised (the instance name less its id suffix)."""
        return self.name.rsplit("-", 1)[0]

    def address(self) -> str:
        return f"{self.addresses[0]}:{self.port}" if self.addresses else f"?:{self.port}"


def local_addresses(host: str) -> list[str]:
    """The IPv4 addresses to advertise for a listener bound to ``host``."""
    if host not in ("0.0.0.0", ""):
        return [host]
    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback:
                found.append(ip.ip)
    return found


def txt_record(
    node_id: str, fingerprint: str, role: str, pairing: str, gateway: str | None = None
) -> dict[str, str]:
    txt = {"id": node_id, "fp": fingerprint, "role": role, "pairing": pairing}
    if gateway:
        txt["gateway"] = gateway
    assert set(txt) <= TXT_KEYS
    return txt


class Advertiser:
    """Registers this node's record for as long as the node runs."""

    def __init__(self, instance: str, port: int, addresses: list[str], txt: dict[str, str]) -> None:
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{instance}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(a) for a in addresses],
            port=port,
            properties=txt,
            server=f"{instance}.local.",
        )
        self._zc: AsyncZeroconf | None = None
        self._addresses = addresses
        self._txt = txt

    async def start(self) -> None:
        # Only on the interfaces that carry our addresses, not every link.
        self._zc = AsyncZeroconf(ip_version=IPVersion.V4Only, interfaces=self._addresses)
        await self._zc.async_register_service(self._info, allow_name_change=True)

    async def update_fingerprint(self, fingerprint: str) -> None:
        """Announce the certificate a renewal put in place (the record's ``fp``)."""
        if self._txt.get("fp") == fingerprint:
            return
        self._txt = {**self._txt, "fp": fingerprint}
        info = self._info  # its name as registered (a conflict may have renamed it)
        self._info = AsyncServiceInfo(
            info.type,
            info.name,
            addresses=info.addresses,
            port=info.port,
            properties=self._txt,
            server=info.server,
        )
        if self._zc is not None:
            await self._zc.async_update_service(self._info)

    async def stop(self) -> None:
        if self._zc is not None:
            await self._zc.async_unregister_all_services()
            await self._zc.async_close()
            self._zc = None


class _Collector(ServiceListener):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.names.add(name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.names.add(name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.names.discard(name)


def browse(wait_s: float = 2.0) -> list[Advert]:
    """Everything advertising ``_letsinfer._tcp`` on the local links."""
    zc = Zeroconf(ip_version=IPVersion.V4Only)
    try:
        collector = _Collector()
        browser = ServiceBrowser(zc, SERVICE_TYPE, collector)
        time.sleep(wait_s)
        browser.cancel()
        adverts = []
        for name in sorted(collector.names):
            info = zc.get_service_info(SERVICE_TYPE, name, timeout=1500)
            if info is None:
                continue
            txt = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
            if not {"id", "fp", "role", "pairing"} <= set(txt):
                continue
            adverts.append(
                Advert(
                    name=name.removesuffix("." + SERVICE_TYPE),
                    node_id=txt["id"],
                    fingerprint=txt["fp"],
                    role=txt["role"],
                    pairing=txt["pairing"],
                    addresses=tuple(info.parsed_addresses(IPVersion.V4Only)),
                    port=info.port or 0,
                    gateway=txt.get("gateway"),
                )
            )
        return adverts
    finally:
        zc.close()
