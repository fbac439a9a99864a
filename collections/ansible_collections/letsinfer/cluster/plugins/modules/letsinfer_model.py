#!/usr/bin/python
# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module letsinfer_model: a model service served by the cluster."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: letsinfer_model
short_description: Make sure the cluster serves a model from a GGUF file or a hub repository
version_added: "1.0.0"
description:
  - Runs on the main node. Compares the model services listed by
    C(letsinfer model list --json) with the wanted one and adds it when it is
    missing, with C(letsinfer model add) for a file (O(gguf)) or with
    C(letsinfer model pull) for a hub repository at a commit (O(repo)), which
    takes it from the hub or, when the hub is off or out of reach, from the
    node's mirror, and records repo, commit and sha256 with it. The file is
    checked, hashed, proven in its engine (one real answer) and copied into
    the node's model store by letsinfer itself; a file the engine cannot
    serve fails the task with the engine's own error, and nothing is added.
  - A name the site already uses for other bytes (another O(sha256), another
    repository or commit) is refused, saying what the name serves now;
    nothing is changed. The same model under the same name is left alone.
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
    description: Path of the GGUF file on the main node (or give O(repo)).
    type: path
  sha256:
    description:
      - The sha256 of O(gguf). A model of this name with other bytes is
        refused rather than taken as present.
    type: str
  repo:
    description: A hub repository (such as C(org/model-GGUF)) to pull from (or give O(gguf)).
    type: str
  revision:
    description: The commit (or branch, tag) of O(repo); required with O(repo).
    type: str
  file:
    description: The GGUF file in O(repo) (a split model's first part); required with O(repo).
    type: str
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

- name: Models | Serve a hub model (from the mirror on an air-gapped site)
  letsinfer.cluster.letsinfer_model:
    name: org/model-GGUF:model-Q4_K_M
    repo: org/model-GGUF
    revision: 0123456789abcdef0123456789abcdef01234567
    file: model-Q4_K_M.gguf
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

    def ensure(self, name, gguf, aliases=(), engine=None, sha256=None):
        """The model from the file ``gguf`` (``model add``)."""

        def other_bytes(have):
            if sha256 and have.get("sha256") != sha256.lower():
                return f"sha256 {have.get('sha256')}, not {gguf}'s {sha256.lower()}"
            return None

        def add():
            if not self._exists(gguf):
                raise ModelError(f"{gguf}: no such file on this host")
            return ["model", "add", name, "--gguf", gguf]

        return self._ensure(name, aliases, engine, other_bytes, add)

    def ensure_pulled(self, name, repo, revision, file, aliases=(), engine=None):
        """The model ``file`` of ``repo`` at ``revision`` (``model pull``: from the hub,
        or from the node's mirror when the hub is off or out of reach)."""

        def other_bytes(have):
            files = [f.get("name") for f in have.get("files") or []]
            if (
                have.get("repo") == repo
                and revision in (have.get("commit"), have.get("revision"))
                and file in files
            ):
                return None
            if have.get("repo"):
                now = f"{have['repo']}@{have.get('commit')} ({', '.join(files)})"
            else:
                now = f"a file of its own (sha256 {have.get('sha256')})"
            return f"{now}, not {repo}@{revision} ({file})"

        def pull():
            return ["model", "pull", repo, "--file", file, "--revision", revision, "--name", name]

        return self._ensure(name, aliases, engine, other_bytes, pull)

    def _ensure(self, name, aliases, engine, other_bytes, command):
        models = {m["name"]: m for m in self.listed()}
        before = sorted(models)
        if name in models:
            # A name already in use is never taken as this model unless it
            # serves the same bytes: saying "ok" would hide that it does not.
            other = other_bytes(models[name])
            if other:
                raise ModelError(
                    f"model {name!r} already exists and serves {other}: refused, nothing "
                    "changed (give the new model another name, or remove the existing one "
                    "with `letsinfer model remove` first)"
                )
            have = sorted(models[name].get("aliases") or [])
            if aliases and have != sorted(aliases):
                raise ModelError(
                    f"model {name!r} exists with aliases {have}, not {sorted(aliases)}; "
                    "letsinfer cannot change aliases yet"
                )
            return {"changed": False, "model": models[name], "diff": self._diff(before, before)}
        args = command()
        model = {"name": name, "aliases": list(aliases)}
        if not self.check_mode:
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
            "gguf": {"type": "path"},
            "sha256": {"type": "str"},
            "repo": {"type": "str"},
            "revision": {"type": "str"},
            "file": {"type": "str"},
            "aliases": {"type": "list", "elements": "str", "default": []},
            "engine": {"type": "str", "choices": ["xllamacpp", "llama-server"]},
            "state": {"type": "str", "choices": ["present"], "default": "present"},
            "executable": {"type": "path", "default": "/opt/letsinfer/current/bin/letsinfer"},
            "home": {"type": "path"},
        },
        required_one_of=[("gguf", "repo")],
        mutually_exclusive=[("gguf", "repo"), ("sha256", "repo")],
        required_by={"repo": ("revision", "file")},
        supports_check_mode=True,
    )
    p = module.params
    cli = LetsinferCli(
        lambda argv: module.run_command(argv), executable=p["executable"], home=p["home"]
    )
    try:
        models = Models(cli, module.check_mode)
        if p["repo"]:
            result = models.ensure_pulled(
                p["name"], p["repo"], p["revision"], p["file"], p["aliases"], p["engine"]
            )
        else:
            result = models.ensure(p["name"], p["gguf"], p["aliases"], p["engine"], p["sha256"])
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
