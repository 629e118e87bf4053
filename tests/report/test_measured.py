"""docs/measured.md is generated from the files under benchmarks/ and must agree with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from buildllm.errors import UserError
from buildllm.metrics import write_metrics
from buildllm.report import measured

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_document_matches_the_committed_files(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert any(measured.BENCHMARKS.glob("*/machine.json")), "benchmarks/ holds no machine's runs"
    measured.check()  # raises, naming the command that regenerates it, when they disagree


def test_every_committed_run_names_its_machine_and_date(monkeypatch):
    monkeypatch.chdir(ROOT)
    for machine in measured.BENCHMARKS.glob("*/machine.json"):
        identity = json.loads(machine.read_text())["machine_id"]
        assert machine.parent.name == identity
        for run in (p for p in machine.parent.iterdir() if p.is_dir()):
            assert json.loads((run / "run.json").read_text())["date"]
            assert json.loads((run / "benchmark.json").read_text())["machine_id"] == identity, run


def test_a_changed_figure_fails_the_check_until_regenerated(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    monkeypatch.chdir(tmp_path)
    assert measured.main(["--check"]) == 0
    record = next(Path("benchmarks").glob("*/*/benchmark.json"))
    data = json.loads(record.read_text())
    data["tokens_per_second"] = data["tokens_per_second"] * 2 + 1
    record.write_text(json.dumps(data, indent=2) + "\n")
    assert measured.main(["--check"]) != 0
    assert capsys.readouterr().err.startswith("error: docs/measured.md does not match the files under benchmarks/")
    assert measured.main([]) == 0 and measured.main(["--check"]) == 0
    assert f"{data['tokens_per_second']:,.0f}" in Path("docs/measured.md").read_text()


def machine_and_benchmark(metrics: Path, benchmark_machine: str) -> dict:
    """A workspace's metrics as the machine and benchmark stages write them (figures made up)."""
    machine = {
        "machine_id": "test-cpu-0123abcd",
        "cpu_model": "Test CPU",
        "architecture": "x86_64",
        "physical_cores": 2,
        "logical_cores": 4,
        "affinity_cores": 4,
        "quota_cores": 0.0,
        "avx2": True,
        "avx512": False,
        "avx512_bf16": False,
        "amx": False,
        "cpu_capability": "AVX2",
        "memory_total_gib": 8.0,
        "torch_version": "2.13.0+cpu",
        "cuda_version": "none",
        "gpu_count": 0,
        "driver_version": "none",
        "auto_device": "cpu",
    }
    write_metrics(metrics / "machine.json", machine)
    write_metrics(
        metrics / "benchmark.json",
        {
            "machine_id": benchmark_machine,
            "profile": "tiny",
            "device": "cpu",
            "precision": "fp32",
            "batch_size": 8,
            "threads": 2,
            "tokens_per_second": 12345.6,
            "mfu": 0.123,
            "throughput_cv": 0.02,
            "peak_memory_bytes": 50 * 2**20,
            "memory_estimate_total_bytes": 48 * 2**20,
            "other_load_start": 1.5,
            "other_load_end": 1.25,
            "busy_machine": True,
        },
    )
    return machine


def test_save_then_render_shows_the_machine_the_figures_and_the_note(tmp_path):
    machine = machine_and_benchmark(tmp_path / "metrics", "test-cpu-0123abcd")
    folder = measured.save(
        "tiny-bounded",
        "the machine was shared with other jobs",
        "dvc repro benchmark",
        metrics=tmp_path / "metrics",
        root=tmp_path / "benchmarks",
        today="2026-12-02",
    )
    assert folder == tmp_path / "benchmarks" / machine["machine_id"] / "tiny-bounded"
    assert {p.name for p in folder.iterdir()} == {"benchmark.json", "run.json"}
    text = measured.render(tmp_path / "benchmarks")
    assert "## Test CPU (`test-cpu-0123abcd`)" in text and "4 logical cores (2 physical, 4 usable), 8.0 GiB" in text
    assert (
        "| tiny-bounded | 2026-12-02 | tiny | cpu fp32 | 8 | 2 | 12,346 | 12.3% | 2.0% | 50.0 MiB (estimate "
        "48.0 MiB) | — | — | — | 1.50 / 1.25 cores **busy** |"
    ) in text
    assert "- **tiny-bounded**: `dvc repro benchmark`; the machine was shared with other jobs" in text
    assert measured.render(tmp_path / "benchmarks") == text  # the same files, the same document


def test_save_refuses_a_benchmark_measured_on_another_machine(tmp_path):
    machine_and_benchmark(tmp_path / "metrics", "other-cpu-89abcdef")
    with pytest.raises(UserError, match="measured on machine other-cpu-89abcdef"):
        measured.save("run", "", "dvc repro", metrics=tmp_path / "metrics", root=tmp_path / "benchmarks")
    assert not (tmp_path / "benchmarks").exists()
