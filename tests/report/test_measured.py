"""docs/measured.md is generated from the files under benchmarks/ and must agree with them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from buildllm.errors import UserError
from buildllm.metrics import write_metrics
from buildllm.report import measured, measured_save

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
    shutil.copyfile(ROOT / "README.md", tmp_path / "README.md")
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


def intervals(record: dict, rates: list) -> dict:
    """A benchmark record with these interval rates (steps/s) and its tokens/s (1,000 tokens a step)."""
    record = {**record, "tokens_per_second": 1000 * sum(rates) / len(rates)}
    record.update({f"interval_{i + 1}_steps_per_second": r for i, r in enumerate(rates)})
    return record


def test_a_run_saved_with_a_reference_shows_its_speedup_on_the_page_and_in_the_readme(tmp_path):
    """The reference on one machine, a faster run on another saved from one benchmark record whose
    machine is already under benchmarks/; the page and the README's headline give the same ratio."""
    metrics, root = tmp_path / "metrics", tmp_path / "benchmarks"
    machine_and_benchmark(metrics, "test-cpu-0123abcd")
    base = json.loads((metrics / "benchmark.json").read_text())
    write_metrics(metrics / "benchmark.json", intervals({**base, "busy_machine": False}, [10.0, 10.2, 9.8, 10.0]))
    write_metrics(metrics / "train.json", {"final_validation_loss": 6.704})
    measured.save("cpu-twin", "", "dvc exp run", metrics=metrics, root=root, today="2026-12-04")
    gpu = {**machine_and_benchmark(tmp_path / "gpu", "test-gpu-89abcdef"), "machine_id": "test-gpu-89abcdef"}
    gpu |= {"gpu_count": 1, "gpu0_name": "Test GPU", "gpu0_memory_gib": 80.0, "gpu0_compute_capability": "9.0"}
    write_metrics(tmp_path / "gpu" / "machine.json", {**gpu, "driver_version": "for"})
    record = intervals({**base, "machine_id": "test-gpu-89abcdef", "busy_machine": False}, [40.0, 41.0, 39.0, 40.0])
    write_metrics(tmp_path / "gpu" / "benchmark.json", record)
    measured.save("first", "", "pack-run", metrics=tmp_path / "gpu", root=root, today="2026-12-04")
    lone = tmp_path / "compiled.json"
    write_metrics(lone, intervals(record, [80.0, 81.0, 79.0, 80.0]))
    with pytest.raises(UserError, match="reference test-cpu-0123abcd/none is no saved run"):
        measured.save("gpu-run", "", "b", metrics=lone, root=root, reference="test-cpu-0123abcd/none")
    assert not (root / "test-gpu-89abcdef" / "gpu-run").exists()
    folder = measured.save("gpu-run", "", "b", metrics=lone, root=root, reference="test-cpu-0123abcd/cpu-twin")
    assert json.loads((folder / "run.json").read_text())["reference"] == "test-cpu-0123abcd/cpu-twin"
    assert {p.name for p in folder.iterdir()} == {"benchmark.json", "run.json"}

    text = measured.render(root)
    row = next(line for line in text.splitlines() if line.startswith("| gpu-run | Test GPU | cpu-twin |"))
    ratio, low, high = (float(x) for x in re.search(r"\| ([\d.]+)× \(([\d.]+)–([\d.]+)×\)", row).groups())
    assert ratio == pytest.approx(8.0, abs=0.005) and low < ratio < high and high / low < 1.1
    assert row.endswith("| — / 6.704 |") and "inconclusive" not in row
    assert "driver not recorded" in text and "driver for" not in text
    head = measured.headline(root)
    assert f"- `gpu-run` on Test GPU: 80,000 tokens/s, MFU 12.3%; {ratio:.2f}× ({low:.2f}–{high:.2f}×)" in head
    readme = tmp_path / "README.md"
    readme.write_text(f"# X\n\n{measured.HEADLINE_START}\nold\n{measured.HEADLINE_END}\n\nrest\n")
    readme.write_text(measured.with_headline(readme.read_text(), root))
    document = tmp_path / "measured.md"
    document.write_text(text)
    measured.check(root, document, readme)
    assert readme.read_text().endswith(head + "\n\nrest\n")
    readme.write_text(readme.read_text().replace("80,000", "90,000"))
    with pytest.raises(UserError, match="README.md does not match the files under"):
        measured.check(root, document, readme)

    # A reference measured on a busy machine: the page shows the ratio and why it is no result; the
    # headline does not quote it.
    twin = root / "test-cpu-0123abcd" / "cpu-twin" / "benchmark.json"
    write_metrics(twin, {**json.loads(twin.read_text()), "busy_machine": True})
    assert f"{ratio:.2f}× ({low:.2f}–{high:.2f}×), inconclusive (reference busy)" in measured.render(root)
    assert "; the speed-up against `cpu-twin` on Test CPU is inconclusive (reference busy)" in measured.headline(root)
    assert f"{ratio:.2f}×" not in measured.headline(root)


def test_a_lone_record_of_an_unknown_machine_is_refused(tmp_path):
    lone = tmp_path / "benchmark.json"
    write_metrics(lone, {"machine_id": "never-seen-0000", "tokens_per_second": 1.0})
    with pytest.raises(UserError, match="holds none for machine never-seen-0000: save a run of that machine"):
        measured.save("run", "", "b", metrics=lone, root=tmp_path / "benchmarks")
    assert not (tmp_path / "benchmarks").exists()


def test_a_dvc_experiment_is_saved_with_its_params_and_lock(tmp_path, monkeypatch):
    """A real DVC experiment (`dvc exp save`, as import-runs records a GPU run): its records and
    params.yaml come from the experiment's commit, not from the workspace, and a record its stages
    did not write (the baseline's, carried in that commit) is not kept as its own."""
    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], check=True)
    write_metrics(Path("metrics/train.json"), {"final_validation_loss": 5.0})  # the baseline's own run
    subprocess.run(["git", "add", "metrics/train.json"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    machine_and_benchmark(Path("metrics"), "test-cpu-0123abcd")
    Path("params.yaml").write_text("seed: 7\n")
    Path("dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    files = ["metrics/machine.json", "metrics/benchmark.json", "params.yaml", "dvc.lock"]
    dvc = [sys.executable, "-m", "dvc", "exp", "save", "-q", "-n", "cpu-twin", *(f for p in files for f in ("-I", p))]
    subprocess.run(dvc, check=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    Path("params.yaml").write_text("seed: 8\n")  # the workspace moved on; the experiment did not
    # train.json is in the experiment's commit, unchanged from the baseline (train did not run): not kept.
    folder = measured_save.save("cpu-twin", "", "dvc exp run", experiment="cpu-twin", today="2026-12-04")
    assert folder == Path("benchmarks/test-cpu-0123abcd/cpu-twin")
    assert {p.name for p in folder.iterdir()} == {"benchmark.json", "params.yaml", "run.json"}
    assert (folder / "params.yaml").read_text() == "seed: 7\n"
    assert json.loads((folder / "benchmark.json").read_text())["tokens_per_second"] == 12345.6
    with pytest.raises(UserError, match="no DVC experiment named other here"):
        measured_save.save("other", "", "dvc exp run", experiment="other")
