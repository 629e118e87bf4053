"""The CUDA checks, with their bodies run on every device present: the CPU always (so CI runs the
logic: batch sizes, windows, dtype choices, scaler paths, metrics keys), CUDA where there is one.
Only what is CUDA's own (the GPU's name, the caching allocator's figures, TF32, bf16 tensor
cores) is asserted on CUDA alone. scripts/gpu_check.sh runs the CUDA ones (`pytest -m cuda`).

The CPU bodies run with the profile's *GPU* batch size, so a body whose windows or example counts
cannot hold the batch the GPU will use fails here, not on the first GPU (a test once built 64
windows for tiny's GPU batch of 128)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import yaml
from conftest import run_env
from saved_tensors import saved_bytes_of_one_block

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.device import cpu_bf16
from buildllm.device.peak_flops import table_peak
from buildllm.memory.estimate import FP32, plan_memory, saved_floats_per_token_per_layer
from buildllm.plan.run_plan import apply_plan, make_plan
from buildllm.profiles import load_profile
from buildllm.train.trainer import Trainer

CUDA = pytest.param(
    "cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
)
DEVICES = ["cpu", CUDA]
# The CPU runs the same bodies, fewer steps: what is checked is the logic, not the speed. Its batch
# finder stops at 2 (two tries, each a child process that imports torch: the doubling is shown).
STEPS = {
    "cpu": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1, "max_batch_size": 2},
    "cuda": {"warmup_steps": 2, "measured_steps": 6, "intervals": 2},
}


def ampere_or_newer() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 0)


def gpu_batch(preset: str) -> int:
    return load_profile(preset).runtime("gpu").batch_size


def batch_flags(device: str, preset: str) -> list[str]:
    """CUDA takes the profile's GPU default from the plan; the CPU is given that same batch."""
    return ["--batch-size", str(gpu_batch(preset))] if device == "cpu" else []


def workdir_for(workdir, device: str):
    (workdir / "params.yaml").write_text(yaml.safe_dump({"benchmark": STEPS[device]}))
    return workdir


