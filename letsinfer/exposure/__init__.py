"""Publishing the inference plane beyond the LAN: TLS on one port, to listed
sources (``letsinfer exposure``, docs/exposure.md).

Only the gateway's app (``/v1``, ``/health``, the portal) is published; the
control, agent, engine and metrics planes never are. The plain listener is
left as it is (its path and speed unchanged): TLS is a second listener.
"""
