#!/usr/bin/python
# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module letsinfer_node: a letsinfer node's facts and run state."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: letsinfer_node
short_description: Read a letsinfer node's facts and start, stop or initialise it
version_added: "1.0.0"
description:
  - Talks to the node on the managed host through its C(letsinfer) command
    (C(status --json), C(service ...)); the node's local admin socket will
    replace that transport later.
  - O(state=info) only reads; the other states compare the node with the wanted
    state and act only when they differ.
  - O(state=started) uses letsinfer's own supervisor (C(letsinfer service start)),
    for hosts where systemd does not run. Where systemd runs, manage the
    C(letsinfer) unit with M(ansible.builtin.systemd_service).
  - O(state=restarted) is C(letsinfer service restart), with either manager (give
    O(unit) where systemd runs the node); the node's engines keep serving and
    the new process adopts them.
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
  state:
    description:
      - V(info) reports the node and changes nothing.
      - V(initialised) makes a fresh home a node of the given O(role), either the main
        (its first API key is returned once in RV(api_key)) or a candidate
        waiting to be enrolled (C(letsinfer node init)); a home that already is
        a node is left alone.
      - V(started) starts the node if it is not running (initialising a fresh home
        as O(role) first). A main is started once its gateway answers; a candidate
        or child, which runs no gateway, once its agent port answers.
      - V(stopped) stops it and ends any process left from this installation
        (command line mentioning one of O(sweep_paths)) in this mount namespace.
      - V(restarted) restarts it so that its engines keep serving (C(letsinfer service
        restart)), or starts it if it is not running.
    type: str
    choices: [info, initialised, started, stopped, restarted]
    default: info
  executable:
    description: Path of the C(letsinfer) command on the host.
    type: path
    default: /opt/letsinfer/current/bin/letsinfer
  home:
    description: The node's home (C(--home)); empty for the default (/etc, /var/lib, /run).
    type: path
  name:
    description: The node's name when it is initialised (default its host name).
    type: str
  role:
    description:
      - What a fresh home becomes with O(state=initialised) or O(state=started).
      - V(main) runs the gateway and the cluster's authority.
      - V(candidate) runs only the agent plane and waits for the main to enroll
        it (M(letsinfer.cluster.letsinfer_enrollment)); it becomes a V(child) then.
      - A home initialised as the main is never turned into a candidate; the
        module fails instead (wipe the host first).
    type: str
    choices: [main, candidate]
    default: main
  unit:
    description:
      - With O(state=restarted), the systemd unit that runs the node (C(systemctl
        restart) through it); empty where letsinfer's own supervisor runs it.
    type: str
  timeout:
    description: Seconds to wait for the node to start or stop.
    type: int
    default: 60
  return_api_key:
    description:
      - Return a first API key created by this call in RV(api_key). Set it to
        V(false) where the key is not wanted, so it never reaches a log.
    type: bool
    default: true
  sweep_paths:
    description:
      - With O(state=stopped), processes whose command line mentions one of these
        paths are ended as well (engines, a node started by hand).
    type: list
    elements: path
    default: []
notes:
  - The API key in RV(api_key) is a secret; register the result with C(no_log).
author:
  - letsinfer contributors
"""

EXAMPLES = r"""
- name: Service | Read the node
  letsinfer.cluster.letsinfer_node:
    state: info
  register: node

- name: Service | Make this host the main node
  letsinfer.cluster.letsinfer_node:
    state: initialised
    name: "{{ inventory_hostname }}"
  register: main_init
  no_log: true

- name: Service | Make this host a candidate, waiting to be enrolled
  letsinfer.cluster.letsinfer_node:
    state: initialised
    role: candidate
    name: "{{ inventory_hostname }}"

- name: Service | Start the node without systemd
  letsinfer.cluster.letsinfer_node:
    state: started

- name: Wipe | Stop the node and anything left from /opt/letsinfer
  letsinfer.cluster.letsinfer_node:
    state: stopped
    sweep_paths: [/opt/letsinfer]
"""

RETURN = r"""
installed:
  description: Whether the letsinfer command exists at O(executable).
  returned: always
  type: bool
version:
  description: The installed letsinfer version, or null.
  returned: always
  type: str
  sample: 0.1.0
node:
  description: The node as C(letsinfer status --json) reports it after the change.
  returned: when installed
  type: dict
  sample: {"initialised": true, "running": true, "role": "main", "name": "main",
           "fingerprint": "3f9a..."}
api_key:
  description: The first API key of a main initialised by this call; shown only once.
  returned: when this call initialised the main and O(return_api_key) is true
  type: str
restart:
  description: What C(letsinfer service restart --json) said (old and new pid, engines kept).
  returned: when O(state=restarted) restarted a running node, or went through O(unit)
  type: dict
  sample: {"restarted": true, "old_pid": 812, "pid": 907, "engines_kept": 2}
swept:
  description: PIDs of leftover processes that O(state=stopped) ended.
  returned: when O(state=stopped)
  type: list
  elements: int
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.letsinfer.cluster.plugins.module_utils.letsinfer_cli import (  # noqa: E402
    CliError,
    LetsinferCli,
    processes_mentioning,
    terminate,
)

