"""Compare and report on `dvc exp show --json` rows: controls check, failed runs, the four files.

The rows have the shape DVC 3 prints (checked against real runs in test_compare_e2e.py); building
them here lets each rule be tested on its own, fast.
"""

from __future__ import annotations

import copy
import csv
import html
import json
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from buildllm.cli import main
from buildllm.config import defaults_dict
from buildllm.errors import UserError
from buildllm.measure.stats import from_intervals, interval_metrics, interval_rates, noise_warning, sign_interval, t975
from buildllm.metrics import short_label
from buildllm.report.chart import panels
from buildllm.report.compare import compare
from buildllm.report.document import Heading, Table, to_html, to_markdown
from buildllm.report.experiments import select
from buildllm.report.render import sections, write_report

ROOT = Path(__file__).resolve().parents[2]
BASE = "b" * 40


@pytest.fixture(autouse=True)
def outside_the_checkout(tmp_path, monkeypatch):
    # Compare reads the workspace's full metrics records from the current folder (and an experiment's
    # through git); the made-up `exp show` rows here must not meet the checkout's own files.
    monkeypatch.chdir(tmp_path)


def benchmark(
    device="cpu",
    precision="fp32",
    tokens_per_second=10000.0,
    batch_size=32,
    threads=2,
    spread=(-0.06, -0.02, 0.02, 0.06),
    **extra,
):
    steps = tokens_per_second / (batch_size * 64)
    rates = [steps * (1 + d) for d in spread]  # the measured intervals, as the benchmark records them
    return {
        "device": device,
        "precision": precision,
        "profile": "tiny",
        "architecture": "classic",
        "parameters": 400000,
        "batch_size": batch_size,
        "grad_accum": 1,
        "sequence_length": 64,
        "measured_steps": 20,
        "warmup_steps": 3,
        "threads": threads,
        "intervals": len(rates),
        "tokens_per_second": tokens_per_second,
        "steps_per_second": steps,
        **{f"interval_{i}_steps_per_second": r for i, r in enumerate(rates, start=1)},
        "interval_steps_per_second_min": min(rates),
        "interval_steps_per_second_max": max(rates),
        "throughput_cv": 0.05,
        "peak_memory_bytes": 123 * 2**20,
        "checkpoint_save_seconds": 0.25,
        "checkpoint_bytes": 5 * 2**20,
        "time_to_first_step_seconds": 1.5,
        "mfu": 0.01,
        "peak_flops": 2.0e11,
        "peak_flops_source": "measured: 2048^3 fp32 matmul",
        "peak_memory_method": "cpu: peak RSS growth",
        "processor": "Test CPU 9000",
        "gpu_name": "",
        "gpu_memory_bytes": 0,
        "memory_total_bytes": 16 * 2**30,
        "torch_version": "2.13.0+cpu",
        "torch_cuda_version": "none (CPU-only build)",
        "python_version": "3.11.2",
        **extra,
    }


def estimate(seconds=3600.0, device="cpu", precision="fp32", batch_size=32):
    return {
        "device": device,
        "precision": precision,
        "batch_size": batch_size,
        "planned_tokens": 1_000_000,
        "estimated_seconds": seconds,
        "estimated_seconds_low": seconds * 0.9,
        "estimated_seconds_high": seconds * 1.2,
    }


def params(**overrides):
    data = defaults_dict()
    data["preset"] = "tiny"
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node[leaf] = value
    return data


def entry(rev, params_data, metrics, timestamp="2026-01-01T10:00:00", error=None, name=None):
    return {
        "rev": rev,
        "name": name,
        "error": error,
        "experiments": None,
        "data": {
            "rev": rev,
            "timestamp": timestamp,
            "params": {"params.yaml": {"data": params_data}},
            "metrics": {f"metrics/{stage}.json": {"data": data} for stage, data in metrics.items()},
            "deps": {
                "data/tokens": {"hash": "abc123.dir", "size": 10, "nfiles": 2},
                "buildllm/model.py": {"hash": "ffff", "size": 1, "nfiles": None},
            },
            "outs": {},
            "meta": {},
        },
    }


def experiment(name, rev, overrides, metrics, minute, state=None, error=None):
    group = {
        "name": name,
        "executor": None,
        "revs": [entry(rev, params(**overrides), metrics, f"2026-01-01T10:{minute:02d}:00", error, name)],
    }
    if state:
        group["executor"] = {
            "state": state,
            "name": "dvc-task",
            "local": {"log": f"/x/{name}.out", "returncode": 255 if state == "failed" else 0},
        }
    return group


