"""What was asked of the gateway: per-request records and the usage they add up to."""
