"""An external model's provider, as plain data: what the directory reads
from the authority and what a routing table's replica stands for (the
requests themselves are letsinfer.gateway.external's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GROUP_PREFIX = "external:"


@dataclass(frozen=True)
class ExternalModel:
    url: str  # the provider's API base, e.g. https://api.example.com/v1
    provider_model: str  # the name the provider knows it by
    key_file: str | None  # a file holding the provider's API key (None: no key)
    ca_file: str | None = None  # verify the provider's TLS against this CA
    concurrency: int = 64  # requests at the provider at once

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ExternalModel:
        return cls(
            url=str(data["url"]),
            provider_model=str(data["provider_model"]),
            key_file=data.get("key_file"),
            ca_file=data.get("ca_file"),
            concurrency=int(data["concurrency"]),
        )
