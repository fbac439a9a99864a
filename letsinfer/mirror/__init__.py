"""The node's mirror: imported artifacts kept by sha256, and the catalog that lists them."""
