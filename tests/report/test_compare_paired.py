"""`buildllm compare --paired` for real: the tiny preset's benchmark rerun interleaved in fresh processes.

The experiments are `dvc exp show` rows (as in test_compare.py) whose params bound the benchmark to
a few steps on the session's tiny token files; the re-measurements are real `python -m buildllm
benchmark` processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compare import benchmark, experiment, rows

from buildllm.report.chart import panels
from buildllm.report.compare import compare
from buildllm.report.render import write_report

pytestmark = pytest.mark.slow


def bounded(tokens, **more) -> dict:
    return {
        "device": "cpu",
        "precision": "fp32",
        "train.threads": 1,
        "train.batch_size": 8,
        "train.training_examples": 64,
        "train.validation_examples": 16,
        "benchmark.warmup_steps": 1,
        "benchmark.measured_steps": 4,
        "benchmark.intervals": 2,
        "train.train_tokens": str(tokens["train"]),
        "train.validation_tokens": str(tokens["validation"]),
        **more,
    }


def test_paired_reruns_interleave_fresh_processes_and_report_the_interval(tokens, workdir, tmp_path):
    recorded = {"benchmark": benchmark(batch_size=8, threads=1, measured_steps=4)}
    a = experiment("tiny-a", "1" * 40, bounded(tokens), recorded, 1)
    b = experiment("tiny-b", "2" * 40, bounded(tokens), recorded, 2)  # the same experiment, run twice
    (workdir / "metrics").mkdir()
    (workdir / "metrics" / "benchmark.json").write_text("{}")  # the workspace's own: must stay untouched
    c = compare(["tiny-a", "tiny-b"], rows=rows(a, b), rounds=2)
    assert c.paired.orders == [["tiny-a", "tiny-b"], ["tiny-b", "tiny-a"]]
    for measured in c.paired.rounds:
        for m in measured.values():
            assert (m["profile"], m["batch_size"], m["measured_steps"], m["intervals"]) == ("tiny", 8, 4, 2)
            assert m["interval_1_steps_per_second"] > 0 and m["interval_2_steps_per_second"] > 0
    ratios = c.paired.ratios("tiny-b")
    s = c.speedups["tiny-b"]
    assert s.pairs == 2 and s.low == min(ratios) and s.high == max(ratios) and s.coverage == pytest.approx(0.5)
    assert "inconclusive" in c.verdict and "2 rounds give only a 50% interval" in c.verdict and c.tone == "caution"
    assert (workdir / "metrics" / "benchmark.json").read_text() == "{}"
    md = Path(write_report(c, tmp_path / "r")[0]).read_text()
    assert "## Paired re-measurements" in md and "| 2 | tiny-b → tiny-a |" in md
    assert "speed-up vs tiny-a (paired)" in md and "--paired --rounds 2" in md
    title, values, _, (low, high) = panels(c.frame)[0]
    assert title.startswith("Tokens/s, paired re-runs") and list(low) == [
        min(c.paired.tokens_per_second(n)) for n in ("tiny-a", "tiny-b")
    ]
