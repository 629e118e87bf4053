"""The benchmark stage: a bounded, honest measurement of training speed and memory with the
Trainer's own step (the same code path as `train`) on the real token tensors. Its measured steps are
timed in equal intervals, so a drift (thermal throttling, a competing job) shows as their
coefficient of variation. What it times and how MFU's peak is found: docs/measuring.md.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from tqdm import tqdm

from buildllm.config import Config
from buildllm.data.windows import Windows, load_windows
from buildllm.device.cpu_bf16 import precision_advice
from buildllm.device.hardware import environment
from buildllm.device.health import interval_trend
from buildllm.device.load import LoadWatch, busy_warning
from buildllm.device.oom import advice, out_of_memory
from buildllm.device.peak_flops import MatmulProbe, datasheet_peak, measured_peak, sample_peak, step_probe
from buildllm.errors import TrainingFailed
from buildllm.measure.breakdown import overheads, shares, step_breakdown
from buildllm.measure.stats import coefficient_of_variation, interval_metrics, noise_warning, numbered
from buildllm.memory.estimate import plan_memory
from buildllm.metrics import write_metrics
from buildllm.model.flops import flops_per_token, matmul_parameters, mfu, paired_mfu
from buildllm.paths import metrics_path
from buildllm.plan.memory import refuse_unless_fits
from buildllm.plan.run_plan import RunPlan, announce, apply_plan, facts, make_plan
from buildllm.train.run_log import write_png
from buildllm.train.trainer import Trainer


def measure(
    plan: RunPlan,
    train: Windows,
    validation: Windows,
    *,
    extras: bool = True,
    probe: MatmulProbe | None = None,
    load: bool = True,
) -> dict:
    """Time warm-up and measured steps of one plan; returns flat figures (no file written).

    extras=False (the batch finder, the sweep: speed and memory only) skips the progress bar, the
    timed validation pass and the checkpoint save. A probe times one matmul before the first
    measured step and after every one (outside the steps' own time). With `load`, other processes'
    CPU load is read around the measured work (load.py)."""
    bench = plan.config.benchmark
    watch = LoadWatch(used=plan.cores) if load else None
    scratch = Path(tempfile.mkdtemp(prefix="buildllm-benchmark-"))
    try:
        start = plan.device.timed()
        trainer = Trainer(plan, train, validation, directory=scratch)
        for done in range(1, bench.warmup_steps + 1):
            trainer.step()
            if done == 1:  # start-up and the first step, which allocates (and compiles)
                first_step = plan.device.timed()
        warmed = plan.device.timed()
        per_interval = [len(part) for part in np.array_split(range(bench.measured_steps), bench.intervals)]
        rates, losses, seconds, step_seconds = [], [], [], []
        if probe:
            probe.sample(1)
        if watch:
            watch.mark()  # others' load over the whole measured window, beside the start and the end
        with tqdm(total=bench.measured_steps, desc="benchmark", unit="step", disable=not extras) as bar:
            for steps in (n for n in per_interval if n > 0):
                if probe:
                    # CPU: each step timed alone, with one matmul after it, so every step has the
                    # machine's matmul rate on both sides, a fraction of a second away. Only the
                    # steps' time counts; an interval's is the sum of its steps'.
                    for _ in range(steps):
                        begin = plan.device.timed()
                        losses.append(trainer.step())
                        step_seconds.append(plan.device.timed() - begin)
                        probe.sample(1)
                        bar.update()
                    seconds.append(sum(step_seconds[-steps:]))
                else:  # no sync per step: it would stall an accelerator's queue
                    begin = plan.device.timed()
                    for _ in range(steps):
                        losses.append(trainer.step())
                        bar.update()
                    seconds.append(plan.device.timed() - begin)
                rates.append(steps / seconds[-1])
        # The intervals' own time: the bar's redraws between them are not training, and the overall
        # rate then lies between the slowest and the fastest interval, as it must.
        measured_seconds = sum(seconds)
        busy = watch.end() if watch else {}
        figures = trainer.memory.read()  # peak since the Trainer began building the model
        # A few more steps with their parts timed apart (their syncs would slow the intervals above).
        parts = step_breakdown(trainer, max(2, bench.measured_steps // bench.intervals))
        validation_seconds, save_seconds, save_bytes, plot_seconds = 0.0, 0.0, 0, 0.0
        if extras:
            before = plan.device.timed()
            trainer.evaluate()
            validation_seconds = plan.device.timed() - before
            save_seconds, save_bytes = trainer.save_checkpoint()
            # A training run ends by drawing its loss curve (matplotlib's import is most of it).
            before = time.perf_counter()
            write_png(
                [{"step": i + 1, "train_loss": loss} for i, loss in enumerate(trainer.read_losses(losses)[0])],
                "benchmark",
                scratch / "train_loss.png",
            )
            plot_seconds = time.perf_counter() - before
        matmuls = matmul_parameters(trainer.model)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    steps_per_second = bench.measured_steps / measured_seconds
    # Each step's peak: the median of the matmul rates measured just before and just after it.
    samples = probe.samples if probe else []
    step_peaks = [statistics.median(before + after) for before, after in zip(samples, samples[1:])]
    tokens_per_second = steps_per_second * plan.tokens_per_step
    return {
        "warmup_steps": bench.warmup_steps,
        "measured_steps": bench.measured_steps,
        "intervals": len(rates),
        "time_to_first_step_seconds": first_step - start,
        "warmup_seconds": warmed - start,
        "measured_seconds": measured_seconds,
        "steps_per_second": steps_per_second,
        "tokens_per_second": tokens_per_second,
        "interval_steps_per_second_min": min(rates),
        "interval_steps_per_second_max": max(rates),
        "throughput_cv": coefficient_of_variation(rates),
        **interval_metrics(rates),
        **{f"step_{i}_seconds": taken for i, taken in enumerate(step_seconds, start=1)},
        **{f"step_{i}_peak_flops": peak for i, peak in enumerate(step_peaks, start=1)},
        **interval_trend(rates),  # a steady fall suggests throttling (preflight's cooling check)
        "validation_examples": len(validation),
        "validation_seconds": validation_seconds,
        "checkpoint_save_seconds": save_seconds,
        "checkpoint_bytes": save_bytes,
        "plot_seconds": plot_seconds,
        "flops_per_token": flops_per_token(plan.model, matmuls),
        **parts,
        **overheads(plan.config, validation_seconds, save_seconds),
        **figures,
        **busy,
    }


def benchmark(config: Config) -> dict:
    plan = make_plan(config)
    refuse_unless_fits(plan)  # nothing is loaded, built or written for a plan that cannot fit
    train, validation = load_windows(config, plan.model)
    apply_plan(plan)
    bench = config.benchmark
    announce(
        "benchmark",
        plan,
        planned_steps=bench.warmup_steps + bench.measured_steps,
        warmup_steps=bench.warmup_steps,
        measured_steps=bench.measured_steps,
        training_examples=len(train),
        validation_examples=len(validation),
    )
    estimate = plan_memory(plan, training=False)
    base = {
        **facts(plan),
        **environment(plan.device),
        "memory_estimate_total_bytes": estimate.total,
        **estimate.range_metrics(),
        "precision_advice": precision_advice(plan),
    }
    # Interpreter start, imports, device initialisation and token loading: a run pays them too.
    process_startup = time.time() - psutil.Process().create_time()
    datasheet = datasheet_peak(plan.device, plan.precision.precision, plan.precision.tf32_enabled)
    # Made before the Trainer, so its buffers are in the memory baseline, not the measured peak.
    probe = step_probe(plan.device, plan.precision.precision)
    measured_apart = probe is None
    before = sample_peak(plan.device, plan.precision.precision) if measured_apart else []
    try:
        figures = measure(plan, train, validation, probe=probe)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        fix = advice(plan.batch_size)
        oom = {**base, "oom": True, "oom_batch_size": plan.batch_size, **plan.device.oom_figures(), "oom_advice": fix}
        write_metrics(metrics_path("benchmark"), oom)
        raise TrainingFailed(f"out of memory at batch size {plan.batch_size} on {plan.device.device}; {fix}") from None
    finally:
        if probe:
            probe.close()
    # The matmul samples in time order: between the steps, or just before and after them.
    edges = probe.samples if probe else []
    if measured_apart:
        edges = [before, sample_peak(plan.device, plan.precision.precision)]
    rates = [rate for edge in edges for rate in edge]
    peak = measured_peak(plan.device, plan.precision.precision, rates)
    achieved = figures["flops_per_token"] * figures["tokens_per_second"]
    metrics = {
        **base,
        "oom": False,
        **figures,
        "process_startup_seconds": process_startup,
        "achieved_flops": achieved,
        "peak_flops": peak.flops,
        "peak_flops_source": peak.source,
        # Beside the measured peak, the datasheet's where the GPU is in the table (0 and "" elsewhere).
        "peak_flops_datasheet": datasheet.flops if datasheet else 0.0,
        "peak_flops_datasheet_source": datasheet.source if datasheet else "",
        # The matmul rate before the first and after the last measured step: far apart, the
        # machine's load (or a GPU's clocks) changed during the run.
        "peak_flops_before": statistics.median(edges[0]) if edges else 0.0,
        "peak_flops_after": statistics.median(edges[-1]) if edges else 0.0,
        "memory_estimate_ratio": estimate.total / figures["peak_memory_bytes"] if figures["peak_memory_bytes"] else 0.0,
    }
    metrics["mfu"] = mfu_from_metrics(metrics)
    metrics["mfu_datasheet"] = (
        mfu(figures["flops_per_token"], figures["tokens_per_second"], datasheet.flops) if datasheet else 0.0
    )
    write_metrics(metrics_path("benchmark"), metrics)
    print(summary(metrics))
    for warning in (noise_warning(metrics), busy_warning(metrics)):
        if warning:
            print(warning, file=sys.stderr)
    print(f"torch.compile: {metrics['compile_reason']}")
    if metrics["precision_advice"]:
        print(f"precision: {metrics['precision_advice']}")
    return metrics


def mfu_from_metrics(m: dict) -> float:
    """MFU from a benchmark's metrics alone: each step against the peak measured beside it (the
    median of those; model/flops.py paired_mfu), or achieved ÷ peak for a peak taken before and
    after the steps (a GPU: no step_<i>_peak_flops)."""
    peaks = numbered(m, "step_{}_peak_flops")
    if peaks:
        steps_per_second = [1 / s for s in numbered(m, "step_{}_seconds")]
        return paired_mfu(m["flops_per_token"], m["tokens_per_step"], steps_per_second, peaks)
    return mfu(m["flops_per_token"], m["tokens_per_second"], m["peak_flops"])


def summary(m: dict) -> str:
    parts = ", ".join(f"{phase} {share:.0%}" for phase, share in shares(m).items())
    return (
        f"{m['profile']} on {m['device']} ({m['precision']}, batch {m['batch_size']} x {m['sequence_length']}, "
        f"{m['threads']} threads): {m['tokens_per_second']:,.0f} tokens/s, {m['steps_per_second']:.2f} steps/s "
        f"(interval CV {m['throughput_cv']:.1%}), MFU {m['mfu']:.1%} of {m['peak_flops'] / 1e12:.2f} TFLOP/s "
        f"[{m['peak_flops_source']}]"
        + (
            f" ({m['mfu_datasheet']:.1%} of the datasheet's {m['peak_flops_datasheet'] / 1e12:.1f})"
            if m.get("mfu_datasheet")
            else ""
        )
        + f", peak memory {m['peak_memory_bytes'] / 2**20:.0f} MiB "
        f"(estimate {m['memory_estimate_total_bytes'] / 2**20:.0f} MiB, "
        f"range {m['memory_estimate_low_bytes'] / 2**20:.0f}-"
        f"{m['memory_estimate_high_bytes'] / 2**20:.0f}), warm-up {m['warmup_seconds']:.1f} s, "
        f"checkpoint {m['checkpoint_bytes'] / 2**20:.1f} MiB in {m['checkpoint_save_seconds']:.2f} s"
        + (f"; a step's time: {parts}" if parts else "")
    )
