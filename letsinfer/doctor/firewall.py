"""The firewall's verdict, one for `doctor` on a host and `doctor --cluster`
about it (from the table state its signed facts report)."""

from __future__ import annotations

from pathlib import Path

from letsinfer.doctor.findings import Finding, ok, warn

# Where the firewall role writes letsinfer's table (firewall_rules_file).
RULES_FILE = Path("/etc/nftables.d/letsinfer.nft")


def firewall_finding(
    loaded: bool | None, installed: bool = True, node: str | None = None
) -> Finding:
    """One verdict for a host's firewall, from `doctor` on it or from `doctor
    --cluster` about it: a missing table is a warning (a hand-run node is
    open until the operator loads it), with a fix that works there."""
    check = f"firewall {node}" if node else "firewall"
    if loaded:
        return ok(check, "nftables table inet letsinfer is loaded")
    if not installed:
        return ok(check, "table inet letsinfer not loaded yet: the firewall role loads it")
    if loaded is None:
        return warn(
            check,
            f"cannot tell whether {node or 'this host'} has nftables table inet letsinfer "
            "loaded (no nft, or not root)",
            "install nftables and run letsinfer (and doctor) as root",
        )
    playbook = "letsinfer fleet apply firewall -i INVENTORY (docs/fleet.md)"
    if node is not None:
        fix = f"on {node}: nft -f {RULES_FILE} if the firewall role wrote it, else {playbook}"
    elif RULES_FILE.is_file():
        fix = f"nft -f {RULES_FILE}"
    else:
        fix = playbook
    return warn(
        check,
        f"{node or 'this host'} has no nftables table inet letsinfer: its control, agent and "
        "engine ports are open to any host that reaches them",
        fix,
    )
