# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Action plugin letsinfer.cluster.warning: print ``msg`` as an Ansible warning.

A play says something loudly (``[WARNING]: ...`` in the output, and in the
results that ansible-runner and ``letsinfer fleet apply`` see) without
failing: an opt-out of a protection, for example. It runs on the controller,
changes nothing and is the same in check mode.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("msg",))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        msg = str(self._task.args.get("msg") or "").strip()
        if not msg:
            raise AnsibleActionFail("letsinfer.cluster.warning needs a msg")
        result.update(changed=False, msg=msg, warnings=[msg])
        return result
