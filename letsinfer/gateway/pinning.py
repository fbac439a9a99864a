"""Pinning a request to one placement group (``X-Letsinfer-Group: PG``): for
the main's own eval key only (letsinfer.evals.key, ``letsinfer eval --group``),
so an eval measures exactly the group it names. Every other key sending the
header is refused (403): a client must not choose where its requests go
around the gateway's routing. The name is one ``auth key create`` refuses (a
colon), so no client key can carry it.

The handler reads the header with the others; the express lane hands a
request that carries it to the handler (one comparison per header)."""

from __future__ import annotations

from letsinfer.gateway.errors import GatewayError
from letsinfer.gateway.routing import RoutingTable

EVAL_KEY_NAME = "letsinfer:eval"


def pinned_group(value: bytes, key_name: str, service: str, routing: RoutingTable) -> str:
    """The group a request with ``X-Letsinfer-Group: value`` must go to, or
    GatewayError: 403 for any key but the eval key, 400 for a group that is
    not one of ``service``'s."""
    if key_name != EVAL_KEY_NAME:
        raise GatewayError(
            403,
            "X-Letsinfer-Group is only for the main's own eval runs; leave it out.",
            type_="permission_error",
            code="group_pin_refused",
            param="X-Letsinfer-Group",
        )
    group = value.decode("latin-1").strip()
    if group not in {r.pg_id for r in routing.replicas(service)}:
        raise GatewayError(
            400,
            f"Model {service} has no placement group {group[:80]!r} in the gateway's routing.",
            code="invalid_group",
            param="X-Letsinfer-Group",
        )
    return group