def rows(*groups, workspace=None, baseline_metrics=None):
    baseline = entry(BASE, params(), baseline_metrics or {})
    baseline["name"] = "main"
    baseline["experiments"] = list(groups)
    return [workspace or entry("workspace", params(), {}, timestamp=None), baseline]


FP32 = experiment(
    "cpu-fp32",
    "1" * 40,
    {"device": "cpu", "precision": "fp32"},
    {"benchmark": benchmark(), "estimate": estimate(3600.0)},
    1,
)
BF16 = experiment(
    "cpu-bf16",
    "2" * 40,
    {"device": "cpu", "precision": "bf16"},
    {
        "benchmark": benchmark(precision="bf16", tokens_per_second=15000.0),
        "estimate": estimate(2400.0, precision="bf16"),
    },
    2,
)
BS8 = experiment(
    "cpu-bs8",
    "3" * 40,
    {"device": "cpu", "precision": "bf16", "train.batch_size": 8},
    {
        "benchmark": benchmark(precision="bf16", batch_size=8, tokens_per_second=12000.0),
        "estimate": estimate(3000.0, precision="bf16", batch_size=8),
    },
    3,
)
THREADS1 = experiment(
    "cpu-t1",
    "4" * 40,
    {"device": "cpu", "precision": "fp32", "train.threads": 1},
    {"benchmark": benchmark(threads=1, tokens_per_second=6000.0), "estimate": estimate(6000.0)},
    4,
)
# A queued run that failed: exp show lists the metrics it started from, i.e. the baseline's/workspace's.
FAILED = experiment(
    "cuda-bf16",
    "5" * 40,
    {"device": "cuda", "precision": "bf16"},
    {"benchmark": benchmark(tokens_per_second=987654.0), "estimate": estimate(1.0)},
    5,
    state="failed",
    error={"msg": "Experiment run failed", "type": ""},
)


def test_equal_controls_give_speedups_from_the_metrics():
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    assert c.equal_budget and c.speedups_shown
    assert c.verdict.startswith("Equal-budget comparison")
    f = c.frame.set_index("experiment")
    assert f.loc["cpu-bf16", "tokens_per_second"] == 15000.0
    assert f.loc["cpu-bf16", "speedup_vs_first"] == pytest.approx(1.5)
    assert f.loc["cpu-fp32", "estimated_seconds"] == 3600.0
    assert list(f.index) == ["cpu-fp32", "cpu-bf16"]


def test_a_different_batch_size_is_flagged_and_speedups_withheld(tmp_path):
    c = compare(["cpu-fp32", "cpu-bs8"], rows=rows(FP32, BS8))
    assert c.differences == ["batch_size 32 vs 8"]
    assert "Not an equal-budget comparison: batch_size" in c.verdict
    assert c.frame["speedup_vs_first"].isna().all()
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    head = md.split("## Controls")[0]
    assert "Not an equal-budget comparison: batch_size" in head and "withheld" in head
    assert "| train.batch_size | params | null | 8 | DIFFERENT |" in md
    assert "| speed-up vs cpu-fp32 | withheld | withheld |" in md


def test_allow_different_shows_speedups_and_keeps_the_differences(tmp_path):
    c = compare(["cpu-fp32", "cpu-bs8"], allow_different=True, rows=rows(FP32, BS8))
    assert not c.equal_budget and c.speedups_shown
    assert c.frame["speedup_vs_first"].tolist() == pytest.approx([1.0, 1.2])
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert "Not an equal-budget comparison: batch_size" in md and "--allow-different was given" in md
    assert "1.20×" in md and "DIFFERENT" in md


def test_vary_names_an_intended_difference():
    assert not compare(["cpu-fp32", "cpu-t1"], rows=rows(FP32, THREADS1)).equal_budget
    c = compare(["cpu-fp32", "cpu-t1"], vary=["train.threads"], rows=rows(FP32, THREADS1))
    assert c.equal_budget and c.frame["speedup_vs_first"].tolist() == pytest.approx([1.0, 0.6])
    assert "train.threads" in c.verdict
    with pytest.raises(UserError, match="--vary batchsize"):
        compare(["cpu-fp32", "cpu-t1"], vary=["batchsize"], rows=rows(FP32, THREADS1))


def test_a_failed_run_is_excluded_and_its_numbers_never_reported(tmp_path):
    c = compare([], rows=rows(FP32, BF16, FAILED))
    assert [e.name for e in c.experiments] == ["cpu-fp32", "cpu-bf16"]
    excluded = dict(c.excluded)
    assert "records no metrics" in excluded["workspace"]
    why = excluded["cuda-bf16"]
    assert "failed (exit code 255)" in why and "/x/cuda-bf16.out" in why
    for path in write_report(c, tmp_path / "r"):
        if path.suffix != ".png":
            text = path.read_text()
            assert "987654" not in text and "987,654" not in text
    assert "Excluded **cuda-bf16**" in (tmp_path / "r.md").read_text()


