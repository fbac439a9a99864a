"""``letsinfer doctor --cluster``: the design's invariants, checked across the
cluster from the main's authority in one pass.

- exactly one main, and it runs;
- a GPU belongs to at most one placement group, and it is a GPU its node reports;
- every node's certificate is valid and not near expiry;
- every child's facts are fresh;
- every node's signed audit head agrees with what the main witnessed, and the
  main's own chain is anchored;
- every member reports its firewall table loaded;
- every placement group meant to run is ready, or its reason is named.

``check_cluster`` is a pure function of a ``ClusterState``; ``gather`` reads
one from the main's home. States are read as the store has them, so a state
this module has never heard of is reported with its detail, not ignored.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from letsinfer.doctor.findings import Finding, fail, ok, warn
from letsinfer.doctor.firewall import firewall_finding
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore, GpuClaim, NodeRecord, PlacementGroupRecord

NEAR_EXPIRY_S = 7 * 86400  # children renew at 10 days left: under 7, renewal is failing


@dataclass(frozen=True)
class ClusterState:
    main_id: str
    main_pid: int | None  # the running main's pid, None when it is not running
    main_cert_not_after: float | None  # from the main's certificate file
    nodes: list[NodeRecord]  # not removed
    groups: list[PlacementGroupRecord]
    claims: list[GpuClaim]
    anchor_problems: list[str]  # the main's own audit chain
    stale_after_s: float
    now: float


def check_cluster(s: ClusterState) -> list[Finding]:
    out: list[Finding] = []
    names = {n.id: n.name for n in s.nodes}
    out += _main(s)
    out += _gpus(s, names)
    for n in s.nodes:
        out += _node(s, n)
    out += _groups(s, names)
    return out


def _main(s: ClusterState) -> list[Finding]:
    mains = [n for n in s.nodes if n.role == "main"]
    out = []
    if [n.id for n in mains] != [s.main_id]:
        out.append(
            fail(
                "main",
                f"{len(mains)} node(s) are recorded as main: "
                + (", ".join(n.name for n in mains) or "none"),
                "there is exactly one main; remove the others (node remove)",
            )
        )
    if s.main_pid is None:
        out.append(
            fail(
                "main",
                "the main node is not running: no gateway, no routing, no facts",
                "start it (letsinfer service start, systemctl start letsinfer, or letsinfer up)",
            )
        )
    else:
        out.append(ok("main", f"the main node runs (pid {s.main_pid})"))
    for problem in s.anchor_problems:
        out.append(fail("audit main", problem, "letsinfer audit verify; see docs/audit.md"))
    return out


def _gpus(s: ClusterState, names: dict[str, str]) -> list[Finding]:
    holders: dict[str, set[str]] = defaultdict(set)
    for c in s.claims:
        holders[c.gpu_uuid].add(c.pg_id)
    out = [
        fail(
            f"gpu {uuid}",
            f"held by {len(pgs)} placement groups at once: {', '.join(sorted(pgs))}",
            "stop all but one (model stop) and re-install the others elsewhere",
        )
        for uuid, pgs in sorted(holders.items())
        if len(pgs) > 1
    ]
    reported = {n.id: {g.get("uuid") for g in (n.facts or {}).get("gpus", [])} for n in s.nodes}
    for c in s.claims:
        if c.node_id in reported and c.gpu_uuid not in reported[c.node_id]:
            out.append(
                fail(
                    f"gpu {c.gpu_uuid}",
                    f"placement group {c.pg_id} holds it on {names.get(c.node_id, c.node_id)}, "
                    "which no longer reports it",
                    "check the GPU (nvidia-smi); re-install the model on GPUs the node has",
                )
            )
    if not out:
        out.append(ok("gpus", f"{len(holders)} GPU(s) held, each by one placement group"))
    return out


def _node(s: ClusterState, n: NodeRecord) -> list[Finding]:
    out = []
    child = n.role != "main"
    name = n.name
    # certificate
    not_after = n.cert_not_after if child else s.main_cert_not_after
    if not_after is None:
        out.append(
            warn(
                f"certificate {name}",
                "its certificate's expiry is not known yet (no facts since the upgrade)",
                "wait for its next report",
            )
        )
    else:
        left = not_after - s.now
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(not_after))
        fix = (
            "renewal happens with its reports: make sure it reaches the main"
            if child
            else "the main renews its own with its rounds: its log says why it could not"
        )
        if left <= 0:
            out.append(fail(f"certificate {name}", f"{name}'s certificate expired on {when}", fix))
        elif left < NEAR_EXPIRY_S:
            out.append(
                fail(
                    f"certificate {name}",
                    f"{name}'s certificate expires on {when}, in {left / 86400:.1f} days",
                    fix,
                )
            )
        else:
            out.append(ok(f"certificate {name}", f"valid until {when}"))
    # facts (the main's own come from its process: it runs, or _main says so)
    if child:
        if n.facts_at is None:
            out.append(
                fail(
                    f"facts {name}",
                    f"{name} has never sent facts",
                    "start it and check it reaches the main's control plane",
                )
            )
        elif s.now - _heard(n) > s.stale_after_s:
            out.append(
                fail(
                    f"facts {name}",
                    f"{name} sent no facts for {s.now - _heard(n):.0f}s "
                    f"(stale after {s.stale_after_s:.0f}s): its placement groups are unroutable",
                    f"check that {name} runs (letsinfer status there) and reaches the main",
                )
            )
        else:
            out.append(ok(f"facts {name}", f"fresh ({s.now - n.facts_at:.0f}s old)"))
    # audit head
    if n.audit_problem:
        out.append(
            fail(
                f"audit {name}",
                f"{name}'s audit chain: {n.audit_problem}",
                "see docs/audit.md; run letsinfer audit verify there",
            )
        )
    # firewall: the same verdict `doctor` gives on that host
    out.append(firewall_finding((n.facts or {}).get("firewall"), node=name))
    if n.paused:
        out.append(
            warn(
                f"node {name}",
                f"{name} is paused: it admits no new requests",
                f"letsinfer node resume {name}",
            )
        )
    return out


def _heard(n: NodeRecord) -> float:
    """When the main last heard the node: its facts, or a report it shed while
    busy (a node is not unreachable because the main was too busy to listen)."""
    return max(n.facts_at or 0.0, n.last_seen or 0.0)


def _groups(s: ClusterState, names: dict[str, str]) -> list[Finding]:
    out = []
    stale = {
        n.id
        for n in s.nodes
        if n.role != "main" and (n.facts_at is None or s.now - _heard(n) > s.stale_after_s)
    }
    meant = [g for g in s.groups if g.desired == "running"]
    for g in meant:
        node = names.get(g.node_id, g.node_id)
        check = f"group {g.id}"
        where = f"model {g.service}, group {g.id} on {node}"
        if g.node_id in stale:
            out.append(fail(check, f"{where}: its node's facts are stale", f"bring {node} back"))
        elif g.paused_reason:
            out.append(
                fail(
                    check,
                    f"{where} is paused: {g.paused_reason}",
                    f"letsinfer model resume {g.service}",
                )
            )
        elif g.state != "ready":
            reason = f": {g.detail}" if g.detail else ""
            out.append(
                fail(
                    check,
                    f"{where} is {g.state}{reason}",
                    f"letsinfer model show {g.service}; see the engine log on {node}",
                )
            )
    if not out:
        out.append(ok("groups", f"all {len(meant)} placement group(s) meant to run are ready"))
    return out


def gather(
    store: AuthorityStore,
    main_id: str,
    main_pid: int | None,
    main_cert_not_after: float | None,
    anchor_problems: list[str],
    stale_after_s: float,
) -> ClusterState:
    return ClusterState(
        main_id=main_id,
        main_pid=main_pid,
        main_cert_not_after=main_cert_not_after,
        nodes=store.list_nodes(),
        groups=store.list_placement_groups(),
        claims=store.gpu_claims(),
        anchor_problems=anchor_problems,
        stale_after_s=stale_after_s,
        now=time.time(),
    )


def check_main(
    home: Home, identity: NodeIdentity, store: AuthorityStore, stale_after_s: float
) -> list[Finding]:
    """The cluster's findings from the main in ``home``: `doctor --cluster` on
    the main, and the admin API's answer to it from a controller."""
    from letsinfer.audit.anchor import HeadAnchor, check_anchor
    from letsinfer.trust import pki
    from letsinfer.trust.material import tls_files

    try:
        cert = pki.load_cert(tls_files(home, identity).cert.read_bytes())
        not_after: float | None = cert.not_valid_after_utc.timestamp()
    except (OSError, pki.CertificateError):
        not_after = None
    anchored = check_anchor(HeadAnchor.for_home(home), store)
    state = gather(
        store,
        identity.node_id,
        home.running_pid(),
        not_after,
        list(anchored.problems),
        stale_after_s,
    )
    return check_cluster(state)
