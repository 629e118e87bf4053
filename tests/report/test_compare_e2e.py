"""End to end: real DVC experiments in a throw-away repo, compared by `buildllm compare`.

The "laptop" is a clone of the session's experiments lab (tests/conftest.py `experiments_lab`, shared
with the run-card tests): the bounded pipeline, reproduced once with `dvc repro`, then two runs through
`dvc exp run --queue` + `dvc queue start` (a different batch size, and a cuda run that fails on this
CUDA-less machine), then two whole-pipeline runs directly (fp32 and bf16 autocast on the CPU; bf16 only
on a CPU with a bf16 matmul path, elsewhere refused). Where bf16 is refused, the tests that need two
runs compare fp32 with the batch-size run, and those about bf16 itself skip. DVC's own `dvc metrics
diff` of the two direct runs is checked here too (it needs the same runs). A second clone (the "GPU
box") gets the runs through a bare git remote and a directory DVC remote, the route
docs/across-machines.md gives for comparing a laptop's run with a GPU machine's.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BOUNDED, ROOT, clone_project, needs_cpu_bf16, run

from buildllm.device import cpu_bf16

pytestmark = pytest.mark.slow

BF16 = cpu_bf16.native_bf16()
# The second run the cross-machine tests compare with cpu-fp32.
SECOND = "cpu-bf16" if BF16 else "cpu-bs8"


def buildllm(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "buildllm", *args], repo, check=check)


def committed_metrics(repo: Path, experiment: str, stage: str) -> dict:
    """The metrics file as git holds it in the experiment's commit: read without buildllm's code."""
    ref = run(["git", "for-each-ref", "--format=%(objectname)", f"refs/exps/**/{experiment}"], repo).stdout.split()
    assert len(ref) == 1, f"experiment {experiment}: refs {ref}"
    return json.loads(run(["git", "show", f"{ref[0]}:metrics/{stage}.json"], repo).stdout)


@pytest.fixture(scope="module")
def lab(experiments_lab, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("compare")
    laptop = clone_project(experiments_lab[0], root / "laptop")
    store = experiments_lab[0].parent / "dvc-store"  # the lab's DVC remote, which only these tests push to
    return {"root": root, "laptop": laptop, "store": store, "queue_status": experiments_lab[1]}


def read_csv(path: Path) -> dict:
    return {row["experiment"]: row for row in csv.DictReader(path.open())}


def test_queue_runs_the_matrix_and_records_the_failure(lab):
    status = lab["queue_status"]
    assert "cpu-bs8" in status and "cuda-bf16" in status
    assert "Failed" in status and "Success" in status


@needs_cpu_bf16
def test_two_real_runs_make_all_four_files_with_the_metrics(lab):
    laptop = lab["laptop"]
    done = buildllm(laptop, "compare", "cpu-fp32", "cpu-bf16", "--out", "reports/device_comparison")
    assert "Equal-budget comparison" in done.stdout
    files = [laptop / "reports" / f"device_comparison{s}" for s in (".md", ".csv", ".png", ".html")]
    assert all(f.exists() and f.stat().st_size > 0 for f in files)
    table = read_csv(files[1])
    for name, precision in (("cpu-fp32", "fp32"), ("cpu-bf16", "bf16")):
        bench, est = committed_metrics(laptop, name, "benchmark"), committed_metrics(laptop, name, "estimate")
        row = table[name]
        assert row["precision"] == bench["precision"] == precision
        assert float(row["tokens_per_second"]) == pytest.approx(bench["tokens_per_second"], rel=1e-12)
        assert float(row["steps_per_second"]) == pytest.approx(bench["steps_per_second"], rel=1e-12)
        assert float(row["peak_memory_bytes"]) == bench["peak_memory_bytes"]
        assert float(row["checkpoint_save_seconds"]) == pytest.approx(bench["checkpoint_save_seconds"], rel=1e-12)
        assert float(row["estimated_seconds"]) == pytest.approx(est["estimated_seconds"], rel=1e-12)
        assert row["processor"] == bench["processor"] and row["torch_version"] == bench["torch_version"]
        # The overrides it ran with, and the stages whose records it changed: the whole pipeline.
        ran = f"-S device=cpu -S precision={precision} dry_run benchmark estimate train"
        assert row["command"] == f"dvc exp run -n {name} {ran}"
    fp32, bf16 = (committed_metrics(laptop, n, "benchmark")["tokens_per_second"] for n in ("cpu-fp32", "cpu-bf16"))
    assert float(table["cpu-bf16"]["speedup_vs_first"]) == pytest.approx(bf16 / fp32, rel=1e-9)
    md = files[0].read_text()
    assert md.index("Equal-budget comparison") < md.index("## Controls") < md.index("## Results")
    assert "| precision | resolved | fp32 | bf16 | variable |" in md
    assert f"{fp32:,.0f}" in md and f"{bf16:,.0f}" in md
    rerun = "dvc exp run -n cpu-bf16 -S device=cpu -S precision=bf16 dry_run benchmark estimate train"
    assert "git checkout " in md and rerun in md
    assert "unchanged from its baseline" not in md  # both ran every stage


def test_the_readme_names_the_files_compare_writes(lab):
    """The README's "Compare the CPU with a GPU" section names the report's files: a real compare with
    no --out writes exactly those."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**5. Compare the CPU with a GPU.**")[1].split("## ")[0]
    claim = re.search(r"writes a report\s*\(`([^`]+)\.md`((?:, `[._][\w.]+`)+)\)", section)
    assert claim, "the README no longer says which files compare writes"
    stem, suffixes = claim.group(1), [".md", *re.findall(r"`([._][\w.]+)`", claim.group(2))]
    laptop = lab["laptop"]
    reports = laptop / "reports"
    before = {p: p.stat().st_mtime_ns for p in reports.glob("*")}
    time.sleep(0.01)  # a rewritten file gets a later modification time
    buildllm(laptop, "compare", "cpu-fp32", SECOND)
    written = {p.relative_to(laptop).as_posix() for p in reports.glob("*") if before.get(p) != p.stat().st_mtime_ns}
    assert written == {stem + suffix for suffix in suffixes}


