import json
import subprocess
import sys

import pytest
import torch
from conftest import clone_project, run

ENV_FIELDS = {
    "torch_version",
    "cuda_available",
    "cuda_unavailable_reason",
    "resolved_device",
    "device_reason",
    "processor",
    "physical_cores",
    "logical_cores",
    "torch_threads",
    "memory_total_bytes",
    "gpu_name",
    "gpu_memory_bytes",
    "gpu_compute_capability",
    "bf16_supported",
    "mps_available",
    "dvc_version",
    "tokenizers_version",
}


def buildllm(*args, cwd):
    return subprocess.run([sys.executable, "-m", "buildllm", *args], cwd=cwd, capture_output=True, text=True)


def test_env_json_has_the_fields(tmp_path):
    result = buildllm("env", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert ENV_FIELDS <= set(info)
    assert info["torch_version"] == torch.__version__
    assert info["logical_cores"] >= 1 and info["memory_total_bytes"] > 0


def test_dry_run_iteration_3_counts_parameters_and_estimates_memory(tmp_path):
    result = buildllm("dry-run", "--iteration", "3", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    startup = json.loads(result.stdout.splitlines()[0])
    assert startup["action"] == "dry_run" and startup["device"] == "cpu"
    metrics = json.loads((tmp_path / "metrics" / "dry_run.json").read_text())
    assert abs(metrics["parameters"] - 98.5e6) / 98.5e6 < 0.01
    stated = ("memory_estimate_total_bytes", "memory_estimate_low_bytes", "memory_estimate_high_bytes")
    parts = [v for k, v in metrics.items() if k.startswith("memory_estimate_") and k not in stated]
    assert metrics["memory_estimate_total_bytes"] == sum(parts)
    assert (
        metrics["memory_estimate_low_bytes"]
        < metrics["memory_estimate_total_bytes"]
        < metrics["memory_estimate_high_bytes"]
    )
    # fp32 weights + grads + AdamW moments alone are 16 bytes a parameter.
    assert metrics["memory_estimate_total_bytes"] > 16 * metrics["parameters"]
    assert all(isinstance(v, (int, float, str, bool)) for v in metrics.values())


def test_train_dry_run_trains_nothing_and_makes_no_checkpoint_directory(tmp_path):
    result = buildllm(
        "train", "--dry-run", "--preset", "tiny", "--device", "cpu", "--checkpoint-directory", "ckpt", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "ckpt").exists()
    assert json.loads((tmp_path / "metrics" / "dry_run.json").read_text())["profile"] == "tiny"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_device_is_one_line_and_writes_nothing(tmp_path):
    result = buildllm("dry-run", "--device", "cuda", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: device cuda requested but CUDA is not available")
    assert "Traceback" not in result.stderr and not (tmp_path / "metrics").exists()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure on a machine without CUDA")
def test_dvc_repro_and_experiments(default_run, tmp_path):
    # From the defaults' pipeline, run once per session (conftest's default_run), on its own clone: its
    # corpus, tokens and tune record are this stage's inputs, so only dry_run (and machine) run here.
    project = clone_project(default_run[0], tmp_path / "project")
    run(["dvc", "repro", "dry_run"], project)
    baseline = json.loads((project / "metrics" / "dry_run.json").read_text())
    assert baseline["device"] == "cpu" and baseline["profile"] == "gpt_first_cpu"
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "baseline"], project)

    # --single-item: the experiments run dry_run alone. The tune stage before it would build and time
    # the new profile (42M parameters at iteration 2), and this test reads nothing of it.
    failed = run(["dvc", "exp", "run", "-s", "dry_run", "-S", "device=cuda"], project, check=False)
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert "device cuda requested but CUDA is not available" in output and "Traceback" not in output

    run(["git", "checkout", "--", "params.yaml"], project)
    run(["dvc", "exp", "run", "-s", "dry_run", "-n", "iter2", "-S", "precision=fp32", "-S", "iteration=2"], project)
    shown = json.loads(run(["dvc", "exp", "show", "--json"], project).stdout)
    revs = [rev for baseline in shown for exp in baseline.get("experiments") or [] for rev in exp["revs"]]
    iter2 = next(rev for rev in revs if rev.get("name") == "iter2")
    # DVC shows the stage's summary; its full record is committed with the experiment.
    summary = iter2["data"]["metrics"]["metrics/summary/dry_run.json"]["data"]
    metrics = json.loads(run(["git", "show", f"{iter2['rev']}:metrics/dry_run.json"], project).stdout)
    assert metrics["profile"] == "gpt_42m" and metrics["precision"] == "fp32"
    assert abs(metrics["parameters"] - 42e6) / 42e6 < 0.02 and summary["parameters"] == metrics["parameters"]
