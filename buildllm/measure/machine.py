"""The `machine` DVC stage: metrics/machine.json, the fingerprint (device/machine.py) the measuring
stages depend on, so that they measure again on another machine and stay cached on this one."""

from __future__ import annotations

from pathlib import Path

from buildllm.device.machine import machine_record
from buildllm.metrics import write_metrics

# paths.metrics_path("machine"), without paths' reads of the config: this stage takes no params.
MACHINE_FILE = Path("metrics") / "machine.json"


def write_machine(config=None) -> dict:
    """Write metrics/machine.json, byte-identical on the same machine, and say which machine it is."""
    record = machine_record()
    write_metrics(MACHINE_FILE, record)
    print(
        f"machine {record['machine_id']}: {record['cpu_model']}, {record['logical_cores']} logical cores, "
        f"{record['memory_total_gib']} GiB, auto device {record['auto_device']}"
    )
    return record
