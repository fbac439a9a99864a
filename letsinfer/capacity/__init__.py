"""Capacity that follows demand: each model's scaling policy, loads on the
first request, unloads when idle, eviction of idle on-demand groups when a
load needs their GPUs or memory, and replica counts that follow measured load.

``policy`` is the plain data an operator sets (`letsinfer model scale`);
``eviction`` chooses what may go, as a pure function; ``controller`` runs on
the main's gateway loop and decides from the gateway's own figures (requests
in flight, waiting, taken) — nothing on the request path reads the database.
"""