def test_metrics_that_contradict_their_params_are_excluded():
    # No error recorded (e.g. pulled from another machine), but a cuda run whose metrics say cpu.
    stale = copy.deepcopy(FAILED)
    stale["executor"], stale["revs"][0]["error"] = None, None
    c = compare(["cpu-fp32", "cuda-bf16", "cpu-bf16"], rows=rows(FP32, stale, BF16))
    assert [e.name for e in c.experiments] == ["cpu-fp32", "cpu-bf16"]
    assert "metrics/benchmark.json says device cpu but its params ask for device=cuda" in c.excluded[0][1]


def test_a_queued_run_is_not_reported():
    queued = copy.deepcopy(BS8)
    queued["executor"] = {"state": "queued", "local": {}}
    c = compare([], rows=rows(FP32, BF16, queued))
    assert "queued" in dict(c.excluded)["cpu-bs8"]


def test_an_absent_metric_is_said_not_invented(tmp_path):
    no_estimate = copy.deepcopy(BF16)
    del no_estimate["revs"][0]["data"]["metrics"]["metrics/estimate.json"]
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, no_estimate))
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert any("metrics/estimate.json is absent in cpu-bf16" in n for n in c.notes)
    assert "| estimated full run | 1 h 00 min (range 54 min 00 s – 1 h 12 min) | not recorded |" in md
    rows_csv = list(csv.DictReader(open(tmp_path / "r.csv")))
    assert rows_csv[1]["estimated_seconds"] == "" and float(rows_csv[0]["estimated_seconds"]) == 3600.0


def test_the_report_records_how_to_reproduce(tmp_path):
    c = compare(["cpu-fp32", "cpu-bs8"], rows=rows(FP32, BS8), allow_different=True)
    md = Path(write_report(c, tmp_path / "out" / "cmp")[0]).read_text()
    assert "dvc exp run -n cpu-bs8 -S device=cpu -S precision=bf16 -S train.batch_size=8 benchmark estimate" in md
    assert f"git checkout {BASE}" in md and "3" * 40 in md and "2026-01-01T10:03:00" in md
    assert "processor Test CPU 9000; GPU none; memory 16.00 GiB; PyTorch 2.13.0+cpu" in md
    assert "Python 3.11.2; not recorded; BuildLLM not recorded; 2 threads; logical cores not recorded" in md
    assert "buildllm compare cpu-fp32 cpu-bs8 --out" in md and "--allow-different" in md.split("How to rerun")[1]


def test_all_four_files_hold_the_metrics(tmp_path):
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    paths = write_report(c, tmp_path / "cmp.html")  # a suffix on --out is dropped
    assert [p.name for p in paths] == ["cmp.md", "cmp.csv", "cmp.png", "cmp.html", "cmp_curves.png"]
    assert (tmp_path / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = {r["experiment"]: r for r in csv.DictReader(open(tmp_path / "cmp.csv"))}
    assert float(table["cpu-bf16"]["tokens_per_second"]) == 15000.0
    assert float(table["cpu-bf16"]["speedup_vs_first"]) == pytest.approx(1.5)
    assert table["cpu-bf16"]["param:precision"] == "bf16" and table["cpu-fp32"]["benchmark:throughput_cv"] == "0.05"
    page = (tmp_path / "cmp.html").read_text()
    assert "data:image/png;base64," in page and "http://" not in page and "https://" not in page
    assert page.index("id='verdict'") < page.index("id='controls'") < page.index("id='results'")
    assert "15,000" in page and "1.50×" in page


def test_other_token_files_are_a_difference_and_noise_is_said():
    other = copy.deepcopy(BF16)
    data = other["revs"][0]["data"]
    data["outs"] = {"data/tokens": {"hash": "fedcba987654.dir"}, "tokenizer": {"hash": "0123456789ab.dir"}}
    data["metrics"]["metrics/benchmark.json"]["data"]["throughput_cv"] = 0.36
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, other))
    assert "data file data/tokens abc123.dir vs fedcba987654" in c.differences
    assert "data file tokenizer not recorded vs 0123456789ab" in c.differences
    assert any(n.startswith("cpu-bf16: throughput varied 36% between measured intervals") for n in c.notes)


