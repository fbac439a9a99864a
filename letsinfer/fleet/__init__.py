"""Fleet automation from the ``letsinfer`` command: playbooks through
ansible-runner (``apply``), and one machine onboarded from the main over SSH
(``ssh_reach`` proves the host with fabric, ``node_add`` runs node_add.yml)."""
