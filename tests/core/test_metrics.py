"""Metrics files hold numbers and short labels; sentences and full outside text go to the notes file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import copy_project, run

from buildllm.metrics import (
    CUT_LABEL,
    MAX_LABEL,
    SUMMARY,
    MetricValueError,
    notes_path,
    read_metrics,
    short_label,
    summarize,
    summary_path,
    write_metrics,
)

ROOT = Path(__file__).resolve().parents[2]


def test_reasons_go_to_the_notes_file_and_numbers_stay(tmp_path):
    path = tmp_path / "metrics" / "train.json"
    reason = "auto: no CUDA (this PyTorch is a CPU-only build (torch.version.cuda is None)) and no Apple MPS"
    source = "measured: 2048^3 fp32 matmul on 2 threads, best seen 0.219 TFLOP/s (cached in /home/me/.cache)"
    write_metrics(path, {"device": "cpu", "device_reason": reason, "mfu": 0.5, "peak_flops_source": source})
    # The report reads the source's label from the metrics; its full account is in the notes.
    assert json.loads(path.read_text()) == {"device": "cpu", "mfu": 0.5, "peak_flops_source": short_label(source)}
    assert short_label(source).startswith("measured: 2048^3 fp32")
    notes = json.loads(notes_path(path).read_text())
    assert notes_path(path).name == "train_notes.json" and notes == {
        "device_reason": reason,
        "peak_flops_source": source,
    }
    assert read_metrics(path, with_notes=True)["device_reason"] == reason
    # A later run without notes leaves no stale notes behind.
    write_metrics(path, {"device": "cpu"})
    assert not notes_path(path).exists()


@pytest.mark.parametrize("value", ["x" * (MAX_LABEL + 1), "/home/me/run", "C:\\Users\\me\\run", "~/run"])
def test_a_long_label_or_absolute_path_of_our_own_fails_loudly(tmp_path, value):
    with pytest.raises(MetricValueError, match="not a short label"):
        write_metrics(tmp_path / "m.json", {"profile": value})
    assert not (tmp_path / "m.json").exists()


def test_outside_text_is_shortened_with_the_full_value_in_the_notes(tmp_path):
    processor = "Intel(R) Core(TM) i7-10750H CPU @ 2.60GHz with a long marketing name"
    path = write_metrics(tmp_path / "b.json", {"processor": processor, "checkpoint_directory": "/home/me/ck/run"})
    values = json.loads(path.read_text())
    assert values == {"processor": short_label(processor), "checkpoint_directory": "…/run"}
    assert len(values["processor"]) == CUT_LABEL < MAX_LABEL
    assert json.loads(notes_path(path).read_text()) == {
        "processor": processor,
        "checkpoint_directory": "/home/me/ck/run",
    }


# Records keyed by machine and profile, read by code, never shown by DVC as metrics.
NESTED = {"tune.json"}


def test_the_committed_metrics_fit_a_terminal():
    """The default pipeline's own metrics (committed from a real `dvc repro`): short values only, so a
    `dvc metrics diff` row (path, metric, old value, new value, change) fits in 160 columns."""
    # The plots' series (dvc.yaml `plots:`, e.g. metrics/train_log.json) are rows, not metrics.
    plotted = {
        f
        for plot in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
        if isinstance(plot, dict)
        for spec in plot.values()
        if isinstance(spec.get("y"), dict)
        for f in spec["y"]
    }
    metrics = [
        p
        for p in sorted((ROOT / "metrics").glob("*.json"))
        if not p.stem.endswith("_notes") and f"metrics/{p.name}" not in plotted and p.name not in NESTED
    ]
    metrics += sorted((ROOT / "metrics" / "summary").glob("*.json"))
    assert {p.stem for p in metrics} >= {"corpus", "tokens_4096", "dry_run", "benchmark", "estimate", "train"}
    for path in metrics:
        for key, value in json.loads(path.read_text()).items():
            shown = value if isinstance(value, str) else f"{value:.5f}" if isinstance(value, float) else str(value)
            assert len(shown) <= MAX_LABEL and not shown.startswith(("/", "~")), f"{path.name}: {key}={value!r}"
            # dvc metrics diff: 2 spaces between columns; a change is a number or "-".
            row = len(f"metrics/{path.name}") + len(key) + 2 * len(shown) + len(shown) + 4 * 2
            assert row <= 160, f"{path.name}: {key}={value!r} makes a {row}-column row"


def test_a_pipeline_stage_writes_its_summary_for_dvc(tmp_path):
    path = write_metrics(
        tmp_path / "benchmark.json",
        {"tokens_per_second": 12345.678, "peak_memory_bytes": 3 * 2**20, "mfu": 0.512345, "device": "cpu"},
    )
    assert summary_path(path) == tmp_path / "summary" / "benchmark.json"
    # Four significant digits under short names; the full record keeps every key as it was.
    assert json.loads(summary_path(path).read_text()) == {"tokens_per_s": 12350, "peak_mib": 3.0, "mfu": 0.5123}
    assert json.loads(path.read_text())["tokens_per_second"] == 12345.678
    # A benchmark that ran out of memory has no speed: its summary leaves the figure out, never invents it.
    write_metrics(path, {"oom": True, "peak_memory_bytes": 2**30})
    assert json.loads(summary_path(path).read_text()) == {"peak_mib": 1024.0}
    # A file that is no pipeline stage's (a sweep's, a batch search's) has no summary.
    assert not summary_path(write_metrics(tmp_path / "sweep.json", {"a": 1})).exists()


def test_dvc_metrics_show_of_the_default_pipeline_fits_160_columns(tmp_path):
    """Real `dvc metrics show` over the summaries the default pipeline committed (a real `dvc repro`):
    one row per stage, every line at most 160 characters."""
    project = copy_project(tmp_path / "project")
    shutil.copytree(ROOT / "metrics" / "summary", project / "metrics" / "summary")
    result = run(["dvc", "metrics", "show"], project)
    rows = result.stdout.splitlines()
    # One row per stage, the tokenize stage's one per vocabulary (tokens_4096, ...).
    vocabularies = yaml.safe_load((ROOT / "params.yaml").read_text())["tokenize"]["vocabularies"]
    files = {
        name: stage
        for stage in SUMMARY
        for name in ([f"tokens_{v}" for v in vocabularies] if stage == "tokens" else [stage])
    }
    assert rows[0].split()[0] == "Path" and len(rows) == 1 + len(files), result.stdout
    assert {row.split()[0] for row in rows[1:]} == {f"metrics/summary/{name}.json" for name in files}
    assert max(len(row) for row in rows) <= 160, result.stdout
    # Each summary holds its stage's figures from the full record beside it.
    for name, stage in files.items():
        full = json.loads((ROOT / "metrics" / f"{name}.json").read_text())
        assert json.loads((ROOT / "metrics" / "summary" / f"{name}.json").read_text()) == summarize(stage, full)
