"""Changing a running cluster without an outage: proof at the door, draining,
replacement before removal, runtime upgrades and rollback, cluster stop/start."""
