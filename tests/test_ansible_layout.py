"""The collection's shape: roles kept once, flat, every variable prefixed and specified."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
COLLECTION = ROOT / "collections" / "ansible_collections" / "letsinfer" / "cluster"


def test_the_collection_reaches_the_one_copy_of_the_roles() -> None:
    link = COLLECTION / "roles"
    assert link.is_symlink() and link.resolve() == (ROOT / "roles").resolve()
    assert {r.name for r in ROLES} >= {
        "validate_inventory",
        "node",
        "main",
        "firewall",
        "upgrade",
        "wipe",
    }


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_is_flat_prefixed_and_specified(role: Path) -> None:
    for part in ("defaults/main.yml", "tasks/main.yml", "handlers/main.yml", "meta/main.yml"):
        assert (role / part).is_file(), f"{role.name} lacks {part}"
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    # Every entry point's options (site.yml runs `tasks_from: doctor`, ...).
    options = {k: v for spec in specs.values() for k, v in spec.get("options", {}).items()}
    assert specs["main"]["options"]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    prefix = f"{role.name}_"
    for name in [*defaults, *options]:
        assert name.startswith(prefix), f"{role.name}: {name} is not prefixed {prefix}"
    assert set(defaults) <= set(options), f"{role.name}: unspecified {set(defaults) - set(options)}"
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        if name in defaults and "default" in spec:
            assert spec["default"] == defaults[name], f"{role.name}: {name} default differs"


def test_a_fresh_host_gets_this_checkout_s_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    defaults = yaml.safe_load((ROOT / "roles" / "node" / "defaults" / "main.yml").read_text())
    assert defaults["node_version"] == version