def test_metrics_a_run_carried_over_from_its_baseline_are_not_its_own(tmp_path):
    # The baseline committed a full run (fp32, and a train stage); the experiments ran only benchmark
    # and estimate, so their commits still hold the baseline's dry_run.json and train.json.
    dry = {"device": "cpu", "precision": "fp32", "batch_size": 32, "parameters": 400000}
    train = {"device": "cpu", "precision": "fp32", "tokens_per_second": 4321.0, "elapsed_seconds": 99.0}
    experiments = []
    for group in (FP32, BF16):
        group = copy.deepcopy(group)
        group["revs"][0]["data"]["metrics"].update(
            {"metrics/dry_run.json": {"data": dry}, "metrics/train.json": {"data": train}}
        )
        experiments.append(group)
    c = compare([], rows=rows(*experiments, baseline_metrics={"dry_run": dry, "train": train}))
    assert [e.name for e in c.experiments] == ["cpu-fp32", "cpu-bf16"] and c.equal_budget
    assert c.frame["train_tokens_per_second"].isna().all()
    assert any(
        n.startswith("cpu-bf16: metrics/dry_run.json, metrics/train.json unchanged from its baseline") for n in c.notes
    )
    assert c.experiments[1].command.endswith("-S precision=bf16 benchmark estimate")
    assert "4,321" not in Path(write_report(c, tmp_path / "r")[0]).read_text()


def test_workspace_identical_to_an_experiment_is_shown_once():
    ws = copy.deepcopy(BF16["revs"][0])
    ws["rev"], ws["data"]["timestamp"] = "workspace", None
    c = compare([], rows=rows(FP32, BF16, workspace=ws))
    assert [e.name for e in c.experiments] == ["cpu-fp32", "cpu-bf16"]
    assert "identical to experiment cpu-bf16" in c.notes[0]


def test_an_experiment_of_another_commit_is_found_in_all_commits():
    other = entry("c" * 40, params(), {})
    other["name"], other["experiments"] = "older", [copy.deepcopy(BS8)]
    asked = []

    def everything():
        asked.append(True)
        return rows(FP32) + [other]

    chosen, _ = select(["cpu-fp32", "cpu-bs8"], rows(FP32), everything)
    assert [(e.name, e.baseline) for e in chosen] == [("cpu-fp32", BASE), ("cpu-bs8", "c" * 40)] and asked
    assert (
        chosen[1].command
        == "dvc exp run -n cpu-bs8 -S device=cpu -S precision=bf16 -S train.batch_size=8 benchmark estimate"
    )


def test_unknown_names_and_too_few_runs_are_one_line_errors():
    with pytest.raises(UserError, match="no experiment, commit, branch or metrics folder named 'nope'"):
        compare(["cpu-fp32", "nope"], rows=rows(FP32, BF16))
    with pytest.raises(UserError, match="nothing to compare: 1 usable"):
        compare(["cpu-fp32", "cuda-bf16"], rows=rows(FP32, FAILED))


def test_cli_outside_a_dvc_project_fails_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "a", "b", "--out", "r"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `dvc exp show` failed") and "Traceback" not in err
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs headless Chromium (Debian: apt-get install -y chromium)"
)
def test_html_renders_offline_in_chromium(tmp_path):
    c = compare(["cpu-fp32", "cpu-bs8"], rows=rows(FP32, BS8))
    html_path = write_report(c, tmp_path / "cmp")[3]
    check = [sys.executable, str(ROOT / "lab" / "check_report_html.py")]
    done = subprocess.run(check + [str(html_path)], capture_output=True, text=True, timeout=180)
    findings = json.loads(done.stdout)
    assert done.returncode == 0, findings["problems"]
    assert findings["decoded"] == findings["images"] == 2 and findings["chart_width"] > 500  # bars, curves
    assert findings["tables"]["controls"][0] > 5 and findings["tables"]["results"][0] > 5
    assert findings["verdict"].startswith("Not an equal-budget comparison: batch_size")
    # The same page with its chart moved to the network must fail the check.
    broken = tmp_path / "broken.html"
    broken.write_text(html_path.read_text().replace("data:image/png;base64,", "https://example.com/chart.png#"))
    done = subprocess.run(check + [str(broken)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 1 and "the chart image did not decode" in json.loads(done.stdout)["problems"]


# Speed-ups with their uncertainty (issue 10), controls polish, metrics folders (issue 14).


def test_a_quiet_speedup_carries_its_interval_and_is_a_result(tmp_path):
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    s = c.speedups["cpu-bf16"]
    assert s.low < 1.5 < s.high and s.low > 1.0 and s.coverage == 0.95
    assert c.tone == "ok" and c.inconclusive("cpu-bf16") is None
    assert "cpu-bf16 vs cpu-fp32: 1.50× (95% interval" in c.verdict
    f = c.frame.set_index("experiment")
    assert f.loc["cpu-bf16", "speedup_low"] == pytest.approx(s.low) and f.loc[
        "cpu-bf16", "speedup_high"
    ] == pytest.approx(s.high)
    md, _, _, page, _ = (Path(p) for p in write_report(c, tmp_path / "r"))
    assert f"1.50× (95% interval {s.low:.2f}–{s.high:.2f}×; result)" in md.read_text()
    assert "class='verdict ok'" in page.read_text()


def test_an_interval_including_one_is_inconclusive_and_not_green(tmp_path):
    close = experiment(
        "cpu-bf16",
        "2" * 40,
        {"device": "cpu", "precision": "bf16"},
        {
            "benchmark": benchmark(precision="bf16", tokens_per_second=10300.0),
            "estimate": estimate(3500.0, precision="bf16"),
        },
        2,
    )
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, close))
    assert c.speedups["cpu-bf16"].low < 1.0 < c.speedups["cpu-bf16"].high
    assert c.equal_budget and c.tone == "caution"
    assert "cpu-bf16 vs cpu-fp32: inconclusive, 1.03× (95% interval" in c.verdict
    assert "the interval includes 1.0 (no change)" in c.verdict
    page = Path(write_report(c, tmp_path / "r")[3]).read_text()
    assert "class='verdict caution'" in page and "verdict ok" not in page


