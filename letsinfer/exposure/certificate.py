"""The certificate the exposed listener serves: checks before anything is
changed, and one the cluster CA issues for names and addresses (``--cluster-ca``).

Every refusal names the file and why (unreadable, not PEM, the key does not
match, expired or not yet valid, not a server certificate), so a bad pair is
refused before the exposure file or the running node changes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from letsinfer.home import Home
from letsinfer.trust import pki

CLUSTER_CA_DAYS = 90
WARN_DAYS = 14  # doctor warns this long before the certificate expires


class CertificateRefused(Exception):
    """The certificate or key cannot be served; the message names the file and why."""


@dataclass(frozen=True)
class ServedCert:
    subject: str
    sans: tuple[str, ...]
    not_after: dt.datetime
    serial: int
    fingerprint: str

    def to_json(self) -> dict[str, object]:
        return {
            "subject": self.subject,
            "sans": list(self.sans),
            "not_after": self.not_after.isoformat(timespec="seconds"),
            "serial": format(self.serial, "x"),
            "fingerprint": f"sha256:{self.fingerprint}",
        }


MAX_PEM = 64 * 1024  # a certificate with its chain, or a key: far less


def read_pem_file(path: Path, what: str) -> bytes:
    """The file's bytes, bounded: CertificateRefused names it and why not."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_PEM + 1)
    except OSError as exc:
        raise CertificateRefused(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_PEM:
        raise CertificateRefused(f"the {what} {path} is larger than {MAX_PEM // 1024} KiB")
    return data


def describe(cert: x509.Certificate) -> ServedCert:
    sans: list[str] = []
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans += [f"DNS:{n}" for n in ext.get_values_for_type(x509.DNSName)]
        sans += [f"IP:{a}" for a in ext.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        pass
    return ServedCert(
        subject=cert.subject.rfc4514_string(),
        sans=tuple(sans),
        not_after=cert.not_valid_after_utc,
        serial=cert.serial_number,
        fingerprint=pki.fingerprint(cert),
    )


def check_pair(cert_path: Path, key_path: Path, now: dt.datetime | None = None) -> ServedCert:
    """What ``cert_path`` (PEM, the server's certificate first, then its
    chain) with ``key_path`` would serve; raises CertificateRefused if it
    cannot be served."""
    cert = check_pem(
        read_pem_file(cert_path, "certificate"),
        read_pem_file(key_path, "key"),
        str(cert_path),
        str(key_path),
        now,
    )
    _loads(cert_path, key_path, str(cert_path), str(key_path))
    return describe(cert)


def check_pem(
    cert_pem: bytes,
    key_pem: bytes,
    cert_name: str,
    key_name: str,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """Every check but OpenSSL's own load (which needs files) of a pair
    given as text, the refusals naming ``cert_name`` and ``key_name`` (the
    files it came from): the server's certificate, or CertificateRefused."""
    now = now or dt.datetime.now(dt.UTC)
    if len(cert_pem) > MAX_PEM or len(key_pem) > MAX_PEM:
        raise CertificateRefused(
            f"the certificate {cert_name} or the key {key_name} is larger than "
            f"{MAX_PEM // 1024} KiB"
        )
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise CertificateRefused(f"{cert_name} holds no PEM certificate") from None
    cert = chain[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateRefused(
            f"{key_name} is not an unencrypted PEM private key ({exc})"
        ) from None
    if key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CertificateRefused(f"the key {key_name} does not match the certificate {cert_name}")
    if cert.not_valid_after_utc <= now:
        raise CertificateRefused(
            f"the certificate {cert_name} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if cert.not_valid_before_utc > now:
        raise CertificateRefused(
            f"the certificate {cert_name} is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        if basic.ca:
            raise CertificateRefused(
                f"the certificate {cert_name} is a CA certificate, not a server certificate"
            )
    except x509.ExtensionNotFound:
        pass
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        if ExtendedKeyUsageOID.SERVER_AUTH not in usage:
            raise CertificateRefused(
                f"the certificate {cert_name} is not a server certificate "
                "(its extended key usage lacks serverAuth)"
            )
    except x509.ExtensionNotFound:
        pass
    return cert


def _loads(cert_path: Path, key_path: Path, cert_name: str, key_name: str) -> None:
    try:
        server_context(cert_path, key_path)
    except ssl.SSLError as exc:
        raise CertificateRefused(
            f"OpenSSL refuses {cert_name} with {key_name}: {exc.reason or exc}"
        ) from exc


def store_sent_pair(
    cert_pem: bytes,
    key_pem: bytes,
    cert_name: str,
    key_name: str,
    cert_out: Path,
    key_out: Path,
    settle: Callable[..., None] | None = None,
) -> ServedCert:
    """A pair a controller sent as text (its workstation's files, named
    ``cert_name`` and ``key_name`` in any refusal), checked as `check_pair`
    checks files, then stored at ``cert_out``/``key_out`` as the cluster
    CA's are: the exposure serves the stored copy, so a renewal is `exposure
    enable` sent again. Nothing is replaced unless every check passed."""
    cert = check_pem(cert_pem, key_pem, cert_name, key_name)
    cert_out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp_key = key_out.with_name(key_out.name + ".new")
    tmp_cert = cert_out.with_name(cert_out.name + ".new")
    fd = os.open(tmp_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key_pem)
    tmp_cert.write_bytes(cert_pem)
    try:
        _loads(tmp_cert, tmp_key, cert_name, key_name)
    except CertificateRefused:
        tmp_key.unlink(missing_ok=True)
        tmp_cert.unlink(missing_ok=True)
        raise
    _place(tmp_cert, tmp_key, cert_out, key_out, settle)
    return describe(cert)


def _place(
    tmp_cert: Path,
    tmp_key: Path,
    cert_out: Path,
    key_out: Path,
    settle: Callable[..., None] | None,
) -> None:
    """Key first: a node reading between the two sees a mismatch and keeps
    the certificate it serves."""
    if settle is not None:
        settle(key_out.parent, tmp_key, tmp_cert)
    tmp_key.replace(key_out)
    tmp_cert.replace(cert_out)


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS for the exposed listener: no client certificate (API keys authenticate)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def cluster_files(home: Home) -> tuple[Path, Path]:
    """Where a certificate the cluster CA issued for the exposure lives."""
    folder = home.etc / "exposure"
    return folder / "server.crt", folder / "server.key"


def _san(value: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        pass
    name = value.strip().lower().rstrip(".")
    labels = name.split(".")
    if (
        not name
        or not name.isascii()
        or len(name) > 253
        or not all(0 < len(label) <= 63 and label.replace("-", "").isalnum() for label in labels)
    ):
        raise CertificateRefused(f"--san {value!r} is neither a DNS name nor an IP address")
    return x509.DNSName(name)


def issue_from_cluster_ca(
    ca_key_path: Path,
    ca_cert_path: Path,
    sans: tuple[str, ...],
    cert_out: Path,
    key_out: Path,
    settle: Callable[..., None] | None = None,
) -> ServedCert:
    """A server certificate for ``sans`` signed by the cluster CA, written
    key first (a node reading between the writes sees a mismatch and keeps
    the certificate it serves). ``settle(*paths)`` gives the new files their
    owner before they take their place."""
    if not sans:
        raise CertificateRefused("--cluster-ca needs at least one --san NAME_OR_ADDRESS")
    names = [_san(s) for s in sans]
    ca_key = pki.read_private_key(ca_key_path)
    ca_cert = pki.load_cert(ca_cert_path.read_bytes())
    key = pki.new_key()
    now = dt.datetime.now(dt.UTC)
    first = next((n.value for n in names if isinstance(n, x509.DNSName)), str(names[0].value))
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, str(first)),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "exposure"),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CLUSTER_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    tmp_key = key_out.with_name(key_out.name + ".new")
    tmp_cert = cert_out.with_name(cert_out.name + ".new")
    pki.write_private_key(tmp_key, key)
    pki.write_pem(tmp_cert, pki.cert_pem(cert))
    _place(tmp_cert, tmp_key, cert_out, key_out, settle)
    return describe(cert)
