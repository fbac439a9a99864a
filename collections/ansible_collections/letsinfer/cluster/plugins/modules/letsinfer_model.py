#!/usr/bin/python
# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module letsinfer_model: a model service served by the cluster."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: letsinfer_model
short_description: Make sure the cluster serves a model from a GGUF file
version_added: "1.0.0"
description:
  - Runs on the main node. Compares the model services listed by
    C(letsinfer model list --json) with the wanted one and adds it with
    C(letsinfer model add) when it is missing. The file is checked, hashed,
    proven in its engine (one real answer) and copied into the node's model
    store by letsinfer itself; a file the engine cannot serve fails the task
    with the engine's own error, and nothing is added.
  - A model that exists with other aliases is reported as an error, not
    changed, since letsinfer has no command to change aliases yet.
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
options:
  name:
    description: The model's name, as clients send it.
    type: str
    required: true
  gguf:
    description: Path of the GGUF file on the main node.
    type: path
    required: true
  aliases:
    description: Other names clients may use.
    type: list
    elements: str
    default: []
  engine:
    description: The engine to run it (default the node's configured engine).
    type: str
    choices: [xllamacpp, llama-server]
  state:
    description: Only V(present) for now.
    type: str
    choices: [present]
    default: present
  executable:
    description: Path of the C(letsinfer) command on the host.
    type: path
    default: /opt/letsinfer/current/bin/letsinfer
  home:
    description: The node's home (C(--home)); empty for the default.
    type: path
author:
  - letsinfer contributors
"""

EXAMPLES = r"""
- name: Models | Serve qwen from the main's disk
  letsinfer.cluster.letsinfer_model:
    name: qwen2.5-7b
    gguf: /srv/models/qwen2.5-7b-instruct-q4_k_m.gguf
    aliases: [qwen]
"""

RETURN = r"""
model:
  description: The model service as C(letsinfer model list --json) reports it.
  returned: success
  type: dict
  sample: {"name": "qwen2.5-7b", "aliases": ["qwen"], "sha256": "…", "ready": 1, "total": 1}
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.letsinfer.cluster.plugins.module_utils.letsinfer_cli import (  # noqa: E402
    CliError,
    LetsinferCli,
)


class ModelError(Exception):
    pass


class Models:
    def __init__(self, cli, check_mode=False, exists=os.path.isfile):
        self.cli = cli
        self.check_mode = check_mode
        self._exists = exists

    def listed(self):
        if not self.cli.installed():
            if self.check_mode:
                return []
            raise ModelError(f"letsinfer is not installed at {self.cli.executable}")
        return self.cli.json("model", "list", "--json")

    def ensure(self, name, gguf, aliases=(), engine=None):
        models = {m["name"]: m for m in self.listed()}
        before = sorted(models)
        if name in models:
            have = sorted(models[name].get("aliases") or [])
            if aliases and have != sorted(aliases):
                raise ModelError(
                    f"model {name!r} exists with aliases {have}, not {sorted(aliases)}; "
                    "letsinfer cannot change aliases yet"
                )
            return {"changed": False, "model": models[name], "diff": self._diff(before, before)}
        if not self._exists(gguf):
            raise ModelError(f"{gguf}: no such file on this host")
        model = {"name": name, "aliases": list(aliases)}
        if not self.check_mode:
            args = ["model", "add", name, "--gguf", gguf]
            for alias in aliases:
                args += ["--alias", alias]
            if engine:
                args += ["--engine", engine]
            self.cli.run(*args)
            model = {m["name"]: m for m in self.listed()}.get(name, model)
        diff = self._diff(before, sorted([*before, name]))
        return {"changed": True, "model": model, "diff": diff}

    @staticmethod
    def _diff(before, after):
        return {
            "before": "".join(f"{n}\n" for n in before),
            "after": "".join(f"{n}\n" for n in after),
            "before_header": "models",
            "after_header": "models",
        }


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "gguf": {"type": "path", "required": True},
            "aliases": {"type": "list", "elements": "str", "default": []},
            "engine": {"type": "str", "choices": ["xllamacpp", "llama-server"]},
            "state": {"type": "str", "choices": ["present"], "default": "present"},
            "executable": {"type": "path", "default": "/opt/letsinfer/current/bin/letsinfer"},
            "home": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    cli = LetsinferCli(
        lambda argv: module.run_command(argv), executable=p["executable"], home=p["home"]
    )
    try:
        result = Models(cli, module.check_mode).ensure(
            p["name"], p["gguf"], p["aliases"], p["engine"]
        )
    except ModelError as exc:
        module.fail_json(msg=str(exc))
    except CliError as exc:
        module.fail_json(msg=str(exc), rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
