"""The mutual-TLS planes run each handshake themselves: a certificate from
another CA is refused and reported (for the audit chain), a good one reaches
the app with its identity, and noise (plain HTTP, scans) is not reported."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from letsinfer.audit.denials import DenialLog
from letsinfer.connections import ConnectionLimits
from letsinfer.planes import RunningPlane, tls_server
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.peer import client_context, peer_of, presenting_server
from tests.nodes import free_port


class Cluster:
    """A CA in ``tmp``/``name`` that issues node certificates into files."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        self.key, self.cert = pki.create_ca(name)
        self.ca = self.dir / "ca.crt"
        pki.write_pem(self.ca, pki.cert_pem(self.cert))

    def node(self, node_id: str) -> tuple[Path, Path]:
        key = pki.new_key()
        cert = pki.issue(
            self.key,
            self.cert,
            key.public_key(),
            kind="node",
            subject_id=node_id,
            role="child",
            days=1,
        )
        pki.write_pem(self.dir / f"{node_id}.crt", pki.cert_pem(cert))
        pki.write_private_key(self.dir / f"{node_id}.key", key)
        return self.dir / f"{node_id}.crt", self.dir / f"{node_id}.key"


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    async def who(request: Request) -> dict[str, str | None]:
        peer = peer_of(request.scope)
        return {"id": peer.identity.id if peer else None, "scheme": request.url.scheme}

    return app


def _run_uvloop(coro: Any) -> Any:
    uvloop = pytest.importorskip("uvloop")
    return uvloop.run(coro)


# uvicorn runs a child's agent plane on uvloop and the main's on asyncio: both.
@pytest.mark.parametrize("run", [asyncio.run, _run_uvloop], ids=["asyncio", "uvloop"])
def test_refused_handshakes_are_reported_and_good_ones_served(
    tmp_path: Path, run: Callable[[Any], Any]
) -> None:
    ours = Cluster(tmp_path, "ours")
    theirs_ca = Cluster(tmp_path, "theirs")
    cert, key = ours.node("server")
    good_cert, good_key = ours.node("n1")
    other_cert, other_key = theirs_ca.node("intruder")
    ca, other_ca = ours.ca, theirs_ca.ca

    store = AuthorityStore(tmp_path / "authority.db")
    denials = DenialLog(store)
    port = free_port()
    server = tls_server(
        _app(),
        "127.0.0.1",
        port,
        presenting_server(cert, key, ca),
        on_refused=denials.tls_refusals("control"),
    )
    url = f"https://127.0.0.1:{port}/who"

    def clients() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        good = httpx.get(url, verify=client_context(ca, good_cert, good_key), timeout=5)
        seen["good"] = good.json()
        anonymous = httpx.get(url, verify=client_context(ca), timeout=5)
        seen["anonymous"] = anonymous.json()
        theirs = client_context(other_ca, other_cert, other_key)
        theirs.verify_mode = ssl.CERT_NONE  # it would refuse us too; make it try anyway
        for _ in range(3):
            with pytest.raises(httpx.HTTPError):
                httpx.get(url, verify=theirs, timeout=5)
        # A client that trusts another CA refuses our certificate: reported too.
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, verify=client_context(other_ca), timeout=5)
        # Plain HTTP on the TLS port, and a connection that says nothing: noise.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/who", timeout=5)
        with socket.create_connection(("127.0.0.1", port)):
            pass
        seen["after"] = httpx.get(
            url, verify=client_context(ca, good_cert, good_key), timeout=5
        ).json()
        return seen

    async def scenario() -> dict[str, Any]:
        plane = RunningPlane(server)
        await plane.start()
        try:
            return await asyncio.to_thread(clients)
        finally:
            await plane.stop()

    seen = run(scenario())
    assert seen["good"] == {"id": "n1", "scheme": "https"}
    assert seen["anonymous"] == {"id": None, "scheme": "https"}
    assert seen["after"] == seen["good"], "refusals do not disturb the plane"

    # Three refusals of the intruder's certificate: one record with their count;
    # one for the client refusing ours.
    denials.flush()
    records = store.list_audit()
    store.close()
    assert {(r.actor, r.action, r.outcome) for r in records} == {
        ("tls:127.0.0.1", "control:handshake", "denied")
    }
    counts = {str(r.detail): r.count for r in records}
    assert len(counts) == 2, counts
    theirs = next(n for d, n in counts.items() if "not accepted by this cluster's CA" in d)
    ours = next(n for d, n in counts.items() if "refused this node's certificate" in d)
    assert (theirs, ours) == (3, 1)


@pytest.mark.parametrize("run", [asyncio.run, _run_uvloop], ids=["asyncio", "uvloop"])
def test_idle_and_crowding_connections_on_a_plane_are_closed(
    tmp_path: Path, run: Callable[[Any], Any]
) -> None:
    ours = Cluster(tmp_path, "ours")
    cert, key = ours.node("server")
    good_cert, good_key = ours.node("n1")
    port = free_port()
    limits = ConnectionLimits(
        max_connections=4, per_client=2, header_timeout_s=0.5, idle_timeout_s=1
    )
    server = tls_server(
        _app(), "127.0.0.1", port, presenting_server(cert, key, ours.ca), limits=limits
    )
    good = client_context(ours.ca, good_cert, good_key)

    def closed(sock: socket.socket) -> bool:
        sock.settimeout(5)
        try:
            return sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def clients() -> dict[str, bool]:
        seen: dict[str, bool] = {}
        # Authenticated, then silent: closed once its headers are late.
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            good.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            seen["idle after handshake"] = closed(tls)
        # Two connections in their handshake from one source hold its share;
        # a third from it is closed at once, while another source is served.
        hogs = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))]
        hogs.append(socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)))
        try:
            with socket.create_connection(
                ("127.0.0.1", port), source_address=("127.0.0.2", 0)
            ) as third:
                seen["third from one source"] = closed(third)
            reply = httpx.get(f"https://127.0.0.1:{port}/who", verify=good, timeout=5)
            seen["others served"] = reply.json()["id"] == "n1"
        finally:
            for hog in hogs:
                hog.close()
        return seen

    async def scenario() -> dict[str, bool]:
        plane = RunningPlane(server)
        await plane.start()
        try:
            return await asyncio.to_thread(clients)
        finally:
            await plane.stop()

    seen = run(scenario())
    assert seen == {
        "idle after handshake": True,
        "third from one source": True,
        "others served": True,
    }
