"""GPUs through NVML (the seam in letsinfer.agent.hardware, with its fake):
the driver, and per GPU its memory, temperature, ECC errors and MIG mode.

Before letsinfer is installed the NVML bindings are not there yet; then the
driver library itself is looked for, and the GPUs are checked once installed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from letsinfer.agent.hardware import FakeGpuProbe, GpuProbe, NvmlProbe
from letsinfer.doctor.findings import Finding, fail, ok, warn

HOT_WARN_C = 85
HOT_FAIL_C = 95
GIB = 1 << 30


def _driver_library() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def open_probe(fake_gpus: str | None) -> tuple[GpuProbe | None, Finding | None]:
    """The probe to use, or None and the finding that says why there is none."""
    if fake_gpus:
        from pathlib import Path

        return FakeGpuProbe(Path(fake_gpus)), None
    try:
        return NvmlProbe(), None
    except ImportError:
        if _driver_library():
            return None, ok(
                "gpus",
                "the NVIDIA driver library is present; GPUs are checked once letsinfer "
                "is installed (NVML bindings)",
            )
        return None, ok("gpus", "no NVIDIA driver: this node serves on its CPUs")
    except Exception as exc:  # pynvml.NVMLError and friends
        text = str(exc) or type(exc).__name__
        if "LibraryNotFound" in type(exc).__name__ or "not found" in text.lower():
            return None, ok("gpus", "no NVIDIA driver: this node serves on its CPUs")
        return None, fail(
            "gpus",
            f"NVML does not initialise: {text}",
            "reboot after a driver upgrade, or reinstall the NVIDIA driver",
        )


def check_gpus(
    fake_gpus: str | None, opener: Callable[[str | None], tuple[GpuProbe | None, Finding | None]]
) -> list[Finding]:
    probe, why = opener(fake_gpus)
    if probe is None:
        return [why] if why else []
    try:
        gpus = probe.gpus()
        driver = probe.driver_version()
    except Exception as exc:  # a driver that answers init but not queries
        return [fail("gpus", f"NVML query failed: {exc}", "check the driver (nvidia-smi)")]
    if not gpus:
        return [ok("gpus", f"NVIDIA driver {driver or '?'}, no GPU: this node serves on CPUs")]
    out = [ok("gpus", f"NVIDIA driver {driver or '?'}, {len(gpus)} GPU(s)")]
    for g in gpus:
        check = f"gpu {g.uuid}"
        said = f"{g.name}: {g.memory_free / GIB:.1f} of {g.memory_total / GIB:.1f} GiB free" + (
            f", {g.temperature_c}°C" if g.temperature_c is not None else ""
        )
        if g.ecc_uncorrected:
            out.append(
                fail(
                    check,
                    f"{said}; {g.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded",
                    "drain the GPU and reset it (nvidia-smi -r), or retire it",
                )
            )
        elif g.temperature_c is not None and g.temperature_c >= HOT_FAIL_C:
            out.append(
                fail(check, f"{said}: too hot", "check cooling and airflow before serving on it")
            )
        elif g.temperature_c is not None and g.temperature_c >= HOT_WARN_C:
            out.append(warn(check, f"{said}: hot", "check cooling and airflow"))
        elif g.mig:
            out.append(
                warn(
                    check,
                    f"{said}; MIG mode is on: letsinfer places whole GPUs by UUID",
                    "turn MIG off on this GPU (nvidia-smi -i ID -mig 0), or keep it out of "
                    "placements",
                )
            )
        else:
            out.append(ok(check, said))
    return out