def test_a_different_batch_size_is_flagged(lab):
    laptop = lab["laptop"]
    done = buildllm(laptop, "compare", "cpu-fp32", "cpu-bs8", "--out", "reports/batch")
    assert "Not an equal-budget comparison: batch_size 32 vs 8" in done.stdout
    md = (laptop / "reports" / "batch.md").read_text()
    assert "Not an equal-budget comparison: batch_size 32 vs 8" in md.split("## Controls")[0]
    assert read_csv(laptop / "reports" / "batch.csv")["cpu-bs8"]["speedup_vs_first"] == ""
    # cpu-bs8 ran benchmark and estimate only: the dry run's and the training's records in its commit are
    # its baseline's, said so, not reported as its own.
    assert "cpu-bs8: metrics/dry_run.json, metrics/train.json unchanged from its baseline" in md
    command = read_csv(laptop / "reports" / "batch.csv")["cpu-bs8"]["command"]
    assert command.endswith("-S train.batch_size=8 benchmark estimate"), command
    allowed = buildllm(laptop, "compare", "cpu-fp32", "cpu-bs8", "--allow-different", "--out", "reports/batch")
    assert "--allow-different was given" in allowed.stdout
    assert read_csv(laptop / "reports" / "batch.csv")["cpu-bs8"]["speedup_vs_first"] != ""


def test_the_failed_run_is_excluded(lab):
    laptop = lab["laptop"]
    done = buildllm(laptop, "compare", "--out", "reports/all")  # the workspace and every experiment
    assert "excluded cuda-bf16: the run failed" in done.stdout
    table = read_csv(laptop / "reports" / "all.csv")
    assert "cuda-bf16" not in table and {"cpu-fp32", SECOND, "cpu-bs8"} <= set(table)
    assert "Excluded **cuda-bf16**" in (laptop / "reports" / "all.md").read_text()
    alone = buildllm(laptop, "compare", "cpu-fp32", "cuda-bf16", "--out", "reports/none", check=False)
    assert alone.returncode == 2 and alone.stderr.startswith("error: nothing to compare")
    assert not (laptop / "reports" / "none.md").exists()


