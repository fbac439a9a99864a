"""Why a model cannot be served right now, and what to tell its clients.

Only a transient gap (a group starting, restarting or draining) is
``no_healthy_replica`` with ``Retry-After``. A model that will not serve until
someone acts gets its own answer at once: the cluster is stopped, the model is
stopped, it is placed nowhere, or every group it should run is parked. The
same classification decides ``/health``: only models meant to serve count.
Read from the in-memory directory and routing table, never the database.
"""

from __future__ import annotations

from typing import Literal, Protocol

from letsinfer.gateway.directory import Directory, StoreUnavailable
from letsinfer.gateway.errors import (
    GatewayError,
    model_not_placed,
    model_parked,
    model_stopped,
    no_replica,
    system_stopped,
)
from letsinfer.gateway.routing import RoutingTable

State = Literal[
    "serving", "gap", "parked", "stopped", "not placed", "system stopped", "unloaded", "loading"
]

# What /health waits for. A model loaded on demand is not: unloaded, or
# loading for a request, it serves as it should (letsinfer.capacity).
MEANT_TO_SERVE: tuple[State, ...] = ("serving", "gap")


class Loads(Protocol):
    def loading(self, service: str) -> bool: ...


class Availability:
    def __init__(self, directory: Directory, routing: RoutingTable) -> None:
        self.directory = directory
        self.routing = routing
        self.loads: Loads | None = None  # the capacity controller, on a main

    def system_stopped(self) -> bool:
        try:
            return self.directory.current().system_stopped
        except StoreUnavailable:
            return False

    def state(self, service: str) -> State:
        if self.routing.ready_count(service):
            return "serving"
        try:
            snapshot = self.directory.current()
        except StoreUnavailable:
            return "gap"
        if snapshot.system_stopped:
            return "system stopped"
        entry = snapshot.names.get(service)
        if entry is None:
            return "gap"
        if entry.base is not None:  # a LoRA adapter serves as its base model does
            return self.state(entry.base)
        if entry.scaling is not None:
            if self.loads is not None and self.loads.loading(service):
                return "loading"
            if entry.scaling.on_demand and not entry.groups:
                return "unloaded"
        if not entry.groups and not self.routing.knows(service):
            return "not placed"
        if entry.groups and not entry.running:
            return "stopped"
        parked = self.routing.parked(service)
        if parked and (entry.running or parked.keys()) <= parked.keys():
            return "parked"
        return "gap"

    def refusal(self, service: str, failures: str) -> GatewayError:
        """The error for a request that found no usable replica of ``service``."""
        state = self.state(service)
        if state == "system stopped":
            return system_stopped()
        if state == "stopped":
            return model_stopped(service)
        if state == "not placed":
            return model_not_placed(service)
        if state == "parked":
            return model_parked(service, self.routing.parked(service))
        return no_replica(service, failures or self.routing.explain(service))
