"""`letsinfer exposure`: the inference plane published over TLS on one port,
on a real main node (loopback); the firewall's share is in
tests/test_exposure_lab.py."""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from letsinfer.engines.tinymodel import SENTENCE
from letsinfer.exposure.certificate import issue_from_cluster_ca
from letsinfer.trust import pki
from tests.nodes import RunningNode, free_port, start_node

CHAT = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("exposure") / "home")
    try:
        yield running
    finally:
        running.stop()


def _ca_file(node: RunningNode) -> Path:
    (found,) = (node.home / "etc" / "clusters").glob("*/ca.crt")
    return found


def _served(port: int, ca: Path, name: str = "127.0.0.1") -> x509.Certificate:
    """The certificate a new connection to the TLS port is shown (verified)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _refused(port: int) -> bool:
    """Whether a TLS connection to the port gets nowhere (closed or refused)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw),
        ):
            return False
    except (OSError, ssl.SSLError):
        return True


def _self_signed(
    folder: Path,
    *,
    days: int = 30,
    ca: bool = False,
    client_only: bool = False,
) -> tuple[Path, Path]:
    key = pki.new_key()
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "exposed.example")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=60))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("exposed.example")]), critical=False
        )
    )
    if client_only:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    cert = builder.sign(key, hashes.SHA256())
    folder.mkdir(parents=True, exist_ok=True)
    pki.write_pem(folder / "cert.pem", pki.cert_pem(cert))
    pki.write_private_key(folder / "key.pem", key)
    return folder / "cert.pem", folder / "key.pem"


