"""The node role's config.toml, rendered from its template and defaults with
Ansible's own filters, as letsinfer reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import yaml
from ansible.plugins.filter.core import FilterModule

from letsinfer import config

ROLE = Path(__file__).resolve().parent.parent / "roles" / "node"


def node_config(tmp_path: Path, **variables: Any) -> config.Settings:
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True
    )  # as the template module renders
    env.filters.update(FilterModule().filters())
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    template = env.from_string((ROLE / "templates" / "config.toml.j2").read_text())
    text = template.render(
        {
            **defaults,
            "ansible_managed": "rendered by tests/test_ansible_node_config.py",
            "node_advertise_address": "",  # its default reads the inventory
            **variables,
        }
    )
    path = tmp_path / "config.toml"
    path.write_text(text)
    return config.load(path, environ={})


def test_an_air_gapped_site_turns_the_hub_off(tmp_path: Path) -> None:
    settings = node_config(tmp_path, node_hub_enabled=False)
    assert settings.hub.enabled is False


def test_a_site_points_pulls_at_its_own_hub_with_a_token(tmp_path: Path) -> None:
    settings = node_config(
        tmp_path,
        node_hub_endpoint="https://hub.site.example/",
        node_hub_token_file="/etc/letsinfer/hub-token",
        node_hub_timeout_s=3,
    )
    assert settings.hub.enabled is True
    assert settings.hub.endpoint == "https://hub.site.example"
    assert settings.hub.token_file == "/etc/letsinfer/hub-token"
    assert settings.hub.timeout_s == 3


def test_the_role_s_defaults_keep_letsinfer_s_hub_settings(tmp_path: Path) -> None:
    assert node_config(tmp_path).hub == config.HubSettings()