def test_a_noisy_run_makes_even_a_large_speedup_inconclusive(tmp_path):
    # Issue 10's busy machine: a 4.64x "speed-up" from runs whose intervals varied 31-44%.
    noisy = experiment(
        "cpu-bf16",
        "2" * 40,
        {"device": "cpu", "precision": "bf16"},
        {
            "benchmark": benchmark(
                precision="bf16", tokens_per_second=46400.0, spread=(-0.01, 0.0, 0.0, 0.01), throughput_cv=0.44
            ),
            "estimate": estimate(800.0, precision="bf16"),
        },
        2,
    )
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, noisy))
    assert c.speedups["cpu-bf16"].low > 1.0  # the intervals alone would call it a result
    assert c.tone == "caution" and c.noisy == [("cpu-bf16", 0.44)]
    assert (
        "inconclusive, 4.64×" in c.verdict and "varied 44% between intervals, over the 10% noise threshold" in c.verdict
    )
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert "| throughput variation (CV) | 5.0% | 44.0% (noisy: over 10%) |" in md
    assert "inconclusive)" in md.split("## Results")[1]


def test_report_tables_show_peak_source_memory_method_and_same_device():
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    md = to_markdown(sections(c, Path("r"), b""))
    assert "| device | resolved | cpu | cpu | same |" in md  # both on the CPU: not "variable"
    assert "| precision | resolved | fp32 | bf16 | variable |" in md
    assert "| MFU's peak FLOP/s (source) | 0.2 TFLOP/s (measured: 2048^3 fp32 matmul) |" in md
    assert "| peak memory method | cpu: peak RSS growth | cpu: peak RSS growth |" in md


def test_the_chart_draws_the_estimate_range_and_speedup_intervals():
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    found = {title.split(" (")[0].split(",")[0]: spread for title, _, _, spread in panels(c.frame)}
    low, high = found["Estimated full run"]
    assert list(low) == [54, 36] and list(high) == [72, 48]  # minutes: 3600 s and 2400 s, -10% +20%
    low, high = found["Speed-up vs cpu-fp32"]
    assert high[1] == pytest.approx(c.speedups["cpu-bf16"].high)


def test_sign_interval_and_welch_interval():
    assert sign_interval([1.1, 0.9, 1.0, 1.2, 0.95, 1.05]) == (0.9, 1.2, pytest.approx(1 - 2 / 64))
    low, high, coverage = sign_interval([1.0, 1.1, 0.9])
    assert (low, high) == (0.9, 1.1) and coverage == pytest.approx(0.75)
    assert sign_interval(list(range(1, 21)))[:2] == (6, 15)  # 20 pairs: the 6th and 15th order statistics
    same = benchmark()
    s = from_intervals(same, same)
    assert s.estimate == 1.0 and s.low < 1.0 < s.high
    old = {"tokens_per_second": 100.0, "intervals": 4, "throughput_cv": 0.05}  # before per-interval rates
    assert from_intervals(old, {**old, "tokens_per_second": 200.0}).low == pytest.approx(
        2 * math.exp(-t975(6) * math.sqrt(2 * 0.05**2 * 4 / 3 / 4))
    )


