"""A run plan: every decision a run needs (buildllm/plan/__init__.py), made once before anything is
built, in the order each needs the last, each reason kept in `decisions`."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, replace

import torch

from buildllm.config import Config, profile_for
from buildllm.data.windows import Windows, batches_per_epoch, load_tokens, planned_steps
from buildllm.device import allocator
from buildllm.device.device import Device
from buildllm.device.machine import OVERRIDE, fingerprint, machine_id
from buildllm.device.precision import PrecisionDecision, apply_matmul_settings
from buildllm.errors import ConfigError, UserError
from buildllm.metrics import json_line
from buildllm.model.gpt import GPTConfig, build_model
from buildllm.paths import token_paths
from buildllm.plan import loss_chunk, tuned
from buildllm.plan import precision as precision_module
from buildllm.plan import threads as threads_module
from buildllm.plan.attention import AttentionDecision, decide_attention
from buildllm.plan.compile import CompileDecision, compile_figures, decide_compile
from buildllm.plan.defaults import decide_defaults
from buildllm.plan.device import resolve_device
from buildllm.plan.fused_adamw import fused_adamw_support
from buildllm.plan.memory import NOT_DECIDED, MemoryFit, decide_memory
from buildllm.plan.newton_schulz import decide_newton_schulz
from buildllm.plan.optimizer_groups import describe, split_parameters
from buildllm.plan.recipe import RecipeDecision, decide_recipe
from buildllm.profiles import Profile


@dataclass(frozen=True)
class RunPlan:
    config: Config
    profile: Profile
    model: GPTConfig
    device: Device
    precision: PrecisionDecision
    batch_size: int
    workers: int
    learning_rate: float
    threads: int
    parameters: int
    processes: int
    training_examples: int | None  # None: unknown before the token file exists
    planned_steps: int | None
    compile: CompileDecision
    fused_adamw: bool  # its reason: decisions["fused_adamw"]
    decisions: dict
    tuned_here: bool  # a tune record of this machine, profile, shape and batch decided the auto knobs
    loss: loss_chunk.LossDecision
    recipe: RecipeDecision
    muon_parameters: int  # those Muon updates (0 with adamw); AdamW has the rest
    attention: AttentionDecision
    memory: MemoryFit = NOT_DECIDED  # decided from the rest of the plan
    newton_schulz: str = "bf16"  # Muon's orthogonalisation precision (plan/newton_schulz.py)

    @property
    def tokens_per_step(self) -> int:
        """Of one process (all micro-batches of gradient accumulation)."""
        return self.batch_size * self.config.train.grad_accum * self.model.sequence_length

    @property
    def cores(self) -> int:
        """The cores a run computes on: its torch threads on the CPU; one feeds an accelerator."""
        return self.threads if self.device.threads_apply else 1


def make_plan(
    config: Config, training_examples: int | None = None, tune_record: dict | None = None, read_tune: bool = True
) -> RunPlan:
    """training_examples: the windows a caller has already loaded; otherwise counted from the token file.
    tune_record: the record `buildllm tune` is writing for this very plan, read instead of the one on
    disk, so that each of its parts runs what its own earlier parts measured and nothing of the last tune.
    read_tune False: the plan of a machine without tune's record, whatever is on disk (the lab's tools
    compare the stated defaults unless told to read it)."""
    profile = profile_for(config)
    model = profile.model
    if model.n_embd % model.n_head:
        raise ConfigError(
            f"model.n_embd={model.n_embd} is not divisible by model.n_head={model.n_head}; choose values where it is"
        )
    if model.architecture == "modern" and model.head_dim % 2:
        raise ConfigError(
            f"the modern architecture's rotary positions need an even head size, but n_embd "
            f"{model.n_embd} / n_head {model.n_head} = {model.head_dim}; change model.n_head or model.n_embd"
        )
    device = resolve_device(config.device)
    decisions = {"device": f"{device.device}: {device.reason}"}
    fused, decisions["fused_adamw"] = fused_adamw_support(device.device)
    _, decisions["allocator"] = allocator.decide(device.host_memory)
    t = config.train
    picked = decide_defaults(t, profile, device.runtime_defaults, device.worker_context is not None)
    decisions.update({name: reason for name, (_, reason) in picked.items()})
    batch_size, workers = (picked[name][0] for name in ("batch_size", "workers"))
    recipe = decide_recipe(t, profile, device.runtime_defaults)
    decisions.update(recipe.reasons)
    # torchrun says how many processes share the run; each takes batch_size of every global batch.
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    examples = training_examples if training_examples is not None else count_training_examples(config, model)
    steps = None  # unknown without a token file or a cap on the examples
    if examples is not None:
        steps = planned_steps(batches_per_epoch(examples, batch_size * processes), t.epochs, t.grad_accum)
    # This machine's tune figures for this profile, device, shape and batch (or why there are none),
    # read in one place; the measured rules of threads, precision, compile, the loss and attention decide from them.
    record, why_not = tune_record, ""
    if record is None and not read_tune:
        why_not = tuned.NOT_READ
    elif record is None:
        shape = tuned.shape_label(model, t.gradient_checkpointing)
        record, why_not = tuned.lookup(this_machine(), profile.name, device.device, batch_size, shape)
    threads, decisions["threads"] = threads_module.decide_threads(t.threads, device.threads_apply, record, why_not)
    default_precision = profile.runtime(device.runtime_defaults).precision
    precision = precision_module.resolve_precision(config.precision, device, default_precision, (record, why_not))
    decisions["precision"] = precision.reason
    # Compile figures measured here apply to the shape, batch and precision they were taken at only.
    compiled = decide_compile(t.compile, steps, precision.precision, *compile_figures(record, why_not))
    decisions["compile"] = compiled.reason
    rows = batch_size * model.sequence_length
    loss = loss_chunk.plan_loss(
        model.vocab_size, rows, precision.activation_bytes, device, record, why_not, precision.precision
    )
    decisions["loss"] = loss.reason
    attention = decide_attention(record, why_not, precision.precision)
    decisions["attention"] = attention.reason
    meta = build_model(model, "meta")
    parameters = meta.num_parameters()
    groups = split_parameters(meta, recipe.optimizer)
    muon_parameters = sum(p.numel() for _, p in groups.get("muon", []))
    decisions["optimizer_groups"] = describe(groups)
    newton_schulz = "bf16"
    if recipe.optimizer == "muon":
        newton_schulz, decisions["newton_schulz"] = decide_newton_schulz(device)
    plan = RunPlan(
        config,
        profile,
        model,
        device,
        precision,
        batch_size,
        workers,
        recipe.learning_rate,
        threads,
        parameters,
        processes,
        examples,
        steps,
        compiled,
        fused,
        decisions,
        tuned_here=record is not None,
        loss=loss,
        recipe=recipe,
        muon_parameters=muon_parameters,
        attention=attention,
        newton_schulz=newton_schulz,
    )
    memory = decide_memory(plan)
    decisions["memory"] = memory.reason
    return replace(plan, memory=memory)


@functools.lru_cache(maxsize=4)
def _machine_id(override: str) -> str:
    return machine_id(fingerprint())


def this_machine() -> str:
    """Computed once per process (and per test override)."""
    return _machine_id(os.environ.get(OVERRIDE, ""))


def count_training_examples(config: Config, model: GPTConfig) -> int | None:
    """The training windows a run will use: the token file's, capped by train.training_examples; the
    cap alone before the file exists (None when neither says)."""
    limit = config.train.training_examples
    train_path, _ = token_paths(config, model.vocab_size)
    with contextlib.suppress(UserError):  # an unreadable file is refused, with its reason, where the run loads it
        if train_path.exists():
            return len(Windows(load_tokens(train_path), model.sequence_length, limit))
    return limit


def measured_precision(record: dict, plan: RunPlan) -> tuple[str, str]:
    """(precision, why): what `precision: auto` makes of a fresh tune record for this plan."""
    profile_default = plan.profile.runtime(plan.device.runtime_defaults).precision
    default = precision_module.resolve_precision("auto", plan.device, profile_default).precision
    return precision_module.measured_choice(record, "", default)


def measured_decisions(record: dict, plan: RunPlan) -> dict:
    """What the measured rules make of a fresh tune record for this plan, {decision: reason}: what
    `buildllm tune` prints and records as the decisions the next plan will take."""
    chosen, why = measured_precision(record, plan)
    out = {"precision": f"{chosen}: {why}"}
    # The precision the run computes in: auto's choice, unless tune was run for a precision set explicitly.
    chosen = record.get("measured_in", {}).get("precision", chosen)
    if plan.device.threads_apply:
        out["threads"] = threads_module.measured_choice(record, "", threads_module.DEFAULT_THREADS)[1]
    out["compile"] = decide_compile("auto", plan.planned_steps, chosen, *compile_figures(record, "")).reason
    default_rows = record.get("loss_chunk", {}).get("default_rows", 0)
    out["loss_chunk"] = loss_chunk.measured_choice(record, "", default_rows, chosen)[1]
    out["attention"] = decide_attention(record, "", chosen).reason
    return out


def apply_plan(plan: RunPlan) -> None:
    """Process-wide settings the plan implies: thread count, matmul precision and, on the host, the
    allocator's thresholds (the Trainer seeds)."""
    if allocator.decide(plan.device.host_memory)[0]:
        allocator.keep_freed_memory()
    if plan.device.threads_apply or plan.config.train.threads is not None:
        torch.set_num_threads(plan.threads)
    apply_matmul_settings(plan.precision)


