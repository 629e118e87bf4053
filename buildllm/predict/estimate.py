"""The estimate stage: project a full training run from a bounded benchmark (the course's formulas
and its range: docs/measuring.md, "The estimate of a run's time").

The range is widened by RUN_TO_RUN because a whole run can go slower or faster than one benchmark's
intervals, as a fresh process lands on other cores, memory and neighbours. An estimate is only as
good as the match between benchmark and plan, so a benchmark with other controls is refused.
"""

from __future__ import annotations

from buildllm.config import Config
from buildllm.data.windows import optimizer_steps, split_windows
from buildllm.device.hardware import machine_name
from buildllm.errors import UserError
from buildllm.metrics import read_metrics, write_metrics
from buildllm.paths import metrics_path, token_paths
from buildllm.plan.run_plan import RunPlan, facts, make_plan
from buildllm.units import duration

# How far a whole run's speed lies outside one benchmark's interval range, same plan, same machine:
# the range is widened by this much on each side (step time x (1 + RUN_TO_RUN) over the slowest
# interval, ÷ (1 + RUN_TO_RUN) under the fastest). Measured on the project's 12 committed baselines
# (git history of metrics/benchmark.json and metrics/train.json: each a `dvc repro` running the
# benchmark, then the training run, in fresh processes, iteration 1 at 2 threads; 6 on a 2-core
# Intel Xeon (AMX), 6 on a 2-core AMD EPYC, lscpu model names as recorded in the files): the run's
# steps/s was 0.922-0.996 x the slowest interval's in the 5 that ran slower than it, and 1.051 and
# 1.079 x the fastest's in the 2 that ran faster; 10% covers 11 of the 12. The twelfth (deda8a2,
# EPYC, 0.385 x) ran on a machine that other jobs slowed by half: no range covers that, and the
# train metrics say so (estimate_position). Fresh benchmarks taken for this figure on a 2-core AMD
# EPYC shared with five other jobs (load average 2-10) ran 0.95 and 0.18 steps/s: unusable, not used.
RUN_TO_RUN = 0.10

# The controls a benchmark must share with the planned run for its speed to apply.
CONTROLS = (
    "profile",
    "architecture",
    "parameters",
    "batch_size",
    "grad_accum",
    "sequence_length",
    "precision",
    "device",
    "gradient_checkpointing",
    "compile",
    "workers",
)


def planned_examples(plan: RunPlan, split: str = "train") -> int:
    """Windows the run will read from `split`: the configured limit, or fewer if the tokens hold fewer."""
    limit = plan.config.train.training_examples if split == "train" else plan.config.train.validation_examples
    path = token_paths(plan.config, plan.model.vocab_size)[split != "train"]
    if limit is not None and not path.exists():
        return limit
    return len(split_windows(plan.config, plan.model, split))


def benchmark_controls(plan: RunPlan) -> dict:
    """The CONTROLS as the plan sets them; on the CPU the thread count too, which sets the speed
    as much as the batch size does."""
    resolved = facts(plan)
    return {key: resolved[key] for key in CONTROLS + (("threads",) if plan.device.threads_apply else ())}


def projected_run(plan: RunPlan) -> dict:
    """What an estimate records of the run it projects: preflight calls an estimate stale when any differs."""
    resolved = {**facts(plan), "epochs": plan.config.train.epochs}
    return {key: resolved[key] for key in ("profile", "device", "precision", "batch_size", "grad_accum", "epochs")}


