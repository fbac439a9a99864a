"""The firewall role's own nftables table, rendered for hosts of a test lab
(the role's template and defaults, with the collection's Jinja tests), so a
cluster test can run behind the real rules."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml
from ansible_collections.letsinfer.cluster.plugins.test.inventory import ip_address, ip_network

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "roles" / "firewall"


def render(
    members: list[str],
    mains: list[str],
    lan: list[str],
    exposure_port: int = 0,
    exposure_sources: list[str] | None = None,
) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.tests["letsinfer.cluster.ip_address"] = ip_address
    env.tests["letsinfer.cluster.ip_network"] = ip_network
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    template = env.from_string((ROLE / "templates" / "letsinfer.nft.j2").read_text())
    return template.render(
        {
            **defaults,
            "ansible_managed": "rendered by tests/firewall.py",
            "firewall_member_addresses": members,
            "firewall_main_addresses": mains,
            "firewall_lan_ranges": lan,
            "firewall_exposure_port": exposure_port,
            "firewall_exposure_sources": exposure_sources or [],
        }
    )
