"""What the main knows about its cluster, for people and for Prometheus: an
in-memory view of nodes and placement groups (refreshed by the main's
background loop, so a scrape reads no database), the Prometheus series made
from it at scrape time, and ``letsinfer top``."""
