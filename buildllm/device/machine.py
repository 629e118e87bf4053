"""Which machine a measurement was taken on: its fingerprint and a short stable id.

A benchmark measures (code, params, machine); DVC sees the first two through deps and params, and
the third through `metrics/machine.json`, which the `machine` stage rewrites at every `dvc repro`.
The fingerprint holds only what decides speed and stays put on one machine: the CPU's model and kind
(family and model numbers), cores and the instruction sets that choose kernels, total memory, each
GPU, the torch/CUDA/driver versions and what `device: auto` resolves to. Nothing volatile (free
memory, load, a date): on the same machine the file is byte-identical, so the stages that depend on
it stay cached; on another machine it differs, so they measure again.

`machine_id(fingerprint)` names the machine in folders (`benchmarks/<machine-id>/`) and in tune's records.

BUILDLLM_MACHINE_OVERRIDE: a JSON object merged into the fingerprint (for tests, and to try what a
pipeline does on another machine): `BUILDLLM_MACHINE_OVERRIDE='{"cpu_model": "Other CPU"}'`.
The fingerprint then says `machine_override: true`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import subprocess

import psutil
import torch

from buildllm.device.available import best_device
from buildllm.device.device import cpuinfo, processor_name
from buildllm.errors import UserError

OVERRIDE = "BUILDLLM_MACHINE_OVERRIDE"
# /proc/cpuinfo flag -> fingerprint key: the instruction sets oneDNN and torch pick kernels by.
ISA_FLAGS = {
    "avx2": "avx2",
    "avx512f": "avx512",
    "avx512_bf16": "avx512_bf16",
    "amx_tile": "amx",
    "amx_bf16": "amx_bf16",
    "avx512_fp16": "avx512_fp16",
}
_NOISE = re.compile(r"\((?:R|TM|tm|r)\)|\b(?:CPU|Processor|with Radeon Graphics)\b|\s*@.*$|\d+-Core")


def _quota_cores() -> float:
    """A cgroup v2 CPU quota in cores (a container limited to 2.5 CPUs), else 0: none set."""
    with contextlib.suppress(OSError, ValueError), open("/sys/fs/cgroup/cpu.max") as handle:
        quota, period = handle.read().split()[:2]
        return 0.0 if quota == "max" else round(int(quota) / int(period), 2)
    return 0.0


def kernel_module_version(text: str) -> str | None:
    """The version in /proc/driver/nvidia/version: "... Kernel Module  535.104.05 ..." or, on the open
    modules, "... Open Kernel Module for x86_64  580.159.04 ..." (where the next word is "for")."""
    found = re.search(r"Kernel Module\b[^\n]*?\s(\d+(?:\.\d+)+)\s", text)
    return found.group(1) if found else None


def _driver_version() -> str:
    with contextlib.suppress(OSError), open("/proc/driver/nvidia/version") as handle:
        if found := kernel_module_version(handle.read()):
            return found
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        command = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout.split()
        return out[0] if out else ""
    return ""


def _override() -> dict:
    text = os.environ.get(OVERRIDE, "").strip()
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(
            f'{OVERRIDE} is not JSON ({exc}); give an object such as \'{{"cpu_model": "Other"}}\' or unset it'
        ) from None
    if not isinstance(extra, dict) or not all(isinstance(v, (bool, int, float, str)) for v in extra.values()):
        raise UserError(f"{OVERRIDE} must be a JSON object of numbers and strings; unset it or fix it")
    return {**extra, "machine_override": True}


def cpu_kind() -> str:
    """The CPU's family and model numbers ("" where /proc/cpuinfo has none). The name alone can hide the
    kind: a hypervisor that calls every AMD EPYC "AMD EPYC", with the same AVX2 flags, showed a Zen 1
    (family 23 model 1) and a Zen 3 (family 25 model 1) as one machine, whose measured decisions
    then stayed cached from one to the other, while the Zen 3 trained iteration 1 about 1.7x as fast
    (classic's 500 steps: 117 s against 204 s, 2026-12-06/07)."""
    if family := cpuinfo("cpu family"):
        model = cpuinfo("model\t", "model:")  # not "model name"
        return f"family {family} model {model}"
    if implementer := cpuinfo("CPU implementer"):  # ARM
        return f"implementer {implementer} part {cpuinfo('CPU part')}"
    return ""


def fingerprint() -> dict:
    flags = set(cpuinfo("flags", "Features").split())  # "Features" on ARM
    record = {
        "cpu_model": processor_name(),
        "cpu_kind": cpu_kind(),
        "architecture": platform.machine(),
        "physical_cores": psutil.cpu_count(logical=False) or 0,
        "logical_cores": psutil.cpu_count(logical=True) or 0,
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "quota_cores": _quota_cores(),
        **{key: flag in flags for flag, key in ISA_FLAGS.items()},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # Rounded: the kernel's count of usable memory can move by a few pages between boots.
        "memory_total_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "none",
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    for index in range(record["gpu_count"]):
        props = torch.cuda.get_device_properties(index)
        record[f"gpu{index}_name"] = props.name
        record[f"gpu{index}_memory_gib"] = round(props.total_memory / 2**30, 1)
        record[f"gpu{index}_compute_capability"] = f"{props.major}.{props.minor}"
    record["driver_version"] = _driver_version() if record["gpu_count"] else "none"
    record["auto_device"] = best_device()
    record.update(_override())
    return record


def _slug(name: str, words: int = 4) -> str:
    parts = re.findall(r"[a-z0-9+]+", _NOISE.sub(" ", name).lower().replace("+", "plus"))
    return "-".join(parts[:words]) or "unknown"


def machine_id(record: dict) -> str:
    """`<cpu-slug>[-<gpu-slug>]-<hash8>`: readable, and different whenever any fingerprint field is."""
    fields = {key: value for key, value in record.items() if key != "machine_id"}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:8]
    gpu = f"-{_slug(str(record['gpu0_name']), 3)}" if record.get("gpu0_name") else ""
    return f"{_slug(str(record.get('cpu_model', '')), 4)}{gpu}-{digest}"


def machine_label(name: str) -> str:
    short = re.sub(r"\s+", " ", _NOISE.sub(" ", name)).strip()
    return short if len(short) <= 40 else short[:39] + "…"


def machine_record() -> dict:
    """The fingerprint as metrics/machine.json holds it: names cut to label length, its id added
    (computed on the full names, so two CPUs whose names share 40 characters keep two ids)."""
    record = fingerprint()
    short = {
        key: machine_label(value) if key == "cpu_model" or key.endswith("_name") else value
        for key, value in record.items()
    }
    return {"machine_id": machine_id(record), **short}
