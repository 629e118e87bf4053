"""`buildllm tune`: the auto decisions measured on this machine, within a stated time budget (what
each part compares, what it decides and what tune skips: docs/pipeline.md, "Auto decisions"). The
record goes to metrics/tune.json under this machine's id (buildllm/plan/tuned.py), where the plan reads it.

Each part runs the planned profile, shape and batch on the device the run would use, its sides in
turns within its share of `tune.seconds` (measure/tune_budget.py). The precision part trains the
Trainer's own step from the same seed on the same tokens, so its validation losses can be compared;
torch.compile runs last, with what is left of the budget.
"""

from __future__ import annotations

import datetime
import math
import os
import tempfile
from functools import partial

import torch
from tqdm import tqdm

from buildllm.config import Config, with_overrides
from buildllm.data.windows import Windows, windows_or_random
from buildllm.device.device import processor_name
from buildllm.device.load import LoadWatch, load_line
from buildllm.device.precision import fp32_only_reason, tunable_precisions
from buildllm.measure.stats import compare
from buildllm.measure.tune_budget import MIN_ROUNDS, NO_TIME, Budget, steps_per_turn
from buildllm.measure.tune_compile import measure_compile
from buildllm.measure.tune_kernels import measure_attention, measure_chunks
from buildllm.plan import threads as threads_rule
from buildllm.plan import tuned
from buildllm.plan.run_plan import (
    RunPlan,
    announce,
    apply_plan,
    make_plan,
    measured_decisions,
    measured_precision,
    this_machine,
)
from buildllm.train.trainer import Trainer

MIN_COMPILE_SECONDS = 30.0  # a cold compile at iteration 1 took about 40 s on 2 cores: less cannot finish
LOSS_CHECK_BATCHES = 4  # validation batches each side's loss is measured on


def not_compared(why: str, **check) -> dict:
    return {"reference": "fp32", "skipped": why, "loss_check": {"done": False, "skipped": why, **check}}


def measure_precision(
    config: Config, plans: dict[str, RunPlan], train, validation, tokens: str, budget: Budget, skipped: list, scratch
) -> tuple[dict, dict]:
    """(figures, trainers): each low precision against fp32, and the short run's validation losses
    (on the first LOSS_CHECK_BATCHES batches of validation windows, the same for every side)."""
    device, batch = plans["fp32"].device, plans["fp32"].batch_size
    validation = Windows(
        validation.tokens, validation.sequence_length, min(len(validation), LOSS_CHECK_BATCHES * batch)
    )
    trainers: dict[str, Trainer] = {}
    for name, plan in plans.items():
        if trainers and budget.left() <= 0:  # a large model's build and first step can take the budget
            break
        trainers[name] = Trainer(plan, train, validation, directory=scratch)
        trainers[name].step()  # the first step allocates; untimed
    if len(plans) == 1:  # nothing to compare: the fp32 trainer is still built, for the threads part
        return not_compared(f"no precision but fp32 trains here: {fp32_only_reason(device)}", tokens=tokens), trainers
    if len(trainers) < len(plans) or budget.left() <= 0:
        why = f"{NO_TIME} after building and warming up the trainers"
        skipped.append(f"precision: {why}")
        return not_compared(why), trainers
    k = steps_per_turn(trainers["fp32"].step, device.timed)
    for name, trainer in trainers.items():
        if name != "fp32":
            trainer.step()  # every side has taken the same steps before the timed turns
    wanted = config.tune.loss_steps
    rounds = max(MIN_ROUNDS, math.ceil((wanted - 2) / k))
    turns = {name: (lambda t=t: [t.step() for _ in range(k)]) for name, t in trainers.items()}
    seconds = budget.take_turns("precision", turns, skipped, warmup=0, rounds=rounds)
    if seconds is None:
        return not_compared(f"{NO_TIME} after building the trainers"), trainers
    figures: dict = {"reference": "fp32", "steps_per_turn": k, **compare(seconds, "fp32")}
    if len(seconds["fp32"]) < rounds:
        skipped.append(f"precision: {len(seconds['fp32'])} of {rounds} rounds, to stay within tune.seconds")
    steps = trainers["fp32"].step_count
    check: dict = {
        "steps": steps,
        "tolerance": config.tune.loss_tolerance,
        "tokens": tokens,
        "done": False,
        "validation_examples": len(validation),
    }
    # A validation batch's forward pass costs about a third of a training step's forward + backward.
    step_seconds = max(seconds["fp32"]) / k
    passes = len(trainers) * math.ceil(len(validation) / batch) * step_seconds / 3
    if budget.left() > passes:
        check.update({name: trainer.evaluate() for name, trainer in trainers.items()})
        if tokens != "real":
            check["skipped"] = "random tokens (no token files: run `dvc repro tokenize`); their loss says nothing"
        elif steps < wanted:
            check["skipped"] = f"cut short at {steps} of tune.loss_steps {wanted} steps to stay within tune.seconds"
        else:
            check["done"] = True
    else:
        check["skipped"] = f"{NO_TIME} for the validation passes"
    if "skipped" in check:
        skipped.append(f"loss check: {check['skipped']}")
    figures["loss_check"] = check
    return figures, trainers


