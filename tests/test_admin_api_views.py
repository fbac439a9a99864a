"""What a viewer reads from a workstation, as on the main: `audit list` and
`doctor --cluster` run on the selected main with its output and exit code;
plain `doctor` and `status` stay about the machine they run on and send
nothing (tests/admin_desk.py: the main's CLI beside a paired workstation)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.admin_desk import Desk


@pytest.mark.parametrize("extra", [["--json"], [], ["--limit", "2", "--json"], ["--limit", "2"]])
def test_audit_list_from_a_workstation_is_the_main_s_chain(desk: Desk, extra: list[str]) -> None:
    desk.main.store.append_audit("alice", "model.stop", "ok", target="tiny")
    remote = desk.at_ws("watcher", "audit", "list", *extra)
    local = desk.at_main("audit", "list", *extra)
    assert remote.code == local.code == 0, remote.err
    assert (remote.out, remote.err) == (local.out, "")
    assert "model.stop" in remote.out  # the main's chain, not the workstation's (it has none)
    assert desk.sent == [("watcher", "GET", "/v1/ops/audit" + ("?limit=2" if "2" in extra else ""))]


@pytest.mark.parametrize("limit", ["0", str(2**63)])
def test_audit_list_limit_is_checked_here_and_nothing_is_sent(desk: Desk, limit: str) -> None:
    refused = desk.at_ws("watcher", "audit", "list", "--limit", limit)
    assert (refused.code, refused.err) == (2, desk.at_main("audit", "list", "--limit", limit).err)
    assert desk.sent == []
    with desk.main.client("watcher") as viewer:  # and the main refuses it alike, as bad input
        raw = viewer.get(f"/v1/ops/audit?limit={limit}")
    assert raw.status_code == 422


@pytest.mark.parametrize("extra", [["--json"], []])
def test_doctor_cluster_from_a_workstation_says_and_exits_as_on_the_main(
    desk: Desk, extra: list[str]
) -> None:
    # A child whose facts never came: a failure on the main, so exit 1 there and here.
    desk.main.store.add_node("c-a", "c-a", "child", "10.0.0.2:8444", "fp-a")
    remote = desk.at_ws("watcher", "doctor", "--cluster", *extra)
    local = desk.at_main("doctor", "--cluster", *extra)
    assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)
    assert remote.code == 1
    assert "c-a" in remote.out
    if extra:
        assert json.loads(remote.out)["host"] == "main"
    else:
        assert "failure(s)" in remote.out and "on the cluster" in remote.out
    assert desk.sent == [("watcher", "GET", "/v1/ops/doctor/cluster")]


def test_plain_doctor_with_a_controller_selected_checks_this_machine(desk: Desk) -> None:
    here = desk.at_ws("watcher", "doctor", "--json")
    found = json.loads(here.out)
    assert found["host"] == socket.gethostname()  # the workstation, not "main"
    certificate = next(f for f in found["findings"] if f["check"] == "certificate")
    assert "not a letsinfer node yet" in certificate["message"]
    assert desk.sent == []
    # Not even the selection is looked at: a controller paired nowhere is no error.
    unpaired = desk._run(desk.ws, "--controller", "nowhere", "doctor", "--json")
    assert json.loads(unpaired.out)["host"] == socket.gethostname(), unpaired.err
    helped = desk.at_ws("watcher", "doctor", "--help").out
    assert "With --cluster, from a paired controller: viewer role." in " ".join(helped.split())


def test_status_with_a_controller_selected_is_this_machine_s_and_sends_nothing(
    desk: Desk,
) -> None:
    shown = desk.at_ws("watcher", "status")
    assert shown.code == 3  # no node here, as without a controller
    said = " ".join(shown.out.split())
    assert f"no letsinfer node in {desk.ws}" in said
    assert "even with controller watcher selected" in said
    assert "`letsinfer cluster status`" in said
    info = json.loads(desk.at_ws("watcher", "status", "--json").out)
    assert (info["initialised"], info["running"], info["role"]) == (False, False, None)
    assert desk.sent == []
