"""`buildllm tune` on preset tiny: paired turns, its record keyed by this machine, what it skipped to
stay within its budget, and the plan's decisions reading the record (and ignoring another machine's)."""

from __future__ import annotations

import json
import tempfile

import pytest
import yaml

from buildllm.cli import main
from buildllm.config import load_config
from buildllm.device import cpu_bf16
from buildllm.measure import tune as tune_module
from buildllm.measure.stats import compare, interleave
from buildllm.measure.tune import measure_precision
from buildllm.measure.tune_order import MIN_COMPILE_SECONDS, compile_window, shares, tune_order
from buildllm.plan import threads as threads_rule
from buildllm.plan import tuned
from buildllm.plan.attention import decide_attention
from buildllm.plan.run_plan import make_plan, this_machine


def turns(order: list, now: list, costs: dict):
    def turn(name):
        def run():
            order.append(name)
            now[0] += costs[name]

        return run

    return {name: turn(name) for name in costs}


def test_sides_take_turns_after_warming_up_and_no_round_starts_that_would_end_past_the_deadline():
    order, now = [], [0.0]
    seconds = interleave(
        turns(order, now, {"a": 1.0, "b": 2.0}),
        warmup=1,
        rounds=100,
        soft_deadline=20.0,
        hard_deadline=30.0,
        min_rounds=3,
        clock=lambda: now[0],
    )
    assert order[:2] == ["a", "b"] and order[2:] == ["a", "b"] * 5  # warm-up, then A B A B from t=3 s to t=18 s
    assert seconds == {"a": [1.0] * 5, "b": [2.0] * 5}
    figure = compare(seconds, "a")["b"]
    assert figure["ratio"] == 0.5 and figure["pairs"] == 5 and figure["low"] == figure["high"] == 0.5
    order, now = [], [0.0]
    seconds = interleave(
        turns(order, now, {"a": 1.0, "b": 2.0}),
        warmup=1,
        rounds=100,
        soft_deadline=20.0,
        hard_deadline=10.0,
        min_rounds=3,
        clock=lambda: now[0],
    )
    assert len(seconds["a"]) == 2  # the whole budget's end wins over the fewest rounds wanted


def tune_args(tokens, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--train-tokens",
        str(tokens["train"]),
        "--validation-tokens",
        str(tokens["validation"]),
        "--tokenizer",
        str(tokens["tokenizer"]),
        "--batch-size",
        "8",
        "--training-examples",
        "64",
        "--validation-examples",
        "16",
        *extra,
    ]


