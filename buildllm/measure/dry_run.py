"""The dry run: resolve everything, count parameters on the meta device, estimate memory. Trains nothing."""

from __future__ import annotations

from buildllm.config import Config
from buildllm.data.windows import Windows, batches_per_epoch, load_tokens
from buildllm.device.cpu_bf16 import precision_advice
from buildllm.errors import UserError
from buildllm.train.compile_choice import plan_compile
from buildllm.measure.memory_estimate import checkpoint_bytes, plan_memory
from buildllm.metrics import write_metrics
from buildllm.paths import metrics_path, token_paths
from buildllm.plan import announce, make_plan, plan_metrics
from buildllm.train.schedule import planned_steps
from buildllm.units import size


def dry_run(config: Config) -> dict:
    plan = make_plan(config)
    estimate = plan_memory(plan)
    steps = planned(plan)
    announce("dry_run", plan, planned_steps=steps, memory_estimate_total_bytes=estimate.total)
    compiled, advice = plan_compile(plan, steps), precision_advice(plan)
    metrics = {**plan_metrics(plan), **estimate.as_metrics(), "checkpoint_bytes_estimate": checkpoint_bytes(plan.parameters),
               "compile_reason": compiled.reason, "precision_advice": advice}
    path = write_metrics(metrics_path("dry_run"), metrics)
    print(f"{plan.profile.name}: {plan.parameters / 1e6:.2f}M parameters, {plan.model.architecture} architecture, "
          f"on {plan.device.device} in {plan.precision.precision}, batch {plan.batch_size} x {plan.model.sequence_length} tokens")
    parts = {"weights": estimate.weights, "gradients": estimate.gradients, "AdamW": estimate.optimizer,
             "autocast copies": estimate.autocast_weights, "activations": estimate.activations,
             "logits": estimate.logits, "attention scores": estimate.attention_scores,
             "allocator": estimate.allocator}
    shown = ", ".join(f"{name} {size(part)}" for name, part in parts.items() if part)
    print(f"estimated peak training memory: {size(estimate.total)} at the {estimate.peak_moment} ({shown})")
    print(f"torch.compile: {compiled.reason}")
    if advice:
        print(f"precision: {advice}")
    print(f"checkpoint size about {size(checkpoint_bytes(plan.parameters))}; metrics written to {path}")
    return metrics


def planned(plan) -> int | None:
    """The planned run's optimizer steps, for the startup line (the Trainer's count); None when neither
    the token file nor a training_examples limit says how many examples there are."""
    t = plan.config.train
    examples = t.training_examples
    train_path, _ = token_paths(plan.config, plan.model.vocab_size)
    try:
        if train_path.exists():
            examples = len(Windows(load_tokens(train_path), plan.model.sequence_length, examples))
    except UserError:
        pass
    if examples is None:
        return None
    return planned_steps(batches_per_epoch(examples, plan.batch_size), t.epochs, t.grad_accum)
