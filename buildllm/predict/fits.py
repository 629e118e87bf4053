"""`buildllm fits`: which GPU fits which profile, from the memory model alone (nothing is allocated).

The batch finder's safety margin is kept: it covers the model's error against measured peaks
(`buildllm verify memory`, target ±15%) and the CUDA context, which the model does not count.
"""

from __future__ import annotations

import psutil
import torch

from buildllm.config import Config
from buildllm.device.device import Device
from buildllm.model.gpt import build_model
from buildllm.plan.memory import LARGEST, largest_batch
from buildllm.profiles import available_profiles, load_profile

GIB = 2**30
GPU_SIZES_GIB = (8, 12, 16, 24, 40, 48, 80, 141)
# bf16 and fp16 keep the same activation bytes: one column for both.
PRECISIONS = (("fp32", 4), ("bf16/fp16", 2))


# The GPU columns: a CUDA device of that size (its kind, and the size passed beside it, are what the
# memory model asks of it).
GPU = Device("cuda", "cuda:0", "cuda", "buildllm fits: a CUDA GPU of each size")


def this_machine() -> tuple[str, int, Device]:
    """(column title, bytes, device) for the memory this machine trains in."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return f"here: {props.total_memory / GIB:.0f} GiB GPU", props.total_memory, GPU
    total = psutil.virtual_memory().total
    return f"here: {total / GIB:.0f} GiB RAM (cpu)", total, Device("cpu", "cpu", "cpu", "buildllm fits: this machine")


def fits_table(config: Config) -> list[dict]:
    margin, checkpointing = config.benchmark.safety_margin, config.train.gradient_checkpointing
    title, here, here_device = this_machine()
    columns = [(f"{size} GiB", size * GIB, GPU) for size in GPU_SIZES_GIB] + [(title, here, here_device)]
    rows = []
    profiles = [load_profile(name) for name in available_profiles()]
    sized = sorted((build_model(p.model, "meta").num_parameters(), p.name, p) for p in profiles)
    for parameters, name, profile in sized:
        for precision, precision_bytes in PRECISIONS:
            row = {"profile": name, "parameters": parameters, "precision": precision}
            for column, capacity, device in columns:
                usable = int(capacity * (1 - margin))
                row[column] = largest_batch(
                    profile.model, parameters, precision_bytes, usable, device, checkpointing, capacity
                )
            rows.append(row)
    return rows


def fits(config: Config) -> list[dict]:
    rows = fits_table(config)
    columns = [key for key in rows[0] if key not in ("profile", "parameters", "precision")]
    print(
        f"largest batch size (sequences of the profile's context) whose estimated training peak fits, with the "
        f"batch finder's {config.benchmark.safety_margin:.0%} safety margin"
        + (", with gradient checkpointing" if config.train.gradient_checkpointing else "")
        + "; 0: not even one sequence fits"
    )
    print("| profile | parameters | precision | " + " | ".join(columns) + " |")
    print("|---|---:|---|" + "---:|" * len(columns))
    for row in rows:
        cells = [f"{row[c]:,}" if row[c] < LARGEST else f"≥{LARGEST:,}" for c in columns]
        print(f"| {row['profile']} | {row['parameters'] / 1e6:.1f}M | {row['precision']} | " + " | ".join(cells) + " |")
    return rows
