"""The machine fingerprint: what decides speed, nothing volatile, one id per machine."""

from __future__ import annotations

import json
import re

import pytest

from buildllm.device.device import Device
from buildllm.device.hardware import machine_name
from buildllm.device.machine import (
    OVERRIDE,
    fingerprint,
    kernel_module_version,
    machine_id,
    machine_label,
    machine_record,
)
from buildllm.errors import UserError
from buildllm.measure.machine import MACHINE_FILE, write_machine


def test_fingerprint_names_this_machine_and_its_id_is_stable(monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    record = fingerprint()
    for key in (
        "cpu_model",
        "cpu_kind",
        "physical_cores",
        "logical_cores",
        "avx2",
        "avx512",
        "avx512_bf16",
        "amx",
        "memory_total_gib",
        "torch_version",
        "cuda_version",
        "driver_version",
        "auto_device",
    ):
        assert key in record, key
    assert record["logical_cores"] >= record["physical_cores"] >= 1 and record["memory_total_gib"] > 0
    assert fingerprint() == record  # nothing volatile: free memory, load and time are not in it
    identity = machine_id(record)
    assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{8}", identity) and identity == machine_id(dict(record))
    assert machine_id({**record, "logical_cores": record["logical_cores"] + 1}) != identity


def cpuinfo_text(family: int, model: int) -> str:
    # As a hypervisor shows both: the same name and flags, only the numbers differ.
    lines = ["processor\t: 0", "vendor_id\t: AuthenticAMD", f"cpu family\t: {family}", f"model\t\t: {model}"]
    lines += ["model name\t: AMD EPYC", "stepping\t: 2", "flags\t\t: fpu sse2 avx2 fma", ""]
    return "\n".join(lines)


def test_two_cpus_of_one_name_and_flags_but_another_kind_are_two_machines(monkeypatch, tmp_path):
    monkeypatch.delenv(OVERRIDE, raising=False)
    seen = {}
    for family in (23, 25):
        fake = tmp_path / f"cpuinfo-{family}"
        fake.write_text(cpuinfo_text(family, 1))
        # device.cpuinfo reads /proc/cpuinfo by name; this file stands in for it.
        monkeypatch.setattr("buildllm.device.device.open", lambda *a, fake=fake, **k: open(fake), raising=False)
        seen[family] = fingerprint()
    assert seen[23]["cpu_kind"] == "family 23 model 1" and seen[25]["cpu_kind"] == "family 25 model 1"
    assert seen[23]["cpu_model"] == seen[25]["cpu_model"] == "AMD EPYC" and seen[23]["avx2"] and seen[25]["avx2"]
    assert machine_id(seen[23]) != machine_id(seen[25])


def test_this_cpus_kind_is_read_from_proc_cpuinfo(monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo here")
    family, model = (re.search(rf"^{name}\s*:\s*(\S+)", text, re.M) for name in ("cpu family", "model"))
    if family is None:
        pytest.skip("this /proc/cpuinfo has no cpu family line (not x86)")
    assert fingerprint()["cpu_kind"] == f"family {family.group(1)} model {model.group(1)}"


def test_the_benchmark_names_the_machine_as_machine_json_does(monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    assert machine_name(Device("cpu", "cpu", "cpu", "test")) == machine_record()["cpu_model"]
    assert machine_label("AMD Ryzen 9 7950X 16-Core Processor") == "AMD Ryzen 9 7950X"


def test_override_is_merged_and_changes_the_id(monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    here = fingerprint()
    monkeypatch.setenv(OVERRIDE, json.dumps({"cpu_model": "Other CPU 9000", "avx512_bf16": False}))
    other = fingerprint()
    assert other["cpu_model"] == "Other CPU 9000" and other["machine_override"] is True
    assert machine_id(other).startswith("other-9000-") and machine_id(other) != machine_id(here)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"gpus": [1]}'])
def test_a_bad_override_is_one_clear_error(monkeypatch, text):
    monkeypatch.setenv(OVERRIDE, text)
    with pytest.raises(UserError, match=OVERRIDE):
        fingerprint()


def test_the_stage_file_is_byte_identical_on_the_same_machine(workdir, monkeypatch):
    monkeypatch.delenv(OVERRIDE, raising=False)
    record = write_machine()
    first = (workdir / MACHINE_FILE).read_bytes()
    write_machine()
    assert (workdir / MACHINE_FILE).read_bytes() == first
    assert json.loads(first)["machine_id"] == record["machine_id"] == machine_id(fingerprint())


@pytest.mark.parametrize(
    "text, version",
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n", "535.104.05"),
        # The H200 of 2026-12-04 (open kernel modules): the id it recorded read "for" as the driver.
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs)\n", "580.159.04"),
        ("GCC version:  gcc version 12.3.0\n", None),
    ],
)
def test_the_driver_version_is_read_from_either_kernel_module_line(text, version):
    assert kernel_module_version(text) == version