def test_round_trip_through_git_and_dvc_remotes(lab):
    root, laptop = lab["root"], lab["laptop"]
    origin = root / "origin.git"
    run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], root)
    run(["git", "remote", "add", "origin", str(origin)], laptop)
    run(["git", "push", "-q", "origin", "main"], laptop)
    run(["dvc", "exp", "push", "origin", "cpu-fp32", SECOND], laptop)  # refs to git, outputs to the DVC remote
    assert any(p.is_file() for p in lab["store"].rglob("*")), "dvc exp push sent nothing to the DVC remote"
    gpu_box = root / "gpu-box"
    run(["git", "clone", "-q", str(origin), str(gpu_box)], root)
    run(["dvc", "pull", "corpus", "tokenize"], gpu_box)  # the laptop's corpus and token files, from the DVC remote
    assert list((gpu_box / "data" / "tokens").rglob("train_tokens.pt"))
    assert "up to date" in run(["dvc", "status", "tokenize"], gpu_box).stdout  # nothing to re-tokenize there
    run(["dvc", "exp", "pull", "origin", "cpu-fp32", SECOND], gpu_box)
    done = buildllm(gpu_box, "compare", "cpu-fp32", SECOND, "--out", "reports/device_comparison")
    assert ("Equal-budget comparison" if BF16 else "Not an equal-budget comparison: batch_size") in done.stdout
    buildllm(laptop, "compare", "cpu-fp32", SECOND, "--out", "reports/laptop")
    here = read_csv(gpu_box / "reports" / "device_comparison.csv")
    there = read_csv(laptop / "reports" / "laptop.csv")
    for name in ("cpu-fp32", SECOND):
        for column in ("rev", "tokens_per_second", "estimated_seconds", "processor", "command"):
            assert here[name][column] == there[name][column], (name, column)


def test_repro_then_experiments_diff_speed_and_memory(lab):
    """`dvc repro` measured the baseline; DVC's own diff of two runs shows the speed and memory deltas
    between fp32 and bf16 on the CPU, or fp32 at two batch sizes where bf16 is refused (its summaries,
    and a full record when named)."""
    laptop = lab["laptop"]
    benchmark = json.loads(run(["git", "show", "HEAD:metrics/benchmark.json"], laptop).stdout)
    estimate = json.loads(run(["git", "show", "HEAD:metrics/estimate.json"], laptop).stdout)
    assert benchmark["profile"] == "tiny" and benchmark["oom"] is False and benchmark["tokens_per_second"] > 0
    # tiny's CPU batch of 32 (the batch-size test above reads it too)
    assert estimate["planned_optimizer_steps"] == BOUNDED["train.training_examples"] // 32
    assert estimate["estimated_seconds"] > 0
    diff = json.loads(run(["dvc", "metrics", "diff", "cpu-fp32", SECOND, "--json"], laptop).stdout)
    changes = diff["metrics/summary/benchmark.json"]
    for key in ("tokens_per_s", "peak_mib"):
        assert isinstance(changes[key]["diff"], (int, float)), (key, changes.get(key))
        assert changes[key]["old"] > 0 and changes[key]["new"] > 0
    assert "metrics/summary/estimate.json" in diff
    full = json.loads(
        run(
            ["dvc", "metrics", "diff", "cpu-fp32", SECOND, "--targets", "metrics/benchmark.json", "--json"], laptop
        ).stdout
    )["metrics/benchmark.json"]
    for key in ("tokens_per_second", "steps_per_second", "peak_memory_bytes"):
        assert isinstance(full[key]["diff"], (int, float)), (key, full.get(key))
    # Each experiment really ran with its settings: its commit holds its full record (a stage output).
    shown = json.loads(run(["dvc", "exp", "show", "--json"], laptop).stdout)
    revs = [rev for baseline in shown for exp in baseline.get("experiments") or [] for rev in exp["revs"]]
    ran = {"cpu-fp32": ("fp32", 32), SECOND: ("bf16", 32) if BF16 else ("fp32", 8)}
    for name, (precision, batch) in ran.items():
        rev = next(rev for rev in revs if rev.get("name") == name)
        record = json.loads(run(["git", "show", f"{rev['rev']}:metrics/benchmark.json"], laptop).stdout)
        assert (record["precision"], record["batch_size"]) == (precision, batch)