def measure_threads(trainer: Trainer, requested: int | None, budget: Budget, skipped: list) -> dict:
    default = threads_rule.DEFAULT_THREADS
    if requested is not None:
        return {"default": default, "skipped": f"train.threads is set ({requested}): not compared"}
    counts = sorted({n for n in (1, default // 2, os.cpu_count() or default) if 1 <= n and n != default})
    if not counts:
        return {"default": default, "skipped": "no other thread count on this machine"}
    if budget.left() <= 0:
        skipped.append(f"threads: {NO_TIME}")
        return {"default": default, "skipped": NO_TIME}
    k = steps_per_turn(trainer.step, trainer.device.timed)

    def run(n: int) -> None:
        torch.set_num_threads(n)
        for _ in range(k):
            trainer.step()

    try:
        seconds = budget.take_turns("threads", {str(n): partial(run, n) for n in [default, *counts]}, skipped)
    finally:
        torch.set_num_threads(trainer.plan.threads)
    if seconds is None:
        return {"default": default, "skipped": NO_TIME}
    return {"default": default, "steps_per_turn": k, "candidates": compare(seconds, str(default))}


def tune(config: Config) -> dict:
    fixed = {"train.compile": "false", "train.threads": config.train.threads or threads_rule.DEFAULT_THREADS}
    reference = make_plan(with_overrides(config, {**fixed, "precision": "fp32"}))
    apply_plan(reference)
    device = reference.device
    budget = Budget(config.tune.seconds, device.timed)
    # Others' load, not the load average: that counts tune's own threads and lags by a minute.
    watch = LoadWatch(used=reference.cores)
    watch.mark()
    announce(
        "tune",
        reference,
        budget_seconds=config.tune.seconds,
        measures="precision, threads, loss chunk, attention, torch.compile",
    )
    plans = {
        p: (reference if p == "fp32" else make_plan(with_overrides(config, {**fixed, "precision": p})))
        for p in tunable_precisions(reference.device)
    }
    train, validation, tokens = windows_or_random(config, reference.model, reference.batch_size)
    record: dict = {
        "machine_id": this_machine(),
        "profile": reference.profile.name,
        "device": device.device,
        "device_kind": device.kind,
        "processor": processor_name(),
        "torch_version": torch.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "batch_size": reference.batch_size,
        "shape": tuned.shape_label(reference.model, config.train.gradient_checkpointing),
        "tokens": tokens,
        "budget_seconds": config.tune.seconds,
    }
    skipped: list[str] = []
    # The trainers' scratch folder (nothing is saved there) goes when tune ends, even on an error.
    scratch = tempfile.TemporaryDirectory(prefix="buildllm-tune-")
    with scratch, tqdm(total=5, desc="tune", unit="part") as bar:
        record["precision"], trainers = measure_precision(
            config, plans, train, validation, tokens, budget, skipped, scratch.name
        )
        bar.update()
        if device.threads_apply:
            record["threads"] = measure_threads(trainers["fp32"], config.train.threads, budget, skipped)
        del trainers
        bar.update()
        record["loss_chunk"] = measure_chunks(reference, budget, skipped)
        bar.update()
        record["attention"] = measure_attention(reference, budget, skipped)
        bar.update()
        left = budget.left()
        if left >= MIN_COMPILE_SECONDS:
            # In the precision `auto` will run in, so the figures apply to the runs that read them.
            precision = measured_precision(record, reference)[0]
            record["compile"] = measure_compile(config, {**fixed, "precision": precision}, left)
        else:
            record["compile"] = {
                "skipped": f"skipped: {max(left, 0):.0f} s of tune.seconds left, under the "
                f"{MIN_COMPILE_SECONDS:.0f} s a compile needs (raise tune.seconds)"
            }
        if "skipped" in record["compile"]:
            skipped.append(f"torch.compile: {record['compile']['skipped']}")
        bar.update()
    record.update(seconds_taken=round(budget.clock() - budget.start, 1), **watch.end(), skipped=skipped)
    record["decisions"] = measured_decisions(record, reference)
    tuned.write_record(record)
    print(summary(record))
    return record


def summary(record: dict) -> str:
    lines = [
        f"tune {record['profile']} on {record['device']} ({record['processor']}, machine {record['machine_id']}): "
        f"{record['seconds_taken']:.0f} s of {record['budget_seconds']:.0f} s, {load_line(record)}"
    ]
    for name, figure in record["precision"].items():
        if isinstance(figure, dict) and "ratio" in figure:
            lines.append(f"  precision: {name} {tuned.ratio_text(figure)} fp32's speed")
    check = record["precision"]["loss_check"]
    if "fp32" in check:
        losses = ", ".join(f"{p} {check[p]:.3f}" for p in record["precision"] if p in check and p != "loss_check")
        lines.append(
            f"  validation loss after {check['steps']} steps: fp32 {check['fp32']:.3f}, {losses} "
            f"(tolerance {check['tolerance']}, {check['tokens']} tokens)"
        )
    for n, figure in record.get("threads", {}).get("candidates", {}).items():
        lines.append(f"  threads: {n} {tuned.ratio_text(figure)} the speed of {record['threads']['default']}")
    chunk = record["loss_chunk"]
    for rows, figure in chunk.get("candidates", {}).items():
        lines.append(f"  loss chunk: {rows} rows {tuned.ratio_text(figure)} the speed of {chunk['default_rows']}")
    if chunk.get("plain"):
        lines.append(f"  loss chunk: plain unfused loss {tuned.ratio_text(chunk['plain'])} the speed of the default")
    for kernel, said in (("math", "math kernel"), ("explicit", "explicit matmul-softmax")):
        if kernel in record["attention"]:
            lines.append(f"  attention: {said} {tuned.ratio_text(record['attention'][kernel])} the dispatch's speed")
    if "speedup" in record["compile"]:
        c = record["compile"]
        lines.append(f"  torch.compile: x{c['speedup']:.2f} ({c['pairs']} pairs) after {c['compile_seconds']:.0f} s")
    lines += [f"  decision {name}: {reason}" for name, reason in record["decisions"].items()]
    lines += [f"  skipped to stay within tune.seconds: {what}" for what in record["skipped"]]
    return "\n".join(lines)
