"""``python -m letsinfer.doctor``: the checks of this machine before letsinfer
is installed, from the wheel alone (standard library only). site.yml runs it
on each host before it changes anything; once letsinfer is installed, use
``letsinfer doctor``.

  python3 -S -c 'import sys, runpy; sys.path.insert(0, sys.argv.pop(1));
  runpy.run_module("letsinfer.doctor", run_name="__main__")' letsinfer.whl --json
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

from letsinfer.doctor.clock import HttpTimeSource, TimeSource, parse_ntp
from letsinfer.doctor.findings import failures, plain_text, report
from letsinfer.doctor.host import HostPlan, check_host
from letsinfer.doctor.ports import Port
from letsinfer.home import Home

DEFAULT_PORTS = {
    "main": ["gateway=8000", "control=8443", "agent=8444", "metrics=127.0.0.1:9400"],
    "child": ["agent=8444"],
}


# What each port is, and where its config.toml setting is.
_KNOWN = {
    "gateway": ("gateway", "[gateway] port"),
    "control": ("control plane", "[control] port"),
    "agent": ("agent plane", "[agent] api_port"),
    "metrics": ("metrics", "[gateway] metrics_port"),
}


def _port(text: str) -> Port:
    name, _, where = text.partition("=")
    host, _, port = where.rpartition(":")
    if not name or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=[HOST:]PORT, got {text!r}")
    label, setting = _KNOWN.get(name, (name, "its setting"))
    return Port(label, host or "0.0.0.0", int(port), setting)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m letsinfer.doctor",
        description="Check this machine before letsinfer is installed on it.",
    )
    parser.add_argument("--home", help="the home letsinfer will use (default: as root, /etc, ...)")
    parser.add_argument("--role", choices=("main", "child"), default="child")
    parser.add_argument(
        "--port",
        action="append",
        type=_port,
        metavar="NAME=[HOST:]PORT",
        help="a port the node will listen on (default: the role's)",
    )
    parser.add_argument("--ntp", metavar="HOST[:PORT]", help="an NTP server to compare with")
    parser.add_argument(
        "--reference",
        metavar="URL",
        help="an HTTP URL of the main (its gateway's /health) to compare clocks with",
    )
    parser.add_argument("--no-discovery", action="store_true", help="mDNS will be off")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)

    clock: list[TimeSource] = []
    if args.reference:
        clock.append(HttpTimeSource(args.reference, label=f"the main ({args.reference})"))
    if args.ntp:
        clock.append(parse_ntp(args.ntp))
    plan = HostPlan(
        home=Home.resolve(args.home),
        main=args.role == "main",
        ports=args.port or [_port(p) for p in DEFAULT_PORTS[args.role]],
        clock=clock,
        discovery=not args.no_discovery,
        installed=False,
    )
    findings = check_host(plan)
    if args.json:
        json.dump(report(socket.gethostname(), findings), sys.stdout)
        sys.stdout.write("\n")
    else:
        print(plain_text(findings))
    return 1 if failures(findings) else 0


if __name__ == "__main__":
    sys.exit(main())