def estimate(config: Config, benchmark: dict | None = None) -> dict:
    benchmark = benchmark if benchmark is not None else read_metrics(metrics_path("benchmark"))
    if benchmark.get("oom"):
        raise UserError(
            "the benchmark ran out of memory, so there is no speed to project; "
            "rerun the benchmark with a smaller --batch-size"
        )
    plan = make_plan(config)
    plan_controls = {
        **benchmark_controls(plan),
        "validation_examples": planned_examples(plan, "validation"),
        "machine": machine_name(plan.device),
    }
    differences = [
        f"{key} {benchmark.get(key)!r} (benchmark) vs {value!r} (plan)"
        for key, value in plan_controls.items()
        if benchmark.get(key) != value
    ]
    if differences:
        raise UserError(
            f"the benchmark's controls differ from the planned run ({'; '.join(differences)}); "
            "rerun the benchmark with the planned settings (`dvc repro benchmark`)"
        )
    t = config.train
    examples = planned_examples(plan)
    steps = optimizer_steps(examples, plan.batch_size, t.grad_accum, t.epochs)
    tokens = steps * plan.tokens_per_step
    by_steps = steps / benchmark["steps_per_second"]
    by_tokens = tokens / benchmark["tokens_per_second"]
    # As the train loop does: validate before the first step, every eval_interval steps and after
    # the last; save every checkpoint_interval steps before the last, and once at the end.
    evaluations = 2 + (steps // t.eval_interval - (steps % t.eval_interval == 0) if t.eval_interval else 0)
    validation = evaluations * benchmark["validation_seconds"]
    saves = 1 + ((steps - 1) // t.checkpoint_interval if t.checkpoint_interval else 0)
    checkpoints = saves * benchmark["checkpoint_save_seconds"]
    # Start-up: the process (imports, device, tokens) up to the first step, and the closing plot
    # (a benchmark record from before these two were measured counts them as 0).
    startup = config.estimate.startup_seconds
    if startup is None:
        startup = benchmark.get("process_startup_seconds", 0.0) + benchmark["time_to_first_step_seconds"]
        startup += benchmark.get("plot_seconds", 0.0)
    overhead = validation + checkpoints + startup
    slow, fast = benchmark["interval_steps_per_second_min"], benchmark["interval_steps_per_second_max"]
    result = {
        **projected_run(plan),
        "planned_examples": examples,
        "planned_optimizer_steps": steps,
        "planned_tokens": tokens,
        "measured_steps_per_second": benchmark["steps_per_second"],
        "measured_tokens_per_second": benchmark["tokens_per_second"],
        "estimated_seconds_by_steps": by_steps,
        "estimated_seconds_by_tokens": by_tokens,
        "validation_passes": evaluations,
        "validation_overhead_seconds": validation,
        "checkpoint_saves": saves,
        "checkpoint_overhead_seconds": checkpoints,
        "startup_seconds": startup,
        "estimated_seconds": by_steps + overhead,
        # Start-up, validation and saves enter the range as the steps do: one benchmark measured them
        # once each, and a fresh process's imports and first allocations vary from run to run too (a
        # tiny run is mostly start-up: a range around its steps alone is missed by start-up alone).
        "estimated_seconds_low": ((steps / fast if fast > 0 else by_steps) + overhead) / (1 + RUN_TO_RUN),
        "estimated_seconds_high": ((steps / slow if slow > 0 else by_steps) + overhead) * (1 + RUN_TO_RUN),
        "run_to_run_spread": RUN_TO_RUN,
        "checkpoint_bytes": benchmark["checkpoint_bytes"],
        "checkpoint_storage_bytes": min(saves, t.keep_checkpoints) * benchmark["checkpoint_bytes"],
        "checkpoint_written_bytes": saves * benchmark["checkpoint_bytes"],
    }
    write_metrics(metrics_path("estimate"), result)
    print(summary(result))
    return result


def summary(r: dict) -> str:
    return (
        f"planned {r['planned_optimizer_steps']:,} optimizer steps ÷ {r['measured_steps_per_second']:.2f} steps/s "
        f"≈ {duration(r['estimated_seconds_by_steps'])} of training "
        f"(by tokens: {r['planned_tokens']:,} ÷ {r['measured_tokens_per_second']:,.0f} tokens/s "
        f"≈ {duration(r['estimated_seconds_by_tokens'])}), "
        f"plus {_count(r['validation_passes'], 'validation pass', 'validation passes')} "
        f"({duration(r['validation_overhead_seconds'])}), "
        f"{_count(r['checkpoint_saves'], 'checkpoint save')} ({duration(r['checkpoint_overhead_seconds'])}) "
        f"and start-up ({duration(r['startup_seconds'])}): "
        f"total ≈ {duration(r['estimated_seconds'])} (range {duration(r['estimated_seconds_low'])}"
        f"–{duration(r['estimated_seconds_high'])}); "
        f"{_count(r['checkpoint_saves'], 'checkpoint')} × {r['checkpoint_bytes'] / 2**20:.1f} MiB, "
        f"at most {r['checkpoint_storage_bytes'] / 2**20:.1f} MiB kept on disk"
    )


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else many or one + 's'}"