def test_the_noise_warning_names_the_threshold():
    assert noise_warning({"throughput_cv": 0.03}) is None
    line = noise_warning(
        {"throughput_cv": 0.445, "interval_1_steps_per_second": 2.0, "interval_2_steps_per_second": 5.0}
    )
    assert (
        line.startswith("warning: noisy run: throughput varied 44%") and "2.00-5.00 steps/s" in line and "10%" in line
    )
    assert interval_rates(interval_metrics([1.0, 2.0, 3.0])) == [1.0, 2.0, 3.0]


def write_folder(folder: Path, bench: dict, est: dict | None = None, params_data=None, lock_hash=None) -> str:
    folder.mkdir(parents=True)
    (folder / "benchmark.json").write_text(json.dumps(bench))
    if est:
        (folder / "estimate.json").write_text(json.dumps(est))
    if params_data is not None:
        (folder / "params.yaml").write_text(yaml.safe_dump(params_data))
    if lock_hash:
        (folder / "dvc.lock").write_text(
            yaml.safe_dump(
                {
                    "schema": "2.0",
                    "stages": {"tokenize": {"outs": [{"path": "data/tokens", "hash": "md5", "md5": lock_hash}]}},
                }
            )
        )
    return str(folder)


def test_a_metrics_folder_from_another_machine_is_compared_with_the_same_checks(tmp_path):
    h200 = write_folder(
        tmp_path / "benchmarks" / "h200",
        benchmark("cuda", "bf16", 400000.0, gpu_name="NVIDIA H200"),
        estimate(60.0, "cuda", "bf16"),
    )
    c = compare(["cpu-fp32", h200], rows=rows(FP32))
    assert [e.source for e in c.experiments] == ["dvc", "folder"] and c.equal_budget
    assert c.speedups[h200].estimate == pytest.approx(40.0)
    assert any("without params.yaml" in n for n in c.notes) and any("without dvc.lock" in n for n in c.notes)
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert "| precision | params | fp32 | not recorded | same |" not in md
    assert "| batch_size | resolved | 32 | 32 | same |" in md
    assert "| data/tokens | data file | abc123.dir | not recorded | not checked (not recorded) |" in md
    assert f"source: metrics folder `{h200}`, measured on another machine" in md
    # Another batch size there is a difference, as for any experiment.
    other = write_folder(
        tmp_path / "bs8",
        benchmark("cuda", "bf16", batch_size=8),
        params_data=params(**{"device": "cuda", "precision": "bf16", "train.batch_size": 8}),
        lock_hash="fedcba987654.dir",
    )
    c = compare(["cpu-fp32", other], rows=rows(FP32))
    assert "batch_size 32 vs 8" in c.differences and "data file data/tokens abc123.dir vs fedcba987654" in c.differences


def test_a_metrics_folder_deep_in_the_file_system_leaves_the_chart_readable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    deep = write_folder(
        tmp_path / ("runs_from_the_gpu_machine_" * 3) / "benchmarks" / "h200",
        benchmark("cuda", "bf16", 400000.0, gpu_name="NVIDIA H200"),
        estimate(60.0, "cuda", "bf16"),
    )
    relative = write_folder(
        Path("runs_kept_from_the_gpu_week_" * 3) / "h100", benchmark("cuda", "bf16", 300000.0), estimate(80.0)
    )
    c = compare(["cpu-fp32", deep, relative], rows=rows(FP32))
    with warnings.catch_warnings():
        # matplotlib's word for panels squeezed to nothing by labels as long as the path.
        warnings.filterwarnings("error", message="constrained_layout not applied")
        md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert short_label(deep) == "…/h200" and short_label("cpu-fp32") == "cpu-fp32"
    assert len(short_label(relative)) == 30 and short_label(relative).endswith("…")
    assert f"`{deep}`" in md  # the report's text keeps the whole path


