"""The benchmark command on preset tiny: what it records, that its numbers agree with each other,
the out-of-memory path, and the preset/thread sweep."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
import yaml

from buildllm.cli import main
from buildllm.metrics import read_metrics
from buildllm.train.trainer import Trainer

# The course's "what to record" list: every benchmark must carry these.
RECORDED = (
    "device",
    "precision",
    "tf32_enabled",
    "tensor_cores_enabled",
    "fused_adamw",
    "grad_scaler",
    "parameters",
    "batch_size",
    "grad_accum",
    "sequence_length",
    "workers",
    "threads",
    "warmup_steps",
    "measured_steps",
    "tokens_per_second",
    "steps_per_second",
    "throughput_cv",
    "peak_memory_bytes",
    "checkpoint_save_seconds",
    "checkpoint_bytes",
    "time_to_first_step_seconds",
    "flops_per_token",
    "achieved_flops",
    "peak_flops",
    "peak_flops_source",
    "peak_flops_before",
    "peak_flops_after",
    "mfu",
    "machine",
    "memory_estimate_low_bytes",
    "memory_estimate_high_bytes",
    "processor",
    "gpu_name",
    "gpu_memory_bytes",
    "torch_version",
    "cuda_available",
    "machine_id",
    "other_load_start",
    "other_load_end",
    "busy_machine",
)


@pytest.fixture
def workdir(workdir):
    """A working directory whose params.yaml bounds the benchmark to a few steps."""
    (workdir / "params.yaml").write_text(
        yaml.safe_dump({"benchmark": {"warmup_steps": 1, "measured_steps": 4, "intervals": 2}})
    )
    return workdir


def args(tokens, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--batch-size",
        "8",
        "--training-examples",
        "64",
        "--validation-examples",
        "16",
        *extra,
    ]


def read(workdir, stage: str) -> dict:
    """The metrics file with its notes (reasons, sources), which live beside it."""
    return read_metrics(workdir / "metrics" / f"{stage}.json", with_notes=True)


def test_benchmark_records_every_field_and_the_numbers_agree(tokens, workdir, capsys):
    assert main(["benchmark", *args(tokens, "--threads", "1", "--grad-accum", "2")]) == 0
    startup = json.loads(capsys.readouterr().out.splitlines()[0])
    assert startup["action"] == "benchmark" and startup["measured_steps"] == 4
    m = read(workdir, "benchmark")
    assert set(RECORDED) <= set(m), set(RECORDED) - set(m)
    assert all(isinstance(v, (bool, int, float, str)) for v in m.values())
    assert (m["device"], m["precision"], m["threads"], m["grad_accum"], m["oom"]) == ("cpu", "fp32", 1, 2, False)
    assert m["warmup_steps"] == 1 and m["measured_steps"] == 4 and m["intervals"] == 2
    assert m["tokens_per_second"] == pytest.approx(
        m["steps_per_second"] * m["batch_size"] * m["sequence_length"] * m["grad_accum"]
    )
    assert m["achieved_flops"] == pytest.approx(m["flops_per_token"] * m["tokens_per_second"])
    assert 0 < m["mfu"] < 1 and m["peak_flops_source"] == "measured: 2048^3 fp32 matmuls"
    assert len(json.loads((workdir / "metrics" / "benchmark.json").read_text())["peak_flops_source"]) <= 30
    # No datasheet figure for a CPU: nothing beside the measured peak.
    assert (m["peak_flops_datasheet"], m["peak_flops_datasheet_source"], m["mfu_datasheet"]) == (0, "", 0)
    assert m["interval_steps_per_second_min"] <= m["steps_per_second"] <= m["interval_steps_per_second_max"]
    assert m["steps_per_second"] == pytest.approx(m["measured_steps"] / m["measured_seconds"])
    # A real checkpoint of the weights, both AdamW moments of AdamW's parameters and Muon's one momentum
    # of its own, and a real peak above the weights alone.
    optimizer_state = 2 * (m["parameters"] - m["muon_parameters"]) + m["muon_parameters"]
    assert m["checkpoint_bytes"] > 4 * (m["parameters"] + optimizer_state) and m["checkpoint_save_seconds"] > 0
    assert m["peak_memory_bytes"] > 4 * m["parameters"]
    assert m["memory_estimate_ratio"] == pytest.approx(m["memory_estimate_total_bytes"] / m["peak_memory_bytes"])
    assert m["time_to_first_step_seconds"] <= m["warmup_seconds"]
    # What the estimate adds around the steps: the process's start-up and the closing loss plot.
    assert m["process_startup_seconds"] > 0 and m["plot_seconds"] > 0
    # The peak is this run's own, measured beside every measured step and recorded in the file: MFU
    # is recomputable from it (each step against the matmuls beside it, the median of those), and no
    # file outside the project decides it. The intervals are the sums of their steps' times.
    n = m["measured_steps"]
    times = [m[f"step_{i}_seconds"] for i in range(1, n + 1)]
    peaks = [m[f"step_{i}_peak_flops"] for i in range(1, n + 1)]
    assert f"step_{n + 1}_seconds" not in m and f"step_{n + 1}_peak_flops" not in m
    assert min(times) > 0 and min(peaks) > 0 and m["peak_flops"] > 0
    assert m["measured_seconds"] == pytest.approx(sum(times))
    own = [m["flops_per_token"] * m["tokens_per_step"] / t / p for t, p in zip(times, peaks)]
    assert m["mfu"] == pytest.approx(statistics.median(own))
    assert m["peak_flops_before"] > 0 and m["peak_flops_after"] > 0
    assert not [v for v in m.values() if isinstance(v, str) and (str(workdir) in v or str(Path.home()) in v)]


def test_out_of_memory_is_recorded_with_advice_and_one_line(tokens, workdir, monkeypatch, capsys):
    def exhausted(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Trainer, "step", exhausted)
    code = main(["benchmark", *args(tokens)])
    err = capsys.readouterr().err
    assert code == 3
    assert err.count("\n") == 1 and err.startswith("error: out of memory at batch size 8 on cpu")
    assert "--batch-size" in err and "Traceback" not in err
    m = read(workdir, "benchmark")
    assert m["oom"] is True and m["oom_batch_size"] == 8 and "--find-batch-size" in m["oom_advice"]
    assert "tokens_per_second" not in m


def test_an_error_other_than_out_of_memory_is_not_disguised(tokens, workdir, monkeypatch):
    def broken(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Trainer, "step", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["benchmark", *args(tokens)])
    assert not (workdir / "metrics" / "benchmark.json").exists()


def test_sweep_prints_one_row_per_combination(tokens, workdir, capsys):
    assert main(["benchmark", *args(tokens, "--presets", "tiny", "student", "--threads", "1", "2")]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"preset"' in line]
    assert [(r["preset"], r["threads"]) for r in rows] == [("tiny", 1), ("tiny", 2), ("student", 1), ("student", 2)]
    table = out[out.index("preset ") :].splitlines()
    assert len(table) == 2 + 4  # header, rule, one line per combination
    sequence = {"tiny": 64, "student": 128}
    for r in rows:
        assert r["tokens_per_second"] == pytest.approx(r["steps_per_second"] * r["batch_size"] * sequence[r["preset"]])
    sweep = read(workdir, "sweep")
    assert set(sweep) == {
        f"{p}_{a}_{t}t_{k}"
        for p, a in (("tiny", "classic"), ("student", "modern"))  # each preset's own architecture
        for t in (1, 2)
        for k in ("steps_per_second", "tokens_per_second", "data_share", "other_load", "busy_machine")
    }
    assert all(r["other_load"] >= 0 and isinstance(r["busy_machine"], bool) for r in rows)


def test_only_the_cpu_keeps_a_matmul_probe_through_the_steps():
    from buildllm.device.device import Device
    from buildllm.device.peak_flops import step_probe

    # A GPU's memory is its run's budget: no buffers held there (and none allocated here, without CUDA).
    assert step_probe(Device("cuda:1", "cuda:1", "cuda", "test"), "bf16") is None
    probe = step_probe(Device("cpu", "cpu", "cpu", "test"), "fp32")
    buffers = (probe.a.data_ptr(), probe.b.data_ptr(), probe.out.data_ptr())
    first, second = probe.sample(2), probe.sample(1)
    # Every sample reuses the buffers made at the start (nothing allocated between intervals) and is kept.
    assert (probe.a.data_ptr(), probe.b.data_ptr(), probe.out.data_ptr()) == buffers
    assert probe.samples == [first, second] and len(first) == 2 and len(second) == 1 and min(first + second) > 0
    probe.close()
