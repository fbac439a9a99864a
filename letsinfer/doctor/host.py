"""Every check of one machine, in the order a person would fix them.

``HostPlan`` says what to check (which ports, which clock reference, whether
letsinfer is installed); ``check_host`` runs the checks. The plan comes from
the node's config (``letsinfer doctor``, letsinfer.doctor.node) or from
arguments before install (``python -m letsinfer.doctor``). Standard library
only: what needs an installed letsinfer arrives as ``extra`` checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from letsinfer.agent.firewall import table_loaded
from letsinfer.doctor import mdns, system
from letsinfer.doctor.clock import MAIN_NO_REFERENCE, NO_REFERENCE, TimeSource, check_clock
from letsinfer.doctor.findings import Finding
from letsinfer.doctor.firewall import firewall_finding
from letsinfer.doctor.gpus import check_gpus, open_probe
from letsinfer.doctor.ports import Port, check_port
from letsinfer.home import Home


@dataclass
class HostPlan:
    home: Home
    main: bool  # a main (or a home that `up` would make one): gateway and control too
    ports: list[Port]
    clock: list[TimeSource] = field(default_factory=list)
    discovery: bool = True
    fake_gpus: str | None = None
    # Checks that need letsinfer installed (config, engine runtime, certificates),
    # run first; empty before install.
    extra: list[Callable[[], list[Finding]]] = field(default_factory=list)
    installed: bool = True


def check_host(plan: HostPlan) -> list[Finding]:
    findings = [system.python_version()]
    for extra in plan.extra:
        findings += extra()
    gpus = check_gpus(plan.fake_gpus, open_probe)
    findings += gpus
    has_gpus = any(f.check.startswith("gpu ") for f in gpus)
    findings.append(system.open_files(plan.main))
    findings.append(system.locked_memory(has_gpus))
    findings.append(system.disk(plan.home.var))
    findings.append(check_clock(plan.clock, MAIN_NO_REFERENCE if plan.main else NO_REFERENCE))
    pid = plan.home.running_pid()
    own = {pid} if pid else set()
    findings += [check_port(p, own) for p in plan.ports]
    findings.append(mdns.check_mdns(plan.discovery))
    findings.append(firewall_finding(table_loaded(), plan.installed))
    return findings