def test_metrics_folders_alone_need_no_dvc(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # not a DVC project: `dvc exp show` would fail here
    write_folder(tmp_path / "cpu", benchmark(), params_data=params(device="cpu", precision="fp32"))
    write_folder(
        tmp_path / "gpu",
        benchmark("cuda", "bf16", 300000.0, spread=(0.0, 0.0, 0.0, 0.0)),
        params_data=params(device="cuda", precision="bf16"),
    )
    assert main(["compare", "cpu", "gpu", "--out", "reports/x"]) == 0
    out = capsys.readouterr().out
    assert "Equal-budget comparison" in out and "gpu vs cpu: 30.00× (95% interval" in out
    assert (tmp_path / "reports" / "x.html").exists()
    assert main(["compare", "cpu", "gpu", "--paired", "--out", "reports/x"]) == 2
    assert "it cannot be rerun here" in capsys.readouterr().err


def test_two_names_with_one_cached_measurement_are_said_to_be_one():
    twin = copy.deepcopy(FP32)
    twin["name"] = twin["revs"][0]["name"] = "cpu-fp32-again"
    twin["revs"][0]["rev"] = "6" * 40
    c = compare(["cpu-fp32", "cpu-fp32-again"], rows=rows(FP32, twin))
    assert any(n.startswith("cpu-fp32-again: its benchmark metrics are identical to cpu-fp32's") for n in c.notes)


def test_markdown_and_html_come_from_the_same_sections(tmp_path):
    c = compare(["cpu-fp32", "cpu-bs8"], rows=rows(FP32, BS8), allow_different=True)
    blocks = sections(c, tmp_path / "r", b"\x89PNG")
    md, page = to_markdown(blocks), to_html(blocks, "t")
    headings = [b.text for b in blocks if isinstance(b, Heading)]
    assert headings[:3] == ["Device comparison: cpu-fp32 vs cpu-bs8", "Controls", "Results"]
    for text in headings:
        assert text in md and text in page
    for table in (b for b in blocks if isinstance(b, Table)):
        assert page.count(f"<table id='{table.ident}'>") == 1
        for row in table.rows:
            assert "| " + " | ".join(str(v) for v in row) + " |" in md
            assert "".join(f">{html.escape(str(v))}</td>" for v in row[:1]) in page
    assert (
        "<code>dvc exp pull origin cpu-fp32 cpu-bs8</code>" in page and "`dvc exp pull origin cpu-fp32 cpu-bs8`" in md
    )


def test_one_run_s_metrics_file_alone_is_compared_too(tmp_path):
    runs = tmp_path / "h200" / "runs"
    runs.mkdir(parents=True)
    (runs / "iter1_bf16.json").write_text(json.dumps(benchmark("cuda", "bf16", 250000.0)))
    (runs / "iter1_bf16.params.yaml").write_text(
        yaml.safe_dump({"device": "cuda", "precision": "bf16", "preset": "tiny"})
    )
    c = compare(["cpu-fp32", str(runs / "iter1_bf16.json")], rows=rows(FP32), allow_different=True)
    folder = c.experiments[1]
    assert folder.params_recorded and folder.params["device"] == "cuda" and "benchmark" in folder.metrics
    assert c.speedups[folder.name].estimate == pytest.approx(25.0)
    assert "planned_tokens 1000000 vs not recorded" in c.differences  # no estimate.json beside it


def test_full_records_come_from_each_commit_and_the_workspace(tmp_path):
    # DVC shows only the summaries; a stage's full record is read from the experiment's commit with
    # git, the workspace's from disk, and an experiment row made before the summaries keeps its own.
    from buildllm.report.experiments import read_experiments

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "benchmark.json").write_text(json.dumps(benchmark(tokens_per_second=1111.0)))
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"], cwd=tmp_path, check=True)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "metrics" / "benchmark.json").write_text(json.dumps(benchmark(tokens_per_second=2222.0)))
    baselines, experiments = read_experiments(
        [{"rev": "workspace", "data": {}}, {"rev": rev, "name": "main", "data": {}}]
    )
    assert baselines[0].metric("tokens_per_second") == 1111.0 and "train" not in baselines[0].metrics
    assert experiments[0].rev == "workspace" and experiments[0].metric("tokens_per_second") == 2222.0
    assert read_experiments([{"rev": "0" * 40, "name": "gone", "data": {}}])[0][0].metrics == {}
    old = {
        "rev": rev,
        "name": "main",
        "data": {"metrics": {"metrics/benchmark.json": {"data": {"tokens_per_second": 5.0}}}},
    }
    baselines, _ = read_experiments([old])
    assert baselines[0].metrics["benchmark"] == {"tokens_per_second": 5.0}
    baselines, _ = read_experiments([{"rev": rev, "name": "main", "data": {}}])
    assert baselines[0].metric("tokens_per_second") == 1111.0


