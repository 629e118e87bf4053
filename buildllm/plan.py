"""A run plan: the config resolved against this machine and the chosen profile.

Every stage that runs a model (dry_run, train, benchmark, estimate) starts from the same plan, so
they agree on device, precision, batch size and model shape, and every automatic choice carries
its reason.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

import torch

from buildllm.config import Config
from buildllm.errors import ConfigError
from buildllm.model.gpt import GPTConfig, build_model
from buildllm.train.optimizer import fused_adamw_support
from buildllm.device.precision import PrecisionDecision, apply_matmul_settings, resolve_precision
from buildllm.model.profiles import Profile, profile_for
from buildllm.device.device import Device
from buildllm.device.resolve import resolve_device


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
    decisions: dict = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step (all micro-batches of gradient accumulation)."""
        return self.batch_size * self.config.train.grad_accum * self.model.sequence_length


def make_plan(config: Config) -> RunPlan:
    profile = profile_for(config)
    model = profile.model
    if model.n_embd % model.n_head:
        raise ConfigError(f"model.n_embd={model.n_embd} is not divisible by model.n_head={model.n_head}; "
                          "choose values where it is")
    if model.architecture == "modern" and model.head_dim % 2:
        raise ConfigError(f"the modern architecture's rotary positions need an even head size, but n_embd "
                          f"{model.n_embd} / n_head {model.n_head} = {model.head_dim}; change model.n_head or model.n_embd")
    device = resolve_device(config.device)
    defaults = profile.runtime(device.runtime_defaults)
    precision = resolve_precision(config.precision, device, defaults.precision)
    decisions = {"device": f"{device.device}: {device.reason}", "precision": precision.reason}

    def pick(name: str, explicit, default):
        if explicit is not None:
            decisions[name] = f"requested: {explicit}"
            return explicit
        decisions[name] = f"{default}: profile {profile.name}'s {device.runtime_defaults} default"
        return default

    batch_size = pick("batch_size", config.train.batch_size, defaults.batch_size)
    workers = pick("workers", config.train.workers, defaults.workers)
    learning_rate = pick("learning_rate", config.train.learning_rate, defaults.learning_rate)
    threads = config.train.threads or torch.get_num_threads()
    decisions["threads"] = (f"{threads}: torch's default for this machine" if config.train.threads is None
                            else f"requested: {threads}")
    parameters = build_model(model, "meta").num_parameters()
    return RunPlan(config, profile, model, device, precision, batch_size, workers, learning_rate, threads,
                   parameters, decisions)


def apply_plan(plan: RunPlan) -> None:
    """Process-wide settings the plan implies: thread count and matmul precision (the Trainer seeds)."""
    if plan.device.threads_apply or plan.config.train.threads is not None:
        torch.set_num_threads(plan.threads)
    apply_matmul_settings(plan.precision)


def plan_metrics(plan: RunPlan, fused_adamw: tuple[bool, str] | None = None) -> dict:
    """The plan as flat metrics: what ran, with which flags, and why.

    fused_adamw: (built, reason) from an optimizer already built; otherwise it is probed here."""
    fused, fused_reason = fused_adamw or fused_adamw_support(plan.device.device)
    m = plan.model
    return {
        "iteration": plan.config.iteration,
        "profile": plan.profile.name,
        "architecture": m.architecture,
        "device": plan.device.device,
        "device_kind": plan.device.kind,
        "device_reason": plan.device.reason,
        "precision": plan.precision.precision,
        "precision_reason": plan.precision.reason,
        "tf32_enabled": plan.precision.tf32_enabled,
        "tensor_cores_enabled": plan.precision.tensor_cores_enabled,
        "fused_adamw": fused,
        "fused_adamw_reason": fused_reason,
        "grad_scaler": plan.precision.grad_scaler,
        "parameters": plan.parameters,
        "n_layer": m.n_layer,
        "n_head": m.n_head,
        "n_embd": m.n_embd,
        "vocab_size": m.vocab_size,
        "sequence_length": m.sequence_length,
        "batch_size": plan.batch_size,
        "grad_accum": plan.config.train.grad_accum,
        "tokens_per_step": plan.tokens_per_step,
        "workers": plan.workers,
        "threads": plan.threads,
        "learning_rate": plan.learning_rate,
        "gradient_checkpointing": plan.config.train.gradient_checkpointing,
        "compile": plan.config.train.compile,
        # What torch saw at import (buildllm.cli.before_torch sets it when mps_fallback is asked for).
        "mps_fallback": os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK") == "1",
    }


def startup_fields(plan: RunPlan, fused_adamw: tuple[bool, str] | None = None) -> dict:
    """What a run's first line must make visible: where, in which precision, with which fast paths."""
    fused, fused_reason = fused_adamw or fused_adamw_support(plan.device.device)
    p = plan.precision
    return {"device": plan.device.device, "device_reason": plan.device.reason, "precision": p.precision,
            "tensor_cores_enabled": p.tensor_cores_enabled, "tf32_enabled": p.tf32_enabled,
            "fused_adamw": fused, "fused_adamw_reason": fused_reason, "grad_scaler": p.grad_scaler,
            "profile": plan.profile.name, "parameters": plan.parameters, "batch_size": plan.batch_size,
            "workers": plan.workers, "sequence_length": plan.model.sequence_length,
            "mps_fallback": os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK") == "1"}


def announce(action: str, plan: RunPlan, fused_adamw: tuple[bool, str] | None = None, **sizes) -> dict:
    """Say what is about to happen as one JSON line on stdout, before the long work starts.

    fused_adamw: (built, reason) from an optimizer already built; otherwise it is probed here."""
    line = {"action": action, **startup_fields(plan, fused_adamw), **sizes, "decisions": plan.decisions}
    print(json.dumps(line), flush=True)
    sys.stdout.flush()
    return line
