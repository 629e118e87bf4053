"""CUDA-only checks, run by scripts/gpu_check.sh on a machine with an NVIDIA GPU (skipped elsewhere):
the benchmark in bf16, fp16 and fp32 on the GPU, the datasheet peak, the allocator's peak figures,
fused AdamW, TF32, the batch-size finder in-process, and the memory estimate against the GPU's peak."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.memory.estimate import plan_memory
from buildllm.device.peak_flops import table_peak
from buildllm.plan import apply_plan, make_plan
from buildllm.train.trainer import Trainer

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def ampere_or_newer() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 0)


@pytest.fixture
def workdir(workdir):
    (workdir / "params.yaml").write_text(yaml.safe_dump(
        {"benchmark": {"warmup_steps": 2, "measured_steps": 6, "intervals": 2}}))
    return workdir


def benchmark(tokens, workdir, *extra: str) -> dict:
    code = main(["benchmark", "--preset", "tiny", "--device", "cuda", "--train-tokens", str(tokens["train"]),
                 "--validation-tokens", str(tokens["validation"]), "--training-examples", "512",
                 "--validation-examples", "64", *extra])
    assert code == 0
    return json.loads((workdir / "metrics" / "benchmark.json").read_text())


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_benchmark_on_cuda_records_the_gpu_and_its_peak(tokens, workdir, precision):
    if precision == "bf16" and not ampere_or_newer():
        pytest.skip("bf16 needs compute capability 8.0+")
    m = benchmark(tokens, workdir, "--precision", precision)
    name = torch.cuda.get_device_name(0)
    assert m["device"] == "cuda:0" and m["precision"] == precision and m["cuda_available"] is True
    assert m["gpu_name"] == name and m["gpu_memory_bytes"] > 0
    assert m["grad_scaler"] is (precision == "fp16")
    assert m["tensor_cores_enabled"] is (ampere_or_newer() or precision != "fp32")
    known = table_peak(name, precision, m["tf32_enabled"])
    if known is not None:
        assert m["peak_flops"] == known.flops and m["peak_flops_source"].startswith("datasheet: ")
    else:
        assert m["peak_flops_source"].startswith("measured: ")
        assert min(m["peak_flops_before"], m["peak_flops_after"]) <= m["peak_flops"] <= max(m["peak_flops_before"], m["peak_flops_after"])
    assert 0 < m["mfu"] < 1
    assert m["tokens_per_second"] == pytest.approx(m["steps_per_second"] * m["batch_size"] * m["sequence_length"])
    # The caching allocator's figures: reserved covers allocated, which covers the growth.
    assert m["peak_memory_reserved_bytes"] >= m["peak_memory_allocated_bytes"] >= m["peak_memory_bytes"] > 0
    assert m["peak_memory_method"].startswith("cuda")


def test_trainer_uses_fused_adamw_and_tf32_on_cuda(tokens):
    plan = make_plan(load_config(None, {"preset": "tiny", "device": "cuda", "precision": "fp32",
                                        "train.training_examples": 64}))
    apply_plan(plan)
    windows = Windows(load_tokens(tokens["train"]), plan.model.sequence_length, 64)
    trainer = Trainer(plan, windows, windows)
    assert trainer.fused_adamw is True, trainer.fused_adamw_reason
    assert plan.precision.tf32_enabled is ampere_or_newer()
    if ampere_or_newer():
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())
    assert torch.isfinite(trainer.step())


def test_batch_finder_on_cuda_tries_in_process_within_the_budget(tokens, workdir):
    code = main(["benchmark", "--find-batch-size", "--memory-budget", "1GiB", "--preset", "tiny", "--device", "cuda",
                 "--train-tokens", str(tokens["train"]), "--validation-tokens", str(tokens["validation"])])
    assert code == 0
    r = json.loads((workdir / "metrics" / "batch_size.json").read_text())
    tries = [(r[f"try_{i}_batch_size"], r[f"try_{i}_fits"], r[f"try_{i}_peak_bytes"]) for i in range(r["tries"])]
    assert r["found_batch_size"] >= 1
    assert all(0 < peak <= r["usable_bytes"] for _, fits, peak in tries if fits)
    assert all(not fits for b, fits, _ in tries if b > r["found_batch_size"])


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_memory_estimate_is_within_15_percent_of_the_cuda_peak(tokens, workdir, precision):
    if precision == "bf16" and not ampere_or_newer():
        pytest.skip("bf16 needs compute capability 8.0+")
    m = benchmark(tokens, workdir, "--precision", precision, "--preset", "student", "--batch-size", "64")
    config = load_config(None, {"preset": "student", "device": "cuda", "precision": precision,
                                "train.batch_size": 64})
    plan = make_plan(config)
    estimate = plan_memory(plan)
    assert m["memory_estimate_total_bytes"] == estimate.total
    assert m["memory_estimate_ratio"] == pytest.approx(1.0, abs=0.15), m["peak_memory_bytes"]
    # The estimate predicts the allocated peak; the reserved one (the allocator's cache) is beside it.
    assert m["memory_estimate_low_bytes"] <= m["peak_memory_bytes"] <= m["memory_estimate_high_bytes"]
    assert m["peak_memory_reserved_bytes"] >= m["peak_memory_allocated_bytes"]