def test_cluster_ca_exposure_serves_the_openai_client_and_renews_without_restart(
    node: RunningNode,
) -> None:
    port = free_port()
    done = node.cli(
        "exposure", "enable", "--address", "127.0.0.1", "--cluster-ca",
        "--san", "127.0.0.1", "--san", "localhost", "--port", str(port), "--from", "127.0.0.1/32",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ca = _ca_file(node)
    assert str(ca) in done.stdout  # the CA file clients must trust is printed
    assert "serving now" in done.stdout

    tls = ssl.create_default_context(cafile=str(ca))
    client = openai.OpenAI(
        base_url=f"https://127.0.0.1:{port}/v1",
        api_key=node.key,
        max_retries=0,
        http_client=httpx.Client(verify=tls),
    )
    reply = client.chat.completions.create(model="tiny", messages=CHAT)
    assert reply.choices[0].message.content == SENTENCE
    # Without the CA file, a client refuses the certificate.
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(
            base_url=f"https://127.0.0.1:{port}/v1", api_key=node.key, max_retries=0
        ).models.list()

    status = json.loads(node.cli("exposure", "status", "--json").stdout)
    assert status["published"] and status["port"] == port
    assert status["sources"] == ["127.0.0.1/32"]
    assert set(status["certificate"]["sans"]) == {"DNS:localhost", "IP:127.0.0.1"}
    assert status["node"]["listening"] is True

    # Renewed on disk (a new SAN and serial): the next connection gets it, no restart.
    before = _served(port, ca)
    cert, key = Path(status["certificate_file"]), Path(status["key_file"])
    home_etc = node.home / "etc"
    issue_from_cluster_ca(
        home_etc / "ca" / "ca.key", ca, ("127.0.0.1", "renewed.example"), cert, key
    )
    after = _served(port, ca)
    assert after.serial_number != before.serial_number
    names = after.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "renewed.example" in names.get_values_for_type(x509.DNSName)
    assert node.proc.poll() is None  # the same process
    assert client.models.list().data  # and requests go on

    closed = node.cli("exposure", "disable")
    assert closed.returncode == 0, closed.stderr
    assert _refused(port)
    assert json.loads(node.cli("exposure", "status", "--json").stdout)["published"] is False
    # The plain listener serves as before.
    assert node.client().models.list().data


def test_sources_not_listed_are_closed_at_accept(node: RunningNode) -> None:
    port = free_port()
    done = node.cli(
        "exposure", "enable", "--address", "127.0.0.1", "--cluster-ca", "--san", "127.0.0.1",
        "--port", str(port), "--from", "192.0.2.0/24",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    try:
        assert _refused(port)  # loopback is not among the sources
    finally:
        assert node.cli("exposure", "disable").returncode == 0


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("expired", "expired on"),
        ("mismatch", "does not match the certificate"),
        ("ca", "is a CA certificate"),
        ("client", "is not a server certificate"),
        ("missing", "cannot read the certificate"),
        ("garbage", "holds no PEM certificate"),
    ],
)
def test_a_bad_certificate_or_key_is_refused_and_nothing_changes(
    node: RunningNode, tmp_path: Path, kind: str, why: str
) -> None:
    port = free_port()
    first = node.cli(
        "exposure", "enable", "--address", "127.0.0.1", "--cluster-ca",
        "--san", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    settings = node.home / "etc" / "exposure.json"
    kept = settings.read_text()
    try:
        cert, key = _self_signed(
            tmp_path / "pair",
            days=-1 if kind == "expired" else 30,
            ca=kind == "ca",
            client_only=kind == "client",
        )
        if kind == "mismatch":
            _, key = _self_signed(tmp_path / "other")
        elif kind == "missing":
            cert = tmp_path / "nowhere.pem"
        elif kind == "garbage":
            cert.write_text("not a certificate\n")
        other_port = free_port()
        bad = node.cli(
            "exposure", "enable", "--address", "127.0.0.1", "--cert", str(cert), "--key", str(key),
            "--port", str(other_port),
        )  # fmt: skip
        assert bad.returncode != 0
        assert why in bad.stderr and "Nothing changed" in bad.stderr, bad.stderr
        named = key if kind == "mismatch" else cert
        assert str(named) in bad.stderr
        assert settings.read_text() == kept
        assert _refused(other_port)
        assert _served(port, _ca_file(node))  # the published port serves as before
    finally:
        assert node.cli("exposure", "disable").returncode == 0


def test_an_operator_certificate_is_served(node: RunningNode, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path / "pair")
    port = free_port()
    done = node.cli(
        "exposure",
        "enable",
        "--address",
        "127.0.0.1",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--port",
        str(port),
    )
    assert done.returncode == 0, done.stderr
    try:
        assert "CN=exposed.example" in done.stdout
        served = _served(port, cert, name="exposed.example")
        assert served.subject.rfc4514_string() == "CN=exposed.example"
        trusted = ssl.create_default_context(cafile=str(cert))
        trusted.check_hostname = False  # (it names exposed.example; _served checked the name)
        r = httpx.get(f"https://127.0.0.1:{port}/health", verify=trusted)
        assert r.status_code == 200
    finally:
        assert node.cli("exposure", "disable").returncode == 0


def test_the_exposed_port_cannot_be_another_plane(node: RunningNode) -> None:
    bad = node.cli(
        "exposure",
        "enable",
        "--address",
        "127.0.0.1",
        "--cluster-ca",
        "--san",
        "x.example",
        "--port",
        str(node.port),
    )
    assert bad.returncode != 0 and "the plain gateway's port" in bad.stderr
    assert not (node.home / "etc" / "exposure.json").exists()


def test_doctor_warns_before_the_published_certificate_expires(
    node: RunningNode, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path / "pair", days=5)
    done = node.cli(
        "exposure",
        "enable",
        "--address",
        "127.0.0.1",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--port",
        str(free_port()),
    )
    assert done.returncode == 0, done.stderr
    try:
        report = json.loads(node.cli("doctor", "--json").stdout)
        (finding,) = [f for f in report["findings"] if f["check"] == "exposure certificate"]
        assert finding["level"] == "warn", finding
        assert "in 5.0 days" in finding["message"] or "in 4.9 days" in finding["message"]
        assert str(cert) in finding["fix"]
    finally:
        assert node.cli("exposure", "disable").returncode == 0
    report = json.loads(node.cli("doctor", "--json").stdout)
    assert not [f for f in report["findings"] if f["check"].startswith("exposure")]
