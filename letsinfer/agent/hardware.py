"""What a node has: CPUs, memory and GPUs, behind one small seam.

``NvmlProbe`` is the real path (nvidia-ml-py over the driver's NVML); it is
used whenever NVML initialises. ``FakeGpuProbe`` reads a JSON file describing
GPUs, for tests and lab hosts without a GPU, and answers the same interface
(set ``[hardware] fake_gpus = "/path/gpus.json"`` or ``LETSINFER_HARDWARE__FAKE_GPUS``).
The file is a list of GPUs, or ``{"driver": "550.54", "gpus": [...]}``.
Standard library only at import (``letsinfer doctor`` runs before install).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    name: str
    memory_total: int
    memory_free: int
    temperature_c: int | None = None
    power_w: float | None = None
    utilization: int | None = None  # percent
    mig: bool = False
    # Uncorrected ECC errors since the driver loaded (None: no ECC, or unknown).
    # For `doctor` only: not part of the signed facts.
    ecc_uncorrected: int | None = None


# GpuInfo fields that go into the signed facts (letsinfer.contracts.facts.GpuFact).
_FACT_FIELDS = ("uuid", "name", "memory_total", "memory_free", "temperature_c", "power_w")
_FACT_FIELDS += ("utilization", "mig")


class GpuProbe(Protocol):
    def gpus(self) -> list[GpuInfo]: ...

    def driver_version(self) -> str | None: ...


class NoGpus:
    def gpus(self) -> list[GpuInfo]:
        return []

    def driver_version(self) -> str | None:
        return None


class FakeGpuProbe:
    """GPUs described by a JSON file: a list of objects with GpuInfo's fields,
    or an object with ``driver`` and ``gpus``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _read(self) -> dict[str, Any]:
        data = json.loads(self.path.read_text())
        return data if isinstance(data, dict) else {"gpus": data}

    def gpus(self) -> list[GpuInfo]:
        listed: list[dict[str, Any]] = self._read().get("gpus", [])
        return [GpuInfo(**{"memory_free": g.get("memory_total", 0), **g}) for g in listed]

    def driver_version(self) -> str | None:
        driver = self._read().get("driver", "fake")
        return str(driver) if driver is not None else None


class NvmlProbe:
    """The real thing. Each call reads current values (free memory, temperature)."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml

    def gpus(self) -> list[GpuInfo]:
        nv = self._nvml
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out.append(
                GpuInfo(
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    name=_text(nv.nvmlDeviceGetName(h)),
                    memory_total=int(mem.total),
                    memory_free=int(mem.free),
                    temperature_c=_try(
                        lambda h=h: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                    ),
                    power_w=_try(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                    utilization=_try(lambda h=h: int(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
                    mig=bool(_try(lambda h=h: nv.nvmlDeviceGetMigMode(h)[0]) or False),
                    ecc_uncorrected=_try(
                        lambda h=h: int(
                            nv.nvmlDeviceGetTotalEccErrors(
                                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                            )
                        )
                    ),
                )
            )
        return out

    def driver_version(self) -> str | None:
        return _try(lambda: _text(self._nvml.nvmlSystemGetDriverVersion()))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _try(read: Any) -> Any:
    try:
        return read()
    except Exception:  # a metric the device or driver does not support
        return None


def gpu_probe(fake_gpus: str | None) -> GpuProbe:
    if fake_gpus:
        return FakeGpuProbe(Path(fake_gpus))
    try:
        return NvmlProbe()
    except Exception:  # no driver, no library: a CPU node
        return NoGpus()


def memory_available() -> int | None:
    """What the kernel says can be had without swapping (MemAvailable), in bytes."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_facts(probe: GpuProbe) -> dict[str, Any]:
    gpus = probe.gpus()
    return {
        "cpus": os.cpu_count() or 1,
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "memory_available": memory_available(),
        "gpus": [{k: v for k, v in asdict(g).items() if k in _FACT_FIELDS} for g in gpus],
        "targets": ["cpu", "cuda"] if gpus else ["cpu"],
    }
