"""The batch-size finder: the largest batch that trains within memory, found by trying (doubling,
then bisecting). A try is two real training steps; it fails on an out-of-memory error or when its
peak exceeds the budget less the safety margin (memory grows a little after the first steps:
fragmentation, a longer validation batch, a checkpoint save). On the CPU each try runs in a child
process, because running out of host memory ends a process instead of raising an error.
"""

from __future__ import annotations

import multiprocessing
import signal
from dataclasses import replace

from buildllm.config import Config, with_overrides
from buildllm.data.windows import load_windows
from buildllm.device.oom import out_of_memory
from buildllm.errors import UserError
from buildllm.metrics import json_line, write_metrics
from buildllm.paths import metrics_path
from buildllm.plan.run_plan import announce, apply_plan, make_plan
from buildllm.units import parse_size


def _measure_try(config: Config) -> dict:
    from buildllm.measure.benchmark import measure  # the benchmark imports the Trainer: only a try needs it

    plan = make_plan(config)
    apply_plan(plan)
    train, validation = load_windows(plan.config, plan.model)
    try:
        figures = measure(plan, train, validation, extras=False, load=False)
    except Exception as exc:  # only an out-of-memory error is an answer; anything else is a bug
        if not out_of_memory(exc):
            raise
        plan.device.release_cached_memory()
        return {"oom": True, "peak_memory_bytes": 0}
    # On CUDA the reserved peak rides along (the memory truth script reports it beside allocated).
    return {
        "oom": False,
        "peak_memory_bytes": figures.get("peak_memory_allocated_bytes", figures["peak_memory_bytes"]),
        **{key: figures[key] for key in ("peak_memory_reserved_bytes",) if key in figures},
    }


def _child(config: Config, queue) -> None:
    try:
        queue.put(_measure_try(config))
    except UserError as exc:  # bad input: the parent says it in one line
        queue.put({"error": str(exc)})


def try_in_child(config: Config) -> dict:
    """Two measured steps of `config` in a fresh process: {"oom": bool, "peak_memory_bytes": int}."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(config, queue))
    process.start()
    process.join()
    if process.exitcode == -signal.SIGKILL:
        # The kernel's OOM killer ends a process that runs the host out of memory: this batch does not fit.
        return {"oom": True, "peak_memory_bytes": 0}
    if process.exitcode != 0:
        raise RuntimeError(f"a batch-size try crashed with exit code {process.exitcode} (see its output above)")
    result = queue.get()
    if "error" in result:
        raise UserError(result["error"])
    return result


def find_batch_size(config: Config) -> dict:
    plan = make_plan(config)
    bench = config.benchmark
    # The config checked the size where it was given (buildllm/knob.py check_size).
    budget = parse_size(bench.memory_budget) if bench.memory_budget else plan.device.memory_capacity()
    limit = int(budget * (1 - bench.safety_margin))
    # Two measured steps are enough for the peak: memory is at its steady state after the first step.
    probe = replace(
        config,
        benchmark=replace(bench, warmup_steps=1, measured_steps=2, intervals=1),
        train=replace(config.train, training_examples=None),
    )
    load_windows(probe, plan.model)  # missing or bad token files: one line now, not in every try
    announce("find_batch_size", plan, memory_budget_bytes=budget, usable_bytes=limit, safety_margin=bench.safety_margin)
    tries: list[dict] = []

    def attempt(batch_size: int) -> bool:
        trial = with_overrides(probe, {"train.batch_size": batch_size})
        result = try_in_child(trial) if plan.device.host_memory else _measure_try(trial)
        peak = result["peak_memory_bytes"]
        fits = not result["oom"] and peak <= limit
        within = f"peak {peak / 2**20:.0f} MiB {'<=' if fits else '>'} {limit / 2**20:.0f} MiB usable"
        note = "out of memory" if result["oom"] else within
        tries.append({"batch_size": batch_size, "peak_bytes": peak, "fits": fits})
        json_line(try_batch_size=batch_size, fits=fits, note=note)
        return fits

    ceiling = bench.max_batch_size
    good, bad, size = 0, None, 1
    while attempt(size):
        good = size
        if size == ceiling:
            break
        size = min(2 * size, ceiling)  # the ceiling itself is tried, even when not a power of two
    else:
        bad = size
    if good and bad:
        # Above 8, bisect in multiples of 8: fewer tries, and shapes that suit vectorised kernels.
        quantum = 8 if good >= 8 else 1
        while bad - good > quantum:
            middle = (good + bad) // 2 // quantum * quantum
            if middle <= good:  # no multiple of the quantum left between them
                break
            good, bad = (middle, bad) if attempt(middle) else (good, middle)
    result = {
        "device": plan.device.device,
        "precision": plan.precision.precision,
        "profile": plan.profile.name,
        "sequence_length": plan.model.sequence_length,
        "memory_budget_bytes": budget,
        "usable_bytes": limit,
        "safety_margin": bench.safety_margin,
        "found_batch_size": good,
        "tries": len(tries),
        "largest_try_fits": good == ceiling,
        **{f"try_{i}_{key}": t[key] for key in ("batch_size", "peak_bytes", "fits") for i, t in enumerate(tries)},
    }
    write_metrics(metrics_path("batch_size"), result)
    if good:
        capped = f" (the ceiling benchmark.max_batch_size={ceiling})" if good == ceiling else ""
        print(
            f"largest batch size that fits: {good}{capped}, within {limit / 2**20:.0f} MiB "
            f"({bench.safety_margin:.0%} safety margin of {budget / 2**20:.0f} MiB); use --batch-size {good}"
        )
    else:  # the record above holds the try's figures; the command fails, as a plan that does not fit does
        raise UserError(
            f"even batch size 1 does not fit in {limit / 2**20:.0f} MiB ({bench.safety_margin:.0%} safety margin "
            f"of {budget / 2**20:.0f} MiB); use a smaller profile, --gradient-checkpointing, or a larger "
            "--memory-budget"
        )
    return result
