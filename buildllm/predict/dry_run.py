"""The dry run: resolve everything, count parameters on the meta device, estimate memory. Trains nothing.

It ends as `train` would begin: a plan whose estimate does not fit the free memory writes its
figures, then exits non-zero with the refusal train would give (unless --force-memory)."""

from __future__ import annotations

from buildllm.config import Config
from buildllm.data.windows import check_examples
from buildllm.device.cpu_bf16 import precision_advice
from buildllm.memory.estimate import plan_memory
from buildllm.metrics import write_metrics
from buildllm.paths import metrics_path
from buildllm.plan.memory import refuse_unless_fits
from buildllm.plan.run_plan import announce, facts, make_plan
from buildllm.train.checkpoint import refuse_a_file
from buildllm.train.storage import checkpoint_bytes
from buildllm.units import size


def dry_run(config: Config) -> dict:
    plan = make_plan(config)
    check_examples(plan.config, plan.model)  # train would refuse data too short for one example: so does its dry run
    estimate = plan_memory(plan)
    announce("dry_run", plan, memory_estimate_total_bytes=estimate.total)
    advice = precision_advice(plan)
    metrics = {
        **facts(plan),
        **estimate.as_metrics(),
        "checkpoint_bytes_estimate": checkpoint_bytes(plan.parameters),
        "precision_advice": advice,
    }
    path = write_metrics(metrics_path("dry_run"), metrics)
    print(
        f"{plan.profile.name}: {plan.parameters / 1e6:.2f}M parameters, {plan.model.architecture} architecture, "
        f"on {plan.device.device} in {plan.precision.precision}, "
        f"batch {plan.batch_size} x {plan.model.sequence_length} tokens"
    )
    optimizer = "AdamW + Muon" if plan.muon_parameters else "AdamW"
    names = {"optimizer": f"{optimizer} state", "autocast_weights": "autocast copies"}
    shown = ", ".join(f"{names.get(k, k.replace('_', ' '))} {size(v)}" for k, v in estimate.parts.items() if v)
    print(f"estimated peak training memory: {size(estimate.total)} at the {estimate.peak_moment} ({shown})")
    print(f"torch.compile: {plan.compile.reason}")
    if advice:
        print(f"precision: {advice}")
    print(f"checkpoint size about {size(checkpoint_bytes(plan.parameters))}; metrics written to {path}")
    print(f"memory: {plan.memory.reason}")
    # Exit as train would: a plan train would refuse fails here too (its figures are written above).
    refuse_unless_fits(plan)
    refuse_a_file(config.train.checkpoint_directory)
    return metrics