_EMPTY = {"initialised": False, "running": False, "role": None}


class Node:
    """Compares the node with the wanted state; acts only outside check mode."""

    def __init__(self, cli, check_mode=False, find=processes_mentioning, kill=terminate):
        self.cli = cli
        self.check_mode = check_mode
        self._find = find
        self._kill = kill

    def facts(self):
        if not self.cli.installed():
            return {**_EMPTY}
        return self.cli.status()

    def ensure(self, state, name=None, timeout=60, sweep_paths=(), role="main", unit=None):
        before = self.facts()
        if role not in ("main", "candidate"):
            raise ValueError(f"unknown role {role!r}")
        if role == "candidate" and before.get("role") == "main" and state != "stopped":
            raise CliError(
                [self.cli.executable],
                None,
                "",
                "this host already is a main node; it cannot become a candidate "
                "(wipe it first, or make it the main in the inventory)",
            )
        result = {"changed": False, "installed": self.cli.installed()}
        result["version"] = self.cli.version()
        if state == "info":
            pass
        elif state == "initialised":
            if not before.get("initialised"):
                self._need_cli("initialise the node")
                result["changed"] = True
                if not self.check_mode:
                    result["api_key"] = self._init(name, role)
        elif state == "started":
            if not before.get("running"):
                self._need_cli("start the node")
                result["changed"] = True
                if not self.check_mode:
                    if role == "candidate" and not before.get("initialised"):
                        self._init(name, role)
                    result["api_key"] = self._start(name, timeout)
        elif state == "stopped":
            if before.get("running"):
                result["changed"] = True
                if not self.check_mode:
                    self.cli.run("service", "stop", "--json", "--timeout", str(timeout))
            leftovers = self._find(list(sweep_paths))
            result["swept"] = leftovers
            if leftovers:
                result["changed"] = True
                if not self.check_mode:
                    self._kill(leftovers)
        elif state == "restarted":
            self._need_cli("restart the node")
            result["changed"] = True
            if not self.check_mode:
                if before.get("running") or unit:
                    limit = ["--timeout", str(timeout), "--stop-timeout", str(timeout)]
                    via = ["--unit", unit] if unit else []
                    result["restart"] = self.cli.json("service", "restart", "--json", *limit, *via)
                else:
                    if role == "candidate" and not before.get("initialised"):
                        self._init(name, role)
                    result["api_key"] = self._start(name, timeout)
        else:
            raise ValueError(f"unknown state {state!r}")
        if result.get("api_key") is None:
            result.pop("api_key", None)
        after = self._predicted(before, state, role) if self.check_mode else self.facts()
        if result["installed"] or after.get("initialised"):
            result["node"] = after
        result["diff"] = {
            "before": {k: before.get(k) for k in ("initialised", "running")},
            "after": {k: after.get(k) for k in ("initialised", "running")},
        }
        return result

    def _init(self, name, role):
        """Initialise a fresh home; the main's first API key, or None for a candidate."""
        named = ["--name", name] if name else []
        if role == "candidate":
            self.cli.run("node", "init", *named)
            return None
        return self.cli.json("service", "init", "--json", *named).get("api_key")

    def _start(self, name, timeout):
        args = ["service", "start", "--json", "--timeout", str(timeout)]
        if name:
            args += ["--name", name]
        return self.cli.json(*args).get("api_key")

    def _need_cli(self, what):
        if not self.cli.installed() and not self.check_mode:
            raise CliError([self.cli.executable], None, "", f"cannot {what}: not installed")

    @staticmethod
    def _predicted(before, state, role="main"):
        after = dict(before)
        if state in ("initialised", "started", "restarted"):
            if not after.get("initialised"):
                after["role"] = role
            after["initialised"] = True
        if state in ("started", "restarted"):
            after["running"] = True
        if state == "stopped":
            after["running"] = False
        return after


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {
                "type": "str",
                "default": "info",
                "choices": ["info", "initialised", "started", "stopped", "restarted"],
            },
            "executable": {"type": "path", "default": "/opt/letsinfer/current/bin/letsinfer"},
            "home": {"type": "path"},
            "name": {"type": "str"},
            "role": {"type": "str", "default": "main", "choices": ["main", "candidate"]},
            "timeout": {"type": "int", "default": 60},
            "unit": {"type": "str"},
            "sweep_paths": {"type": "list", "elements": "path", "default": []},
            "return_api_key": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    cli = LetsinferCli(
        lambda argv: module.run_command(argv), executable=p["executable"], home=p["home"]
    )
    node = Node(cli, check_mode=module.check_mode)
    try:
        result = node.ensure(
            p["state"], p["name"], p["timeout"], p["sweep_paths"], role=p["role"], unit=p["unit"]
        )
    except CliError as exc:
        module.fail_json(msg=str(exc), rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    if not p["return_api_key"]:
        result.pop("api_key", None)
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
