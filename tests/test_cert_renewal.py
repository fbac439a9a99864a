"""A renewed node certificate is installed only if it is for this node's key
and from this cluster's CA; then every plane and client presenting the old
one presents the new one, from a new context (tests/test_trust.py shows it
across a running cluster)."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.trust import pki, renewal
from letsinfer.trust.client import ClusterClient
from letsinfer.trust.material import TlsFiles
from letsinfer.trust.peer import Presenting, presenting_server


@dataclass
class Node:
    files: TlsFiles
    key: ec.EllipticCurvePrivateKey
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate

    def issued(self, days: int, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
        public = (key or self.key).public_key()
        cert = pki.issue(
            self.ca_key, self.ca_cert, public, kind="node", subject_id="n1", role="child", days=days
        )
        return pki.cert_pem(cert)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    ca_key, ca_cert = pki.create_ca("cluster")
    files = TlsFiles(tmp_path / "node.crt", tmp_path / "node.key", tmp_path / "ca.crt")
    made = Node(files, pki.new_key(), ca_key, ca_cert)
    pki.write_private_key(files.key, made.key)
    pki.write_pem(tmp_path / "ca.crt", pki.cert_pem(ca_cert))
    pki.write_pem(files.cert, made.issued(days=1))
    return made


@pytest.fixture
def tls(node: Node) -> Presenting:
    return presenting_server(node.files.cert, node.files.key, node.files.ca)


@contextlib.contextmanager
def tls_server(context: Callable[[], ssl.SSLContext]) -> Iterator[tuple[str, int]]:
    """A TLS server on 127.0.0.1; each connection uses ``context()`` at that moment."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context().wrap_socket(conn, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = listener.getsockname()
    try:
        yield address
    finally:
        stop.set()
        socket.create_connection(address, timeout=5).close()  # wakes the thread's accept()
        listener.close()
        thread.join(timeout=5)


@pytest.fixture
def plane(tls: Presenting) -> Iterator[tuple[str, int]]:
    """The node's certificate served as a plane serves it: the context
    presented at each connection."""
    with tls_server(lambda: tls.context) as address:
        yield address


def presented(address: tuple[str, int]) -> str:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(address, timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def on_disk(files: TlsFiles) -> str:
    return pki.fingerprint(pki.load_cert(files.cert.read_bytes()))


def test_a_running_plane_presents_the_renewed_certificate_at_once(
    node: Node, plane: tuple[str, int]
) -> None:
    first = presented(plane)
    assert first == on_disk(node.files)
    assert renewal.due(node.files, renew_before_s=10 * 86400)
    assert not renewal.due(node.files, renew_before_s=3600)

    renewal.install(node.files, node.issued(days=30))

    assert on_disk(node.files) != first
    assert presented(plane) == on_disk(node.files)
    assert not renewal.due(node.files, renew_before_s=10 * 86400)


@pytest.mark.parametrize("forged", ["another cluster's CA", "another node's key"])
def test_a_certificate_not_from_our_ca_or_not_for_our_key_changes_nothing(
    node: Node, plane: tuple[str, int], forged: str
) -> None:
    before = node.files.cert.read_bytes()
    if forged == "another cluster's CA":
        other_key, other_ca = pki.create_ca("elsewhere")
        pem = pki.cert_pem(
            pki.issue(
                other_key, other_ca, node.key.public_key(),
                kind="node", subject_id="n1", role="child", days=30,
            )
        )  # fmt: skip
        said = "not issued by this cluster's CA"
    else:
        pem = node.issued(days=30, key=pki.new_key())
        said = "not for this node's key"
    with pytest.raises(pki.CertificateError, match=said):
        renewal.install(node.files, pem)
    assert node.files.cert.read_bytes() == before
    assert presented(plane) == on_disk(node.files)


def test_renewal_swaps_in_a_new_context_and_never_changes_one_in_use(
    node: Node, tls: Presenting, plane: tuple[str, int]
) -> None:
    """A context in use is never reloaded in place: OpenSSL forbids changing a
    context's certificate while other threads start connections from it (the
    main's control thread does, while its gateway loop renews)."""
    in_use = tls.context
    before = on_disk(node.files)
    client = ClusterClient(node.files)
    client_before = client._tls.context

    renewal.install(node.files, node.issued(days=30))

    assert tls.context is not in_use and client._tls.context is not client_before
    assert presented(plane) == on_disk(node.files) != before
    assert tls.fingerprint == on_disk(node.files)  # what /v1/identity and mDNS say
    # The context handed out before still presents what it presented.
    with tls_server(lambda: in_use) as old_plane:
        assert presented(old_plane) == before


def test_handshakes_on_another_thread_all_succeed_through_renewals(
    node: Node, tls: Presenting, plane: tuple[str, int]
) -> None:
    """The main's case: its planes' handshakes on the control thread while the
    gateway's loop renews. Every handshake completes, with the old certificate
    or the new, never a broken one."""
    seen: set[str] = set()
    handshakes = 0
    failures: list[BaseException] = []
    done = threading.Event()

    def connect() -> None:
        nonlocal handshakes
        while not done.is_set():
            try:
                seen.add(presented(plane))
            except BaseException as exc:
                failures.append(exc)
                return
            handshakes += 1

    issued = {on_disk(node.files)}
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    renewals = 0
    while handshakes < 600 and renewals < 5000 and not failures:
        renewal.install(node.files, node.issued(days=2 + renewals % 300))
        issued.add(on_disk(node.files))
        renewals += 1
    done.set()
    thread.join(timeout=10)
    assert not failures
    assert handshakes >= 600, "the handshakes ran alongside the renewals"
    assert len(seen) > 1 and seen <= issued
