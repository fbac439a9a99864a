"""What a candidate keeps of the enrollment requests it receives: only those
signed by the key of a main of the CA they carry, for this candidate. (The
lab test in test_ansible_onboarding.py sends the forgery from an outsider.)"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from letsinfer.home import Home
from letsinfer.trust import candidate, pki, request_proof

CANDIDATE = "n-candidate"


def a_cluster() -> tuple[str, str, ec.EllipticCurvePrivateKey]:
    """A CA, its main's node certificate, and that main's key."""
    ca_key, ca = pki.create_ca("m-main")
    key = pki.new_key()
    cert = pki.issue(
        ca_key, ca, key.public_key(), kind="node", subject_id="m-main", role="main", days=30
    )
    return pki.cert_pem(ca).decode(), pki.cert_pem(cert).decode(), key


def request(
    ca: str, cert: str | None, key: ec.EllipticCurvePrivateKey | None, rid: str, expires: float
) -> candidate.PendingRequest:
    req = candidate.PendingRequest(
        id=rid,
        main_id="m-main",
        main_name="main",
        main_address="10.0.0.1:8443",
        ca_pem=ca,
        token="t" * 43,
        expires_at=expires,
        received_at=time.time(),
        main_cert=cert,
        received_from="10.0.0.9",
    )
    if key is None:
        return req
    signed = request_proof.message(
        enrollment_id=rid,
        candidate_id=CANDIDATE,
        main_id=req.main_id,
        main_name=req.main_name,
        main_address=req.main_address,
        ca_pem=ca,
        token=req.token,
        expires_at=expires,
        gateway_url=None,
    )
    return replace(req, signature=request_proof.sign(key, signed))


def test_only_a_request_signed_by_the_main_s_key_is_kept(tmp_path: Path) -> None:
    home = Home.under(tmp_path)
    ca, main_cert, main_key = a_cluster()
    soon, late = time.time() + 600, time.time() + 7 * 86400
    genuine = request(ca, main_cert, main_key, "enr-genuine", soon)
    assert candidate.store_request(home, genuine, CANDIDATE)

    # The CA and the main's certificate are public; the main's key is not.
    forged = [
        request(ca, None, None, "enr-plain", late),
        request(ca, main_cert, pki.new_key(), "enr-ownkey", late),
        replace(request(ca, main_cert, main_key, "enr-moved", soon), expires_at=late),
    ]
    for req in forged:
        with pytest.raises(candidate.UnprovenRequest, match="does not prove the key of the main"):
            candidate.store_request(home, req, CANDIDATE)
    # Signed for another candidate: not this one's to keep.
    with pytest.raises(candidate.UnprovenRequest):
        candidate.store_request(home, genuine, "n-other")
    assert [r.id for r in candidate.list_requests(home, CANDIDATE)] == ["enr-genuine"]


def test_a_signed_request_that_expires_late_is_kept_a_week_at_most(tmp_path: Path) -> None:
    home = Home.under(tmp_path)
    ca, main_cert, main_key = a_cluster()
    month = time.time() + 30 * 86400
    assert candidate.store_request(
        home, request(ca, main_cert, main_key, "enr-m", month), CANDIDATE
    )
    [kept] = candidate.list_requests(home, CANDIDATE)
    assert kept.id == "enr-m" and kept.keep_until <= time.time() + 7 * 86400


def test_a_flood_of_requests_its_own_cluster_signed_never_evicts_the_main_s(
    tmp_path: Path,
) -> None:
    """A LAN host with a cluster of its own can sign requests; however many it
    sends, room is made from its own, and the main's request stays."""
    home = Home.under(tmp_path)
    ca, main_cert, main_key = a_cluster()
    genuine = replace(
        request(ca, main_cert, main_key, "enr-genuine", time.time() + 600),
        received_from="10.0.0.1",
    )
    assert candidate.store_request(home, genuine, CANDIDATE)
    own_ca, own_cert, own_key = a_cluster()
    for i in range(candidate.MAX_PENDING + 8):
        flood = request(own_ca, own_cert, own_key, f"enr-flood{i:04d}", time.time() + 600)
        candidate.store_request(home, flood, CANDIDATE)
    kept = {r.id for r in candidate.list_requests(home, CANDIDATE)}
    assert len(kept) == candidate.MAX_PENDING and "enr-genuine" in kept
    assert "enr-flood0039" in kept and "enr-flood0000" not in kept

    # nor can a request of its own, under the main's request id, replace it
    taken = request(own_ca, own_cert, own_key, "enr-genuine", time.time() + 600)
    with pytest.raises(candidate.EnrollmentError, match="already pending from another main"):
        candidate.store_request(home, taken, CANDIDATE)
    [still] = [r for r in candidate.list_requests(home, CANDIDATE) if r.id == "enr-genuine"]
    assert still.ca_fingerprint == genuine.ca_fingerprint