def test_a_busy_machine_is_flagged_in_the_report_and_its_speedup_is_inconclusive(tmp_path):
    busy = experiment(
        "cpu-bf16",
        "2" * 40,
        {"device": "cpu", "precision": "bf16"},
        {
            "benchmark": benchmark(
                precision="bf16",
                tokens_per_second=15000.0,
                busy_machine=True,
                other_load_start=1.62,
                other_load_end=1.9,
            ),
            "estimate": estimate(2400.0, precision="bf16"),
        },
        2,
    )
    quiet = copy.deepcopy(FP32)
    quiet["revs"][0]["data"]["metrics"]["metrics/benchmark.json"]["data"].update(
        busy_machine=False, other_load_start=0.05, other_load_end=0.1
    )
    c = compare(["cpu-fp32", "cpu-bf16"], rows=rows(quiet, busy))
    assert c.tone == "caution" and "cpu-bf16 measured on a busy machine" in c.inconclusive("cpu-bf16")
    assert any(n.startswith("cpu-bf16: measured on a busy machine: other processes used 1.62 cores") for n in c.notes)
    assert not any(n.startswith("cpu-fp32: measured on a busy machine") for n in c.notes)
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert (
        "| other processes' CPU load (start / end) | 0.05 / 0.10 cores | 1.62 / 1.90 cores (busy machine: "
        "figures slowed) |"
    ) in md
    assert list(c.frame.set_index("experiment")["busy_machine"]) == [False, True]


def train_record(vocab_size, nats, bits):
    return {
        "vocab_size": vocab_size,
        "tokenizer": f"tokenizer/wiki_vital_{vocab_size}_tokenizer.json",
        "final_validation_loss": nats,
        "final_validation_bits_per_byte": bits,
        "tokens_per_second": 9000.0,
        "elapsed_seconds": 60.0,
    }


def test_runs_with_different_tokenizers_compare_bits_per_byte_not_per_token_loss(tmp_path):
    small = experiment(
        "v4096",
        "6" * 40,
        {"tokenize.vocab_size": 4096},
        {"benchmark": benchmark(), "estimate": estimate(), "train": train_record(4096, 4.10, 1.6203)},
        6,
    )
    large = experiment(
        "v8192",
        "7" * 40,
        {"tokenize.vocab_size": 8192},
        {"benchmark": benchmark(), "estimate": estimate(), "train": train_record(8192, 4.60, 1.5877)},
        7,
    )
    c = compare(["v4096", "v8192"], rows=rows(small, large))
    note = next(n for n in c.notes if "tokenizers differ" in n)
    assert "vocab_size 4096" in note and "vocab_size 8192" in note and "per-token losses are not compared" in note
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert "| final validation loss, bits/byte (train stage) | 1.6203 | 1.5877 |" in md
    assert "| final validation loss, nats/token (train stage) | not compared: tokenizers differ" in md
    assert "4.100" not in md and "4.600" not in md
    same = compare(["cpu-fp32", "cpu-bf16"], rows=rows(FP32, BF16))
    assert not any("tokenizers differ" in n for n in same.notes)


def test_time_to_target_is_in_bits_per_byte_when_every_log_has_it():
    from buildllm.report.curves import BITS, NATS, loss_key, target_loss, time_to

    a = [
        {"step": 10, "validation_loss": 4.0, "validation_bits_per_byte": 1.70, "elapsed_seconds": 5.0},
        {"step": 20, "validation_loss": 3.6, "validation_bits_per_byte": 1.52, "elapsed_seconds": 10.0},
    ]
    b = [
        {"step": 10, "validation_loss": 4.4, "validation_bits_per_byte": 1.60, "elapsed_seconds": 4.0},
        {"step": 20, "validation_loss": 4.2, "validation_bits_per_byte": 1.49, "elapsed_seconds": 8.0},
    ]
    assert loss_key({"a": a, "b": b}) == BITS
    target = target_loss({"a": a, "b": b}, BITS)
    assert target == 1.52  # per token, b (a larger vocabulary) would look worse: 4.2 against 3.6
    assert time_to(a, target, BITS) == (10.0, 20) and time_to(b, target, BITS) == (8.0, 20)
    old = [{k: v for k, v in r.items() if k != BITS} for r in b]
    assert loss_key({"a": a, "b": old}) == NATS


def test_the_curves_chart_draws_the_logs_there_are_and_says_where_there_are_none(tmp_path, monkeypatch):
    from buildllm.report import curves

    drawn = {}

    def keep(fig, dpi=100):
        drawn["legends"] = [
            [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else [] for ax in fig.axes
        ]
        drawn["texts"] = [[t.get_text() for t in ax.texts] for ax in fig.axes]
        return b""

    monkeypatch.setattr(curves, "png", keep)
    logged = [{"step": 10, "train_loss": 4.1, "validation_loss": 4.0, "elapsed_seconds": 5.0, "tokens_per_second": 9.0}]
    curves.write_curves({"benchmark-only": [], "trained": logged}, None, tmp_path / "c.png")
    assert drawn["legends"][2] == ["trained"] and drawn["legends"][0] == ["trained: validation (line: train)"]
    curves.write_curves({"a": [], "b": []}, None, tmp_path / "c.png")
    assert drawn["legends"] == [[], [], []]
    assert drawn["texts"] == [["not recorded (no training log)"]] * 3