def benchmark(tokens, workdir, device: str, *extra: str, fresh: bool = False) -> tuple[int, dict | None]:
    """fresh: in a process of its own, as a pipeline stage runs (its memory baseline holds nothing a
    test before it made, such as cuBLAS's workspaces)."""
    (workdir / "metrics").mkdir(exist_ok=True)
    (workdir / "metrics" / "benchmark.json").unlink(missing_ok=True)

    def in_a_fresh_process(args: list[str]) -> int:
        return subprocess.run([sys.executable, "-m", "buildllm", *args], cwd=workdir, env=run_env()).returncode

    code = (in_a_fresh_process if fresh else main)(
        [
            "benchmark",
            "--preset",
            "tiny",
            "--device",
            device,
            "--train-tokens",
            str(tokens["train"]),
            "--validation-tokens",
            str(tokens["validation"]),
            "--training-examples",
            "512",
            "--validation-examples",
            "64",
            *extra,
        ]
    )
    path = workdir / "metrics" / "benchmark.json"
    return code, json.loads(path.read_text()) if path.exists() else None


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_benchmark_records_the_device_and_its_peak(tokens, workdir, device, precision, capsys):
    if device == "cuda" and precision == "bf16" and not ampere_or_newer():
        pytest.skip("bf16 needs compute capability 8.0+")
    code, m = benchmark(
        tokens, workdir_for(workdir, device), device, "--precision", precision, *batch_flags(device, "tiny")
    )
    if device == "cpu" and precision == "fp16":  # refused by design, in one line, nothing written
        assert code == 2 and m is None
        assert "precision fp16 requested on the CPU" in capsys.readouterr().err
        return
    if device == "cpu" and precision == "bf16" and not cpu_bf16.native_bf16():  # refused on this CPU, as fp16
        assert code == 2 and m is None
        assert "no bf16 matmul path" in capsys.readouterr().err
        return
    assert code == 0, capsys.readouterr().err
    assert m["precision"] == precision and m["batch_size"] == gpu_batch("tiny")
    assert m["grad_scaler"] is (device == "cuda" and precision == "fp16")
    assert m["tensor_cores_enabled"] is (device == "cuda" and (ampere_or_newer() or precision != "fp32"))
    assert m["tf32_enabled"] is (device == "cuda" and ampere_or_newer())
    name = torch.cuda.get_device_name(0) if device == "cuda" else None
    known = table_peak(name, precision, m["tf32_enabled"]) if name else None
    # MFU against a peak measured in the run on every device (CUDA events on CUDA); a GPU in the
    # datasheet table has that figure beside it, with its own MFU.
    # The flat metric cuts long labels (metrics.CUT_LABEL); the notes file keeps the whole text of those.
    notes = json.loads((workdir_for(workdir, device) / "metrics" / "benchmark_notes.json").read_text())
    source = notes.get("peak_flops_source", m["peak_flops_source"])
    assert m["peak_flops_source"].startswith("measured: ") and source.startswith("measured: ")
    assert ("CUDA events" in source) is (device == "cuda")
    low, high = sorted((m["peak_flops_before"], m["peak_flops_after"]))
    assert low <= m["peak_flops"] <= high
    if known is not None:
        assert m["peak_flops_datasheet"] == known.flops and m["peak_flops_datasheet_source"].startswith("datasheet: ")
        assert m["mfu_datasheet"] == pytest.approx(m["achieved_flops"] / known.flops)
    else:
        assert m["peak_flops_datasheet"] == 0 and m["mfu_datasheet"] == 0
    assert 0 < m["mfu"] < 1
    assert m["tokens_per_second"] == pytest.approx(m["steps_per_second"] * m["batch_size"] * m["sequence_length"])
    assert m["peak_memory_bytes"] > 0
    if device == "cuda":
        assert m["device"] == "cuda:0" and m["cuda_available"] is True
        assert m["gpu_name"] == name and m["gpu_memory_bytes"] > 0
        # The caching allocator's figures: reserved covers allocated, which covers the growth.
        assert m["peak_memory_reserved_bytes"] >= m["peak_memory_allocated_bytes"] >= m["peak_memory_bytes"]
        assert m["peak_memory_method"].startswith("cuda")
    else:
        assert m["device"] == "cpu" and m["gpu_name"] == "" and m["gpu_memory_bytes"] == 0
        assert m["peak_memory_method"].startswith("cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_steps_at_the_gpu_batch_with_fused_adamw(tokens, device):
    overrides = {"preset": "tiny", "device": device, "precision": "fp32"}
    if device == "cpu":
        overrides["train.batch_size"] = gpu_batch("tiny")
        overrides["train.threads"] = 1
    plan = make_plan(load_config(None, overrides))
    assert plan.batch_size == gpu_batch("tiny")
    apply_plan(plan)
    # Windows for two batches of what the plan says, whatever the device's default is.
    windows = Windows(load_tokens(tokens["train"]), plan.model.sequence_length, 2 * plan.batch_size)
    assert len(windows) == 2 * plan.batch_size
    trainer = Trainer(plan, windows, windows)
    # The plan's probe chose fused AdamW (CUDA always has it; this CPU build does too) and the optimizer uses it.
    assert plan.fused_adamw is True, plan.decisions["fused_adamw"]
    assert all(group["fused"] for group in trainer.optimizer.parts["adamw"].param_groups)
    assert trainer.scaler.is_enabled() is False  # fp32: the scaler is a no-op on every device
    assert plan.precision.tf32_enabled is (device == "cuda" and ampere_or_newer())
    if plan.precision.tf32_enabled:
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert all(p.device.type == device for p in trainer.model.parameters())
    assert torch.isfinite(trainer.step())
    assert trainer.cursor.batch == 1 and trainer.tokens_seen == plan.batch_size * plan.model.sequence_length


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_takes_the_scaler_path_only_on_cuda(device):
    """fp16: a GradScaler on CUDA; the CPU refuses it before anything is built."""
    config = load_config(None, {"preset": "tiny", "device": device, "precision": "fp16"})
    if device == "cpu":
        with pytest.raises(Exception, match="precision fp16 requested on the CPU"):
            make_plan(config)
        return
    plan = make_plan(config)
    assert plan.precision.grad_scaler and plan.precision.autocast_dtype is torch.float16


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_batch_finder_tries_within_the_budget(tokens, workdir, device):
    workdir_for(workdir, device)
    code = main(
        [
            "benchmark",
            "--find-batch-size",
            "--memory-budget",
            "1GiB",
            "--preset",
            "tiny",
            "--device",
            device,
            "--train-tokens",
            str(tokens["train"]),
            "--validation-tokens",
            str(tokens["validation"]),
        ]
    )
    assert code == 0
    r = json.loads((workdir / "metrics" / "batch_size.json").read_text())
    tries = [(r[f"try_{i}_batch_size"], r[f"try_{i}_fits"], r[f"try_{i}_peak_bytes"]) for i in range(r["tries"])]
    assert r["found_batch_size"] >= 1 and r["device"] == ("cuda:0" if device == "cuda" else "cpu")
    assert all(0 < peak <= r["usable_bytes"] for _, fits, peak in tries if fits)
    assert all(not fits for b, fits, _ in tries if b > r["found_batch_size"])


@pytest.mark.parametrize("device", DEVICES)
def test_the_estimates_count_of_a_blocks_saved_tensors_is_what_autograd_keeps_on_the_device(device):
    """CUDA's kernels save less than the CPU's (a fused RMSNorm keeps its input and rstd only; the
    attention kernels' output makes the transpose-reshape a view): the estimate counts each device's
    own. Per-token statistics (rstd, log-sum-exp) beyond those counted stay under 2%. The architecture
    knobs' counts on CUDA (qk-norm's, ReLU squared's) are read from the CPU's kernels and this check."""
    knobs = ({}, {"activation": "relu2"}, {"qk_norm": True})
    for architecture, precision, knob in itertools.product(("classic", "modern"), ("fp32", "bf16"), knobs):
        if device == "cuda" and precision == "bf16" and not ampere_or_newer():
            continue
        config = replace(load_profile("student").model, architecture=architecture, sequence_length=64, **knob)
        dtype = torch.bfloat16 if precision == "bf16" else None
        measured = saved_bytes_of_one_block(config, dtype, device=device)
        fp32, low = saved_floats_per_token_per_layer(config, dtype is not None, cuda_kernels=device == "cuda")
        predicted = 4 * config.sequence_length * (fp32 * FP32 + low * (2 if dtype else FP32))
        assert predicted == pytest.approx(measured, rel=0.02), (architecture, precision, knob, predicted, measured)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_memory_estimate_brackets_the_measured_peak(tokens, workdir, device, precision):
    if device == "cuda" and precision == "bf16" and not ampere_or_newer():
        pytest.skip("bf16 needs compute capability 8.0+")
    if device == "cpu" and precision == "bf16" and not cpu_bf16.native_bf16():
        pytest.skip("this CPU has no bf16 matmul path: bf16 is refused here")
    code, m = benchmark(
        tokens,
        workdir_for(workdir, device),
        device,
        "--precision",
        precision,
        "--preset",
        "student",
        "--batch-size",
        "64",
        fresh=True,
    )
    assert code == 0
    config = load_config(None, {"preset": "student", "device": device, "precision": precision, "train.batch_size": 64})
    plan = make_plan(config)
    estimate = plan_memory(plan, training=False)
    assert m["memory_estimate_total_bytes"] == estimate.total
    # The estimate's own stated range: -15%/+25% on the CPU (glibc's retained blocks vary), ±15% on CUDA.
    figures = {k: m[k] for k in ("memory_estimate_low_bytes", "peak_memory_bytes", "memory_estimate_high_bytes")}
    assert m["memory_estimate_low_bytes"] <= m["peak_memory_bytes"] <= m["memory_estimate_high_bytes"], figures
    if device == "cuda":
        assert m["memory_estimate_ratio"] == pytest.approx(1.0, abs=0.15), m["peak_memory_bytes"]
        # The estimate predicts the allocated peak; the reserved one (the allocator's cache) is beside it.
        assert m["peak_memory_reserved_bytes"] >= m["peak_memory_allocated_bytes"]
