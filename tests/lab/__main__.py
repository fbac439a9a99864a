"""``python -m tests.lab up|down``: the lab for molecule's create/destroy playbooks.

    python -m tests.lab up --state FILE --dir DIR [--prefix P] main n1
    python -m tests.lab down --state FILE

``up`` prints the lab as JSON (hosts, addresses, key, controller namespace)
and writes it to FILE (a lab still recorded there is taken down first);
``down`` reads FILE and removes everything.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from tests.lab.netns import Lab, lab_up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--state", type=Path, required=True)
    up.add_argument("--dir", type=Path, required=True)
    up.add_argument("--prefix")
    up.add_argument(
        "--instance-config", type=Path, help="also write molecule's instance config (YAML) here"
    )
    up.add_argument("hosts", nargs="+")
    down = sub.add_parser("down")
    down.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "up":
        if args.state.exists():  # left by a run that was killed: take it down first
            Lab.load(args.state).down()
            args.state.unlink()
        lab = lab_up(args.hosts, args.dir, args.prefix)
        lab.save(args.state)
        if args.instance_config:
            args.instance_config.write_text(json.dumps(lab.molecule_instances(), indent=2))
        json.dump(asdict(lab), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not args.state.exists():
        return 0  # nothing to take down
    Lab.load(args.state).down()
    args.state.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
