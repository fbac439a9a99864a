"""``python -m letsinfer.service.checkconfig FILE``: exit 0 when FILE is a valid
config.toml, else print the key and the reason and exit 2.

Configuration management validates a new file with it before it replaces the
working one (Ansible's ``validate:``). Environment overrides are ignored: the
file alone is checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from letsinfer.config import ConfigError, load


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m letsinfer.service.checkconfig FILE", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"{path}: no such file", file=sys.stderr)
        return 2
    try:
        load(path, environ={})
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