def own_temp_folder(workdir, monkeypatch):
    """A temporary-files folder of this test's own (tempfile's, and the compile child's TMPDIR);
    torch's own caches may stay there, buildllm's scratch folders (buildllm-*) may not."""
    folder = workdir / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def test_tune_records_pairs_losses_decisions_and_what_it_skipped_and_the_plan_reads_it(
    workdir, tokens, capsys, monkeypatch
):
    monkeypatch.delenv("BUILDLLM_MACHINE_OVERRIDE", raising=False)
    scratch = own_temp_folder(workdir, monkeypatch)
    (workdir / "params.yaml").write_text(yaml.safe_dump({"tune": {"loss_steps": 4}}))
    # The last tune's record, on disk, would have each precision run the other attention and a loss
    # chunk of half the rule's rows: tune plans from the record it writes, so none of it may reach a part.
    unseen = make_plan(load_config(None, {"device": "cpu", "preset": "tiny", "train.batch_size": 8}))
    rule_rows = unseen.loss.chunk_rows
    quicker = compare({"rule": [1.0] * 8, "other": [0.5] * 8}, "rule")["other"]
    stale = {"precision": "fp32", "default_rows": rule_rows, "candidates": {str(rule_rows // 2): quicker}}
    tuned.write_record(
        {
            "machine_id": this_machine(),
            "profile": "tiny",
            "device": "cpu",
            "batch_size": 8,
            "shape": tuned.shape_label(unseen.model),
            "loss_chunk": stale,
            "attention_by_precision": {p: {"precision": p, "explicit": quicker} for p in ("fp32", "bf16")},
        }
    )
    assert make_plan(unseen.config).loss.chunk_rows == rule_rows // 2  # the stale record is read elsewhere
    compared, rows = {}, {}  # the attention and loss chunk each precision's side ran in the precision part

    def seen(config, plans, *rest):
        compared.update({p: plan.attention.kernel for p, plan in plans.items()})
        rows.update({p: plan.loss.chunk_rows for p, plan in plans.items()})
        return measure_precision(config, plans, *rest)

    monkeypatch.setattr(tune_module, "measure_precision", seen)
    assert main(["tune", *tune_args(tokens, "--seconds", "29")]) == 0
    out = capsys.readouterr().out
    assert not list(scratch.glob("buildllm-*")), "tune left its scratch folders behind"
    record = tuned.read_all()[this_machine()]["tiny"]["cpu"]
    assert record["batch_size"] == 8 and record["tokens"] == "real" and record["budget_seconds"] == 29
    if cpu_bf16.native_bf16():
        bf16 = record["precision"]["bf16"]
        assert bf16["pairs"] == len(bf16["ratios"]) >= 1 and bf16["low"] <= bf16["ratio"] <= bf16["high"]
        assert bf16["median_seconds"] > 0 and bf16["reference_median_seconds"] > 0
        check = record["precision"]["loss_check"]
        assert check["tolerance"] == 0.05 and check["steps"] >= 2
        # Both losses measured, or (on a machine too busy to fit the validation passes in 29 s) the
        # check skipped with its reason, as the console says.
        measured = check.get("fp32", 0) > 0 and check.get("bf16", 0) > 0
        assert measured or ("for the validation passes" in check["skipped"] and "loss check: " in out)
    else:  # nothing to compare fp32 with: said, and auto's reason quotes it
        assert "bf16" not in record["precision"] and "no bf16 matmul path" in record["precision"]["skipped"]
        assert record["precision"]["loss_check"]["tokens"] == "real"
        assert "bf16 not measured (no precision but fp32 trains" in record["decisions"]["precision"]
    assert set(record["decisions"]) >= {"precision", "threads", "compile", "loss_chunk"}
    # The CPU's order, each later part in the precision the run will use, as auto chose it here.
    run_precision = record["measured_in"]["precision"]
    assert record["decisions"]["precision"].startswith(run_precision + ":")
    parts = {p["part"]: p for p in record["parts"]}
    assert list(parts) == ["attention", "precision", "threads", "loss_chunk", "compile"]
    assert {parts[n]["precision"] for n in ("threads", "loss_chunk", "compile")} == {run_precision}
    assert not parts["compile"]["measured"] and "under the 30 s a compile needs" in parts["compile"]["skipped"]
    # Attention first, in every precision compared; each side of the precision part ran the form
    # measured faster in its own precision, and the run's precision's figures are the record's.
    by_precision = record["attention_by_precision"]
    assert set(by_precision) == set(compared) == ({"fp32", "bf16"} if cpu_bf16.native_bf16() else {"fp32"})
    assert set(parts["attention"]["precision"].split(", ")) == set(by_precision)
    for precision, attention in by_precision.items():
        assert attention["precision"] == precision
        assert compared[precision] == decide_attention(record, "", precision).kernel
        # The CPU offers no cuDNN or memory-efficient kernel: said, not timed; what it offers is timed.
        assert set(attention["not_offered"]) == {"cudnn", "efficient"}
        assert "skipped" in attention or {"flash", "math", "explicit"} <= set(attention)
        assert "skipped" in attention or f"attention in {precision}: explicit matmul-softmax x" in out
    assert set(rows.values()) == {rule_rows}  # the stale record's chunk reached no side
    start = next(json.loads(line) for line in out.splitlines() if line.startswith('{"action": "tune"'))
    assert start["loss_chunk_rows"] == rule_rows and start["attention"] == "sdpa"  # nor the start line
    assert "attention" not in record  # stored once, by precision
    assert f"part attention in {parts['attention']['precision']}: " in out
    # Under the 30 s a compilation needs: skipped, and said on the console and in the record.
    assert "speedup" not in record["compile"] and any(s.startswith("torch.compile") for s in record["skipped"])
    assert "skipped to stay within tune.seconds: torch.compile" in out
    assert record["processor"] and record["other_load_window"] >= 0 and isinstance(record["busy_machine"], bool)
    assert ("busy machine: other processes used" if record["busy_machine"] else "machine not busy") in out

    # The dry run's plan reads this machine's record: its reasons say "measured here".
    assert main(["dry-run", *tune_args(tokens)]) == 0
    notes = json.loads((workdir / "metrics" / "dry_run_notes.json").read_text())
    assert "measured here" in notes["precision_reason"] and "measured here" in notes["compile_reason"]
    assert "measured here" in notes["threads_reason"]
    assert json.loads((workdir / "metrics" / "dry_run.json").read_text())["tuned_here"] is True

    # The same record written under another machine's id (the real writer) applies to nothing here.
    other = {**record, "machine_id": "another-cpu-0123abcd"}
    (workdir / "metrics" / "tune.json").unlink()
    tuned.write_record(other)
    assert main(["dry-run", *tune_args(tokens)]) == 0
    notes = json.loads((workdir / "metrics" / "dry_run_notes.json").read_text())
    assert "not measured on this machine: run `buildllm tune`" in notes["precision_reason"]
    assert "not measured on this machine: run `buildllm tune`" in notes["compile_reason"]
    assert json.loads((workdir / "metrics" / "dry_run.json").read_text())["tuned_here"] is False


@pytest.mark.slow
def test_tune_measures_compile_when_the_budget_allows_it(workdir, tokens, capsys, monkeypatch):
    monkeypatch.delenv("BUILDLLM_MACHINE_OVERRIDE", raising=False)
    scratch = own_temp_folder(workdir, monkeypatch)
    # The thread counts are compared in the test above; set here (to the default that tune would
    # compile with), their turns (a tenth of the budget) are not taken, and 90 s leave compile about
    # the window that 100 s with thread turns left it.
    params = {"tune": {"loss_steps": 4}, "train": {"threads": threads_rule.DEFAULT_THREADS}}
    (workdir / "params.yaml").write_text(yaml.safe_dump(params))
    assert main(["tune", *tune_args(tokens, "--seconds", "90")]) == 0
    assert not list(scratch.glob("buildllm-*")), "tune or its compile child left scratch folders behind"
    record = tuned.read_all()[this_machine()]["tiny"]["cpu"]
    compiled = record["compile"]
    # Measured (with its figures and pairs), or, on a machine too slow or busy to compile within
    # what was left, skipped with the reason.
    assert (
        "speedup" in compiled
        and compiled["pairs"] >= 1
        and compiled["compile_seconds"] > 0
        # in the precision `auto` chose from the same record
        and record["decisions"]["precision"].startswith(compiled["precision"] + ":")
    ) or "tune.seconds" in compiled["skipped"]
    assert "threads" in record and record["loss_chunk"].get("candidates")


def test_on_a_gpu_compile_comes_right_after_precision_and_keeps_the_small_parts_their_shares():
    """The order is a pure function of the device kind: what a GPU gets is checked without one."""
    assert [p.name for p in tune_order(True)] == ["attention", "precision", "compile", "loss_chunk"]
    assert [p.name for p in tune_order(False)] == ["attention", "precision", "threads", "loss_chunk", "compile"]
    # The H200's iteration 3: 36 s of 40 went to precision; compile, after it, found 4 s.
    window, why = compile_window(True, 40.0, left=4.0)
    assert window < MIN_COMPILE_SECONDS and "2 s of tune.seconds left for it (2 s kept for the loss chunk)" in why
    # With 120 s, attention's and precision's shares leave compile the rest less the loss chunk's.
    kept = shares(True)["loss_chunk"] * 120
    window, why = compile_window(True, 120.0, left=120.0 - (0.05 + 0.40) * 120)
    assert why == "" and window == pytest.approx(66.0 - kept) and window >= MIN_COMPILE_SECONDS
    # On the CPU compile is last: it may take all that is left.
    assert compile_window(False, 120.0, left=35.0) == (35.0, "")
    assert "raise tune.seconds" in compile_window(False, 120.0, left=29.0)[1]
    # Every part with a share fits the budget beside compile's minimum on a GPU at 120 s.
    assert sum(shares(True).values()) * 120 + MIN_COMPILE_SECONDS <= 120
