"""`buildllm tune`: the auto decisions measured on this machine, within a stated time budget (what
each part compares, what it decides and what tune skips: docs/pipeline.md, "Auto decisions"). The
record goes to metrics/tune.json under this machine's id (buildllm/plan/tuned.py), where the plan reads it.

Each part runs the planned profile, shape and batch on the device the run would use, its sides in
turns within its share of `tune.seconds` (measure/tune_budget.py). Each part plans from the record
being written (run_plan.make_plan's tune_record), never from the last tune's, so it runs what the
parts before it measured. Attention runs first, in every precision compared, and each precision's
side of the next part runs the attention measured faster in it. The precision part trains the
Trainer's own step from the same seed on the same tokens, so its validation losses can be compared;
every later part runs in the precision the run will use. The order and the shares depend on the
device (measure/tune_order.py: torch.compile right after precision on a GPU, last on the CPU); the
record's `parts` says which parts ran, in which precision, and why any did not.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import tempfile
from functools import partial

import torch
from tqdm import tqdm

from buildllm.config import Config, with_overrides
from buildllm.data.windows import Windows, windows_or_random
from buildllm.device.device import processor_name
from buildllm.device.load import LoadWatch
from buildllm.device.precision import fp32_only_reason, tunable_precisions
from buildllm.measure.stats import compare
from buildllm.measure.tune_budget import MIN_ROUNDS, NO_TIME, Budget, steps_per_turn
from buildllm.measure.tune_compile import measure_compile
from buildllm.measure.tune_kernels import measure_attention, measure_chunks
from buildllm.measure.tune_order import compile_window, shares, tune_order
from buildllm.measure.tune_summary import summary
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
        return not_compared(why, tokens=tokens), trainers
    k = steps_per_turn(trainers["fp32"].step, device.timed)
    for name, trainer in trainers.items():
        if name != "fp32":
            trainer.step()  # every side has taken the same steps before the timed turns
    wanted = config.tune.loss_steps
    rounds = max(MIN_ROUNDS, math.ceil((wanted - 2) / k))
    turns = {name: (lambda t=t: [t.step() for _ in range(k)]) for name, t in trainers.items()}
    seconds = budget.take_turns("precision", turns, skipped, warmup=0, rounds=rounds)
    if seconds is None:
        return not_compared(f"{NO_TIME} after building the trainers", tokens=tokens), trainers
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
    said = {"default": default, "precision": trainer.plan.precision.precision}
    if requested is not None:
        return {**said, "skipped": f"train.threads is set ({requested}): not compared"}
    counts = sorted({n for n in (1, default // 2, os.cpu_count() or default) if 1 <= n and n != default})
    if not counts:
        return {**said, "skipped": "no other thread count on this machine"}
    if budget.left() <= 0:
        skipped.append(f"threads: {NO_TIME}")
        return {**said, "skipped": NO_TIME}
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
        return {**said, "skipped": NO_TIME}
    return {**said, "steps_per_turn": k, "candidates": compare(seconds, str(default))}


def run_precision(config: Config, record: dict, reference: RunPlan) -> tuple[str, str]:
    """(precision, why) the run will compute in: the one asked for, or what `auto` makes of the figures."""
    if config.precision != "auto":
        return config.precision, f"precision {config.precision} is set"
    chosen, why = measured_precision(record, reference)
    return chosen, f"auto: {why}"


def tune(config: Config) -> dict:
    fixed = {"train.compile": "false", "train.threads": config.train.threads or threads_rule.DEFAULT_THREADS}
    # The rules' own defaults, read from no record (an empty one): the start line says what this tune
    # starts from, not the attention and loss chunk of the last tune on disk.
    reference = make_plan(with_overrides(config, {**fixed, "precision": "fp32"}), tune_record={})
    apply_plan(reference)
    device = reference.device
    order = tune_order(device.compile_pays_first)
    budget = Budget(config.tune.seconds, device.timed, shares(device.compile_pays_first))
    # Others' load, not the load average: that counts tune's own threads and lags by a minute.
    watch = LoadWatch(used=reference.cores)
    watch.mark()
    names = [part.name for part in order if part.name != "threads" or device.threads_apply]
    announce("tune", reference, budget_seconds=config.tune.seconds, measures=", ".join(names))
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

    def plan_in(precision: str) -> RunPlan:
        # Planned from this tune's own record as it grows, never from the last tune's: each part runs
        # what the parts before it measured (the attention, the loss chunk), and a stale figure of
        # another day cannot tilt a comparison.
        return make_plan(with_overrides(config, {**fixed, "precision": precision}), tune_record=record)

    plans = {p: plan_in(p) for p in tunable_precisions(reference.device)}
    skipped: list[str] = []
    # The trainers' scratch folder (nothing is saved there) goes when tune ends, even on an error.
    scratch = tempfile.TemporaryDirectory(prefix="buildllm-tune-")
    with scratch, tqdm(total=len(names), desc="tune", unit="part") as bar:
        # Attention in each precision first, so that each precision's side runs its own fastest form.
        by_precision = {p: measure_attention(plan, budget, skipped, part=1 / len(plans)) for p, plan in plans.items()}
        record["attention_by_precision"] = by_precision
        plans = {p: plan_in(p) for p in plans}
        bar.update()
        record["precision"], trainers = measure_precision(
            config, plans, train, validation, tokens, budget, skipped, scratch.name
        )
        bar.update()
        # Every later part in the precision the run will use (measure/tune_order.py).
        precision, why = run_precision(config, record, reference)
        record["measured_in"] = {"precision": precision, "reason": why}
        plan = plans.get(precision) or plan_in(precision)
        parts = {
            # Its trainer in the run's precision where tune built one, else fp32's.
            "threads": lambda: measure_threads(
                trainers.get(precision, trainers["fp32"]), config.train.threads, budget, skipped
            ),
            "loss_chunk": lambda: measure_chunks(plan, budget, skipped),
            "compile": lambda: compile_part(
                config, {**fixed, "precision": precision}, record, budget, device.compile_pays_first
            ),
        }
        for name in names[2:]:
            if name == "compile":  # the trainers' memory goes before a child process builds its own
                trainers.clear()
                gc.collect()
                device.release_cached_memory()
            record[name] = parts[name]()
            record[name].setdefault("precision", precision)
            bar.update()
    if "skipped" in record["compile"]:
        skipped.append(f"torch.compile: {record['compile']['skipped']}")
    record["parts"] = parts_record(record, names, list(plans))
    record.update(seconds_taken=round(budget.clock() - budget.start, 1), **watch.end(), skipped=skipped)
    record["decisions"] = measured_decisions(record, reference)
    tuned.write_record(record)
    print(summary(record))
    return record


def compile_part(config: Config, settings: dict, record: dict, budget: Budget, compile_first: bool) -> dict:
    window, why_not = compile_window(compile_first, budget.seconds, budget.left())
    if why_not:
        return {"skipped": why_not}
    return measure_compile(config, settings, record, window)


def parts_record(record: dict, names: list[str], precisions: list[str]) -> list[dict]:
    """Each part in the order it ran: its precision, and whether it measured or why it did not."""
    out = []
    for name in names:
        figures = record.get(name, {})
        if name == "attention":  # measured where any precision's figures are
            by_precision = record["attention_by_precision"].values()
            figures = {} if any("skipped" not in f for f in by_precision) else next(iter(by_precision))
        why = figures.get("skipped")
        out.append(
            {
                "part": name,
                "precision": ", ".join(precisions) if name in ("precision", "attention") else figures["precision"],
                "measured": not why,
                **({"skipped": why} if why else {}),
            }
        )
    return out
