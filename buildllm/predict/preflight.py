"""`buildllm preflight`: the course's "stop and check" before a full run, as one table.

Each row is pass, warn or fail with the figure it measured and, where it is not a pass, the fix.
Any fail exits non-zero, so the DVC stage stops the pipeline before `train`; `train` itself repeats
the checks that decide whether it may start (buildllm.train.storage and the checkpoint lock).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from buildllm.config import Config
from buildllm.data.windows import optimizer_steps
from buildllm.device import health
from buildllm.device.available import why_no_cuda
from buildllm.device.device import Device
from buildllm.errors import UserError
from buildllm.metrics import read_metrics, write_metrics
from buildllm.paths import metrics_path
from buildllm.plan.device import resolve_device
from buildllm.plan.run_plan import RunPlan, make_plan
from buildllm.predict.estimate import benchmark_controls, planned_examples, projected_run
from buildllm.train import checkpoint, storage
from buildllm.train.trainer import run_signature
from buildllm.units import duration, size

GPU_ITERATIONS = (2, 3)  # the course runs iterations 2 and 3 on a GPU; iteration 1 is the CPU run


@dataclass(frozen=True)
class Check:
    key: str  # its metric name in metrics/preflight.json
    name: str
    status: str  # pass | warn | fail
    figure: str
    fix: str = ""


def device_check(config: Config) -> tuple[Check, Device | None]:
    row = partial(Check, "device", "device resolves as intended")
    try:
        device = resolve_device(config.device)
    except UserError as exc:
        return row("fail", f"{config.device}: unavailable", str(exc)), None
    wanted = config.preset is None and config.iteration in GPU_ITERATIONS
    if config.device == "auto" and wanted and device.host_memory:
        return row(
            "warn",
            f"auto -> cpu ({why_no_cuda()})",
            f"iteration {config.iteration} is a GPU run: use a machine with CUDA (a CUDA build of PyTorch "
            "and a driver), or pass --device cpu to choose a slow CPU run deliberately",
        ), device
    return row("pass", f"{config.device} -> {device.device}"), device


def benchmark_checks(plan: RunPlan, benchmark: dict | None, problem: str) -> list[Check]:
    rerun = "run `buildllm benchmark` (or `dvc repro benchmark`) with the planned settings"
    ran = partial(Check, "benchmark", "bounded benchmark ran and fitted")
    recorded = partial(Check, "throughput", "batch size and throughput recorded")
    if benchmark is None:
        return [ran("fail", problem, rerun), recorded("fail", "not recorded", rerun)]
    if benchmark.get("oom"):
        oom = f"out of memory at batch {benchmark.get('oom_batch_size')}"
        fix = "lower --batch-size (or use --gradient-checkpointing), then rerun the benchmark"
        return [ran("fail", oom, fix), recorded("fail", "not recorded", rerun)]
    capacity = benchmark.get("memory_total_bytes") if plan.device.host_memory else benchmark.get("gpu_memory_bytes")
    peak = benchmark.get("peak_memory_bytes", 0)
    fitted = f"peak {size(peak)}" + (f" of {size(capacity)}" if capacity else "")
    speed = (
        f"batch {benchmark['batch_size']}: {benchmark['tokens_per_second']:,.0f} tok/s, "
        f"MFU {benchmark.get('mfu', 0.0):.0%}"
    )
    return [ran("pass", f"{benchmark['measured_steps']} steps, {fitted}"), recorded("pass", speed)]


def matching_benchmark(plan: RunPlan) -> tuple[dict | None, str]:
    """metrics/benchmark.json when it measured this plan; otherwise None and why not."""
    path = metrics_path("benchmark")
    if not path.exists():
        return None, f"no {path}"
    benchmark = read_metrics(path)
    if benchmark.get("oom"):
        return benchmark, ""
    controls = benchmark_controls(plan)
    differing = [key for key, value in controls.items() if benchmark.get(key) != value]
    if differing:
        key = differing[0]
        more = f" (+{len(differing) - 1} more)" if len(differing) > 1 else ""
        return None, f"measured {key} {benchmark.get(key)}, plan {controls[key]}{more}"
    return benchmark, ""


def estimate_check(plan: RunPlan, benchmark: dict | None) -> tuple[Check, dict | None]:
    path = metrics_path("estimate")
    rerun = "run `buildllm estimate` (or `dvc repro estimate`) after the benchmark"
    row = partial(Check, "estimate", "estimated runtime and storage")
    if not path.exists():
        return row("warn", f"no {path}", rerun), None
    estimate = read_metrics(path)
    stale = [key for key, value in projected_run(plan).items() if estimate.get(key) != value]
    if benchmark and estimate.get("measured_tokens_per_second") != benchmark.get("tokens_per_second"):
        stale.append("benchmark")
    if stale:
        return row("warn", f"stale: {', '.join(stale)} differ", rerun), None
    return row(
        "pass",
        f"{duration(estimate['estimated_seconds'])} ({duration(estimate['estimated_seconds_low'])}–"
        f"{duration(estimate['estimated_seconds_high'])}), {size(estimate['checkpoint_storage_bytes'])} kept",
    ), estimate


def disk_check(plan: RunPlan, estimate: dict | None, existing: int) -> tuple[Check, storage.Storage]:
    t = plan.config.train
    try:
        steps = optimizer_steps(planned_examples(plan), plan.batch_size, t.grad_accum, t.epochs)
    except UserError:
        steps = estimate["planned_optimizer_steps"] if estimate else 1
    each = estimate["checkpoint_bytes"] if estimate else storage.checkpoint_bytes(plan.parameters)
    found = storage.storage(t, each, steps, 0, existing)
    row = partial(Check, "disk", "free disk at the checkpoint directory")
    if found.fits:
        return row("pass", found.figure()), found
    return row(
        "fail",
        found.figure(),
        f"{found.explain()}: free space, lower --keep-checkpoints or use a --checkpoint-directory on a disk with room",
    ), found


def power_check() -> Check:
    state = health.battery()
    row = partial(Check, "power", "stable power")
    if not state:
        return row("pass", "no battery reported (mains)")
    if not state["power_plugged"]:
        return row(
            "warn",
            f"on battery, {state['battery_percent']:.0f}%",
            "plug in the charger: on battery a laptop slows down and may sleep mid-run",
        )
    return row("pass", f"on mains, battery {state['battery_percent']:.0f}%")


def cooling_check(plan: RunPlan, benchmark: dict | None) -> tuple[Check, dict]:
    sensed = health.sensors(plan.device)
    readings = health.describe(sensed)
    readings = f"; {readings}" if readings else ""
    row = partial(Check, "cooling", "stable cooling")
    if benchmark is None or "throughput_falls" not in benchmark:
        return row(
            "warn",
            "no interval trend" + readings,
            "rerun the benchmark: its intervals show whether throughput falls as the machine heats",
        ), sensed
    trend = f"{benchmark['throughput_drift']:+.1%} over {benchmark['intervals']} intervals"
    if health.throttling_suspected(benchmark):
        return row(
            "warn",
            f"throttling suspected: {trend}" + readings,
            "let the machine cool, raise it for airflow or clean its vents, close other heavy programs, "
            "then rerun the benchmark",
        ), sensed
    return row("pass", f"no steady fall: {trend}" + readings), sensed


def directory_check(plan: RunPlan, dvc: bool) -> tuple[Check, int]:
    """The checkpoint directory is this run's alone; returns the check and its checkpoints' count."""
    directory = Path(plan.config.train.checkpoint_directory)
    row = partial(Check, "directory", "checkpoint directory unique")
    holder = checkpoint.lock_holder(directory)
    if holder:
        return row(
            "fail",
            f"in use by {holder}",
            "wait for that run to finish or stop it, or use another --checkpoint-directory",
        ), 0
    # Under DVC too: the train stage's out persists, so a file there stays and train would refuse it.
    if (blocker := checkpoint.file_in_the_way(directory)) is not None:
        return row(
            "fail",
            f"{blocker} is a file",
            "pass a --checkpoint-directory that is a directory or does not exist yet, or move that file away",
        ), 0
    found = checkpoint.list_checkpoints(directory)
    foreign = checkpoint.foreign_files(directory)
    if not found and not foreign:
        return row("pass", f"{directory}: new" if not directory.exists() else f"{directory}: empty"), 0
    if dvc:  # under DVC the train stage clears this directory itself (persist), once its checks pass
        return row("pass", f"{directory}: DVC restarts it"), 0
    if not found:
        return row(
            "fail",
            f"{directory}: other files ({foreign[0]})",
            "use an empty or new --checkpoint-directory",
        ), 0
    try:
        state = checkpoint.load(found[-1])
    except checkpoint.DamagedCheckpoint as exc:
        return row(
            "fail",
            f"{found[-1].name} is {exc.condition} ({exc.why.split(':')[0]})",
            "use a fresh --checkpoint-directory (train falls back to an older checkpoint if one reads)",
        ), 0
    signature = run_signature(plan, int(os.environ.get("WORLD_SIZE", "1")), planned_examples(plan))
    changed = checkpoint.differences(checkpoint.saved_signature(state), signature)
    if not changed:
        return row("pass", f"this run's, resumes at step {state['step']}"), len(found)
    what = "; ".join(changed[:2]) + (" ..." if len(changed) > 2 else "")
    if plan.config.train.force and not any(c.startswith(("model.", "profile ")) for c in changed):
        return row(
            "warn",
            f"--force continues another schedule: {what}",
            "a fresh --checkpoint-directory keeps runs apart",
        ), len(found)
    return row(
        "fail",
        f"holds another run: {what}",
        "use a fresh --checkpoint-directory (or --force to continue it with the new schedule)",
    ), 0


def run_checks(config: Config, dvc: bool = False) -> tuple[list[Check], dict]:
    device_row, device = device_check(config)
    rows, figures = [device_row], {}
    plan = None
    if device is not None:
        row = partial(Check, "precision", "precision supported")
        try:
            plan = make_plan(config)
            rows.append(row("pass", f"{plan.precision.precision} on {plan.device.device}"))
        except UserError as exc:
            rows.append(row("fail", f"{config.precision} unsupported", str(exc)))
    if plan is None:
        missing = ("benchmark", "throughput", "estimate", "disk", "cooling", "directory")
        return rows + [
            Check(key, key, "fail", "not checked", "fix the device and precision first") for key in missing
        ] + [power_check()], figures
    benchmark, problem = matching_benchmark(plan)
    rows += benchmark_checks(plan, benchmark, problem)
    estimate_row, estimate = estimate_check(plan, benchmark)
    rows.append(estimate_row)
    directory_row, existing = directory_check(plan, dvc)
    disk_row, needed = disk_check(plan, estimate, existing)
    measured = None if benchmark is None or benchmark.get("oom") else benchmark
    cooling_row, sensed = cooling_check(plan, measured)
    rows += [disk_row, power_check(), cooling_row, directory_row]
    figures.update(free_disk_bytes=needed.free, disk_needed_bytes=needed.needed, **health.battery(), **sensed)
    if measured:
        figures.update({key: measured.get(key, 0.0) for key in ("batch_size", "tokens_per_second", "throughput_drift")})
    if estimate:
        figures.update({key: estimate[key] for key in ("estimated_seconds", "checkpoint_storage_bytes")})
    return rows, figures


def table(rows: list[Check]) -> str:
    """A Markdown table: readable in a terminal, pasteable into a README."""
    lines = ["| check | status | measured | fix |", "|---|---|---|---|"]
    lines += [
        f"| {r.name} | {r.status if r.status == 'pass' else r.status.upper()} | {r.figure} | {r.fix or '—'} |"
        for r in rows
    ]
    return "\n".join(lines)


def preflight(config: Config, dvc: bool = False) -> dict:
    rows, figures = run_checks(config, dvc)
    failed = [r for r in rows if r.status == "fail"]
    warned = [r for r in rows if r.status == "warn"]
    verdict = "fail" if failed else "warn" if warned else "pass"
    metrics = {
        "preflight": verdict,
        "checks_failed": len(failed),
        "checks_warned": len(warned),
        **{r.key: r.status for r in rows},
        **figures,
    }
    print(table(rows))
    write_metrics(metrics_path("preflight"), metrics)
    if failed:
        raise UserError(
            f"preflight: {len(failed)} check(s) failed ({', '.join(r.name for r in failed)}); "
            "apply the fixes in the table above before training"
        )
    then = f"read the warnings ({', '.join(r.name for r in warned)}) before a long run" if warned else "ready to train"
    print(f"preflight: {len(rows) - len(warned)} of {len(rows)} checks pass; {then}")
    return metrics


def preflight_stage(config: Config) -> dict:
    """The DVC stage: as the command, knowing that DVC restarts the train stage's checkpoint folder.

    It runs at every `dvc repro` (the machine's state now is no dependency DVC can see). Train depends
    on its gate file, written only when no check failed and the same bytes each time, so a passing
    preflight never makes a finished train rerun; metrics/preflight.json keeps this run's readings."""
    metrics = preflight(config, dvc=True)
    write_metrics(metrics_path("preflight_gate"), {"preflight": "no check failed"})
    return metrics
