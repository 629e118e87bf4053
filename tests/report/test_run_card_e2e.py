"""End to end with real DVC in a throw-away repo: `dvc repro` leaves a run card that renders offline,
and two experiments' training logs overlay in `dvc plots diff` and in `buildllm compare`.

The project is a clone of the session's experiments lab (tests/conftest.py `experiments_lab`, shared
with the compare tests): the whole bounded pipeline (tiny preset, a few steps), then whole-pipeline
experiments of the same controls that differ in precision (this machine has no second device; a CPU
run and a CUDA run compare the same way), the last one's outputs in the workspace. On a CPU without a
bf16 matmul path, where bf16 is refused, only the fp32 experiment runs and the comparison of the two
skips.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LAB_RUNS, clone_project, needs_cpu_bf16, run
from test_run_card import png_size

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = LAB_RUNS  # the lab's whole-pipeline runs, in the order they ran
PLOTS = ("Loss against step", "Loss against elapsed time", "Tokens per second against step")


def exp_ref(repo: Path, name: str) -> str:
    refs = run(["git", "for-each-ref", "--format=%(objectname)", f"refs/exps/**/{name}"], repo).stdout.split()
    assert len(refs) == 1, refs
    return refs[0]


@pytest.fixture(scope="module")
def lab(experiments_lab, tmp_path_factory) -> Path:
    return clone_project(experiments_lab[0], tmp_path_factory.mktemp("card") / "project")


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs headless Chromium (Debian: apt-get install -y chromium)"
)
def test_dvc_repro_leaves_a_run_card_that_renders_offline(lab, tmp_path):
    assert "report" not in run(["dvc", "status", "report"], lab).stdout  # its outputs recorded, up to date
    sample = json.loads((lab / "metrics" / "sample_notes.json").read_text())
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "lab" / "check_report_html.py"),
            str(lab / "plots" / "run_card.html"),
            "--tables",
            "headline",
            "plan",
            "memory",
            "--screenshot",
            str(shot),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    findings = json.loads(done.stdout)
    assert done.returncode == 0, findings["problems"]
    assert findings["images"] == findings["decoded"] == 4 and findings["fetched"] == []
    text = findings["text"]
    precision = json.loads((lab / "metrics" / "train.json").read_text())["precision"]  # the last experiment's
    assert f"Run card: tiny on cpu ({precision})" in text and "headless Chromium, networking off" in text
    assert sample["text"].split()[-1] in text and f"checkpoint step {sample['checkpoint_step']}" in text
    # A full pipeline recorded every stage the card reads, the machine stage's fingerprint among them.
    machine = json.loads((lab / "metrics" / "machine.json").read_text())
    # The peak's unit follows its size: GFLOP/s on most 2-core CPUs, TFLOP/s for bf16 on one with AMX.
    assert re.search(r"% of a [\d.]+ [GT]FLOP/s peak \(measured", text), text
    assert "metrics/machine.json is absent" not in text
    assert machine["machine_id"] in text
    for shown in (shot, lab / "plots" / "run_card.png"):  # the test's screenshot and the stage's own PNG
        width, height = png_size(shown)
        assert width == 1280 and height >= 1500 and shown.stat().st_size > 100_000


def test_dvc_plots_diff_overlays_both_experiments_with_numbers(lab):
    out = run(["dvc", "plots", "diff", *EXPERIMENTS, "--json"], lab).stdout
    plots = json.loads(out)["data"]
    for plot in PLOTS:
        values = plots[plot][0]["content"]["data"]["values"]
        revs = {v["rev"] for v in values}
        assert set(EXPERIMENTS) <= revs, (plot, revs)
        for v in values:
            assert isinstance(v["step"], int) and isinstance(v["elapsed_seconds"], float), v
            assert all(v[k] is None or isinstance(v[k], float) for k in ("train_loss", "validation_loss"))
        for name in EXPERIMENTS:  # one series per experiment and y field, in the order of the log
            for field in {v.get("field") for v in values}:  # a plot of one y field has none
                mine = [v for v in values if v["rev"] == name and v.get("field") == field]
                elapsed = [v["elapsed_seconds"] for v in mine]
                assert len(mine) > 4 and elapsed == sorted(elapsed), (plot, name, field)


@needs_cpu_bf16
def test_compare_overlays_the_curves_and_times_a_loss_both_reach(lab):
    run([sys.executable, "-m", "buildllm", "compare", *EXPERIMENTS, "--out", "cmp"], lab)
    md = (lab / "cmp.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| time to validation loss ≤"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 3 and all(" (step " in c for c in cells[1:]), row
    assert png_size(lab / "cmp_curves.png")[0] > 1000
    assert (lab / "cmp.html").read_text().count("data:image/png;base64,") == 2


def test_the_card_of_a_named_experiment_is_read_from_its_commit(lab):
    name, precision = next(reversed(EXPERIMENTS.items()))  # the last experiment run: not the workspace's
    precision = precision.split("=")[1]
    run([sys.executable, "-m", "buildllm", "report", "--experiment", name], lab)
    page = (lab / "reports" / f"run_card_{name}.html").read_text()
    committed = json.loads(run(["git", "show", f"{exp_ref(lab, name)}:metrics/sample_notes.json"], lab).stdout)
    assert f"Run card: tiny on cpu ({precision}), experiment {name}" in page
    assert html.escape(committed["text"].split()[-1]) in page
