"""scripts/gpu_check.sh, the parts a machine without a GPU can check: the syntax, the refusal
without CUDA, and the whole loop on the CPU (GPU_CHECK_DEVICE=cpu, preset tiny)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from conftest import ROOT, copy_project, run_env
from train_fixtures import make_token_files

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(project, **env) -> subprocess.CompletedProcess:
    environment = {**run_env(), "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(project / "scripts" / "gpu_check.sh")], cwd=project, env=environment,
                          capture_output=True, text=True, timeout=600)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_stops_at_once_with_one_line(tmp_path):
    result = gpu_check(ROOT, GPU_CHECK_OUT=str(tmp_path / "out"))
    assert result.returncode == 1
    assert "error:" in result.stdout and "has no CUDA-enabled torch" in result.stdout
    assert "GPU_CHECK_DEVICE=cpu" in result.stdout and not (tmp_path / "out" / "combined.json").exists()


@pytest.mark.slow
def test_the_whole_loop_runs_on_the_cpu(tmp_path):
    project = copy_project(tmp_path / "project")
    shutil.copytree(ROOT / "scripts", project / "scripts")
    shutil.copy2(ROOT / "pyproject.toml", project / "pyproject.toml")
    (project / "tests").mkdir()
    for name in ("conftest.py", "train_fixtures.py", "test_cuda.py"):
        shutil.copy2(ROOT / "tests" / name, project / "tests" / name)
    # Token files where the pipeline puts them, so the script makes none (no corpus download).
    tokens = make_token_files(tmp_path / "tokens")
    folder = project / "data" / "tokens" / "wiki_vital_4096"
    folder.mkdir(parents=True)
    shutil.copy2(tokens["train"], folder / "train_tokens.pt")
    shutil.copy2(tokens["validation"], folder / "validation_tokens.pt")
    out = tmp_path / "out"
    result = gpu_check(project, GPU_CHECK_DEVICE="cpu", GPU_CHECK_OUT=str(out),
                       GPU_CHECK_BUDGET_S="100000")
    assert result.returncode == 0, result.stdout + result.stderr
    combined = json.loads((out / "combined.json").read_text())
    # fp16 is refused on the CPU (reported in the log, not a crash); bf16 and fp32 ran.
    assert {"benchmark_presettiny_bf16", "benchmark_presettiny_fp32"} <= set(combined)
    assert "benchmark_presettiny_fp16" not in combined
    assert "precision fp16 requested on the CPU" in (out / "gpu_check.log").read_text()
    for precision in ("bf16", "fp32"):
        m = combined[f"benchmark_presettiny_{precision}"]
        assert m["precision"] == precision and m["device"] == "cpu" and m["measured_steps"] == 4
    found = combined["batch_size_presettiny_bf16"]["found_batch_size"]
    assert 1 <= found <= 16  # the CPU mode caps the finder at 16
    plain, compiled = (combined[f"benchmark_presettiny_bf16_b{found}{suffix}"] for suffix in ("", "_compile"))
    assert plain["batch_size"] == compiled["batch_size"] == found
    assert not plain["compile_enabled"] and compiled["compile_enabled"] and compiled["tokens_per_second"] > 0
    assert combined["memory_truth"]["fitted_tiny_fp32_b8_ratio"] > 0
    assert combined["estimate_truth"]["actual_seconds"] > 0
    assert json.loads((out / "env.json").read_text())["resolved_device"] == "cpu"
    assert "skipped" in (out / "pytest_cuda.log").read_text()
    summary = (out / "summary.txt").read_text()
    assert "benchmark_presettiny_bf16" in summary and "tokens/s" in summary
    with tarfile.open(out / "runs.tar.gz") as bundle:
        assert "runs/benchmark_presettiny_fp32.json" in bundle.getnames()
    # The project's own metrics are untouched: benchmarks ran in a scratch folder.
    assert not (project / "metrics" / "benchmark.json").exists()
