"""Fleet automation from the ``letsinfer`` command: playbooks through
ansible-runner (``apply``) and single-machine onboarding over SSH (``ssh_onboard``)."""