# The recipe's decisions whose reasons the facts carry (as *_reason notes).
RECIPE_REASONS = ("recipe", "optimizer", "optimizer_groups", "schedule", "muon_learning_rate", "decay_fraction")


def facts(plan: RunPlan) -> dict:
    """The plan as one flat record, which the startup line, the metrics files and the run log start from."""
    m, p = plan.model, plan.precision
    return {
        "iteration": plan.config.iteration,
        "profile": plan.profile.name,
        "architecture": m.architecture,
        # The architecture knobs, each as the model has it (activation resolved: never null).
        "activation": m.mlp_activation,
        **{name: getattr(m, name) for name in ("qk_norm", "zero_init_projections", "tied_output")},
        "device": plan.device.device,
        "device_kind": plan.device.kind,
        "device_reason": plan.device.reason,
        "precision": p.precision,
        "precision_reason": p.reason,
        **{name: getattr(p, name) for name in ("tf32_enabled", "tensor_cores_enabled", "grad_scaler")},
        "recipe": plan.recipe.name,
        "optimizer": plan.recipe.optimizer,
        "schedule": plan.recipe.schedule,
        **({"muon_learning_rate": plan.recipe.muon_learning_rate} if plan.recipe.optimizer == "muon" else {}),
        **({"decay_fraction": plan.recipe.decay_fraction} if plan.recipe.schedule == "wsd" else {}),
        "muon_parameters": plan.muon_parameters,
        "adamw_parameters": plan.parameters - plan.muon_parameters,
        "fused_adamw": plan.fused_adamw,
        "fused_adamw_reason": plan.decisions["fused_adamw"],
        "parameters": plan.parameters,
        **{name: getattr(m, name) for name in ("n_layer", "n_head", "n_embd", "vocab_size", "sequence_length")},
        "batch_size": plan.batch_size,
        "grad_accum": plan.config.train.grad_accum,
        "tokens_per_step": plan.tokens_per_step,
        "processes": plan.processes,
        **({"planned_steps": plan.planned_steps} if plan.planned_steps is not None else {}),
        **{name: getattr(plan, name) for name in ("workers", "threads", "tuned_here", "learning_rate")},
        "gradient_checkpointing": plan.config.train.gradient_checkpointing,
        "compile": plan.config.train.compile,
        "compile_enabled": plan.compile.enabled,
        "compile_reason": plan.compile.reason,
        "loss_chunk_rows": plan.loss.chunk_rows,
        "loss_chunks": plan.loss.chunks,
        "loss_reason": plan.loss.reason,
        "attention": plan.attention.kernel,
        "attention_reason": plan.attention.reason,
        **plan.memory.metrics(),
        "force_memory": plan.config.train.force_memory,
        # The picks' reasons (requested, or whose default): notes that the run card shows.
        **{
            f"{name}_reason": plan.decisions[name]
            for name in ("batch_size", "workers", "threads", "learning_rate", *RECIPE_REASONS)
            if name in plan.decisions
        },
        # What torch saw at import (buildllm/torch_env.py sets it when mps_fallback is asked for).
        "mps_fallback": os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK") == "1",
    }


def announce(action: str, plan: RunPlan, **sizes) -> dict:
    """Say what is about to happen as one JSON line on stdout, before the long work starts; `sizes`
    add to the plan's facts or replace them (a benchmark plans its own steps)."""
    line = {"action": action, **facts(plan), **sizes, "decisions": plan.decisions}
    json_line(**line)
    return line
