"""A candidate's side of a join code: dial the main, check it, prove, enroll.

Nothing secret leaves before the main is checked: the first connection only
reads the main's CA (``/v1/pair/ca``, public) and the certificate the main
presents; both must be the code's CA (by its fingerprint) and a main's
certificate issued by it. Only then, on a connection that verifies the
main against that CA, does the candidate ask for a nonce and send its CSR
with a proof of the code's secret over that nonce and CSR (never the secret).
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.trust import pki
from letsinfer.trust.candidate import EnrollmentError, install_membership
from letsinfer.trust.client import PeerMismatch, error_message, peer_certificate
from letsinfer.trust.join_code import JoinCode
from letsinfer.trust.material import ensure_node_key
from letsinfer.trust.pinning import split_address

CONTROL_PORT = 8443


class NotTheCodesMain(EnrollmentError):
    """The host reached is not the main the code names: nothing was sent."""


def control_address(text: str) -> str:
    """HOST or HOST:PORT (the control port by default); ValueError if neither."""
    host, port = split_address(text.strip(), CONTROL_PORT)
    if not host or not 0 < port < 65536:
        raise ValueError(f"{text!r} is not HOST or HOST:PORT")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _main_identity(der: bytes, ca: Any) -> str:
    """The main's node id, if ``der`` is a main's certificate issued by ``ca``."""
    cert = pki.load_cert(der)
    pki.verify_issued_by(cert, ca)
    who = pki.identity_of(cert)
    if who.kind != "node" or who.role != "main":
        raise pki.CertificateError(f"it presents the certificate of {who.kind} {who.id}")
    return who.id


def check_main(address: str, code: JoinCode, timeout: float = 15.0) -> tuple[str, str]:
    """The main's CA (PEM) and node id, once its CA is the code's; raises
    NotTheCodesMain (nothing but a GET sent) or EnrollmentError."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # checked below against the code's fingerprint
    try:
        with (
            httpx.Client(verify=probe, timeout=timeout) as client,
            client.stream("GET", f"https://{address}/v1/pair/ca") as resp,
        ):
            server_der = peer_certificate(resp)  # while the connection is surely open
            resp.read()
        ca_pem = resp.json()["ca"]
        ca = pki.load_cert(ca_pem.encode())
    except (httpx.HTTPError, PeerMismatch, ValueError, KeyError, TypeError) as exc:
        raise NotTheCodesMain(
            f"{address} is not a letsinfer main ({exc}); the code was not sent"
        ) from exc
    except pki.CertificateError as exc:
        raise NotTheCodesMain(f"{address} sent no CA certificate: {exc}") from exc
    fingerprint = pki.fingerprint(ca)
    if not code.names_ca(fingerprint):
        raise NotTheCodesMain(
            f"{address} belongs to the cluster whose CA fingerprint is sha256:{fingerprint}, "
            "not the one in the join code: refused, the code's secret was not used"
        )
    try:
        main_id = _main_identity(server_der, ca)
    except pki.CertificateError as exc:
        raise NotTheCodesMain(
            f"{address} is not the main of the code's cluster: {exc}; the code was not used"
        ) from exc
    return ca_pem, main_id


def enroll(
    home: Home,
    identity: NodeIdentity,
    address: str,
    code: JoinCode,
    checked: tuple[str, str],
    agent_address: str,
) -> NodeIdentity:
    """Enroll this node with the main at ``address`` (``checked``: what
    :func:`check_main` said of it) using ``code``; the new identity."""
    ca_pem, main_id = checked
    ca = pki.load_cert(ca_pem.encode())
    trusted = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    trusted.check_hostname = False  # the main's identity is in its certificate, checked below
    trusted.load_verify_locations(cadata=ca_pem)
    key = ensure_node_key(home)
    csr = pki.make_csr(key, identity.node_id).decode()
    try:
        with httpx.Client(verify=trusted, timeout=15) as client:
            resp = client.get(f"https://{address}/v1/join/challenge")
            if _main_identity(peer_certificate(resp), ca) != main_id or resp.status_code != 200:
                raise EnrollmentError(f"{address} did not give a nonce: {error_message(resp)}")
            nonce = str(resp.json()["nonce"])
            proof = code.prove(
                nonce=nonce, csr_pem=csr, ca_fingerprint=pki.fingerprint(ca), main_id=main_id
            )
            body = {
                "code_id": code.code_id,
                "nonce": nonce,
                "proof": proof,
                "csr": csr,
                "node_id": identity.node_id,
                "name": identity.name,
                "agent_address": agent_address,
            }
            resp = client.post(f"https://{address}/v1/join", json=body)
            if _main_identity(peer_certificate(resp), ca) != main_id:
                raise EnrollmentError(f"{address} changed its certificate mid-way")
    except (httpx.HTTPError, PeerMismatch, ValueError, KeyError, pki.CertificateError) as exc:
        raise EnrollmentError(f"cannot join through {address}: {exc}") from exc
    if resp.status_code != 200:
        raise EnrollmentError(f"the main refused: {error_message(resp)}")
    answer = resp.json()
    cert = pki.load_cert(str(answer["certificate"]).encode())
    pki.verify_issued_by(cert, ca)
    ident = pki.identity_of(cert)
    if ident.id != identity.node_id or pki.public_key_fingerprint(
        cert
    ) != pki.public_key_fingerprint(key.public_key()):
        raise EnrollmentError("the main issued a certificate for another identity")
    return install_membership(
        home,
        identity,
        ca,
        cert,
        release_key=answer.get("release_key"),
        main_address=address,
        main_id=main_id,
        gateway_url=answer.get("gateway_url"),
    )
