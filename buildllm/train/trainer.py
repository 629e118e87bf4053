"""The Trainer, which owns everything one optimizer step touches (the run around it: train/loop.py).

Trainer.step() is one optimizer step: grad_accum micro-batches drawn from a resumable data cursor,
each under autocast, gradients scaled for fp16, averaged across processes only on the last
micro-batch, clipped, then the recipe's optimizers (train/optimizer.py) at the schedule's
learning rate. The benchmark times this same
method. Trainer.state() is everything a bitwise-exact resume needs.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict
from itertools import islice
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from buildllm.config import config_to_dict, knobs, value_at
from buildllm.data.windows import RunBatches, Windows, batches_per_epoch, loader, optimizer_steps, sequential_batches
from buildllm.device.precision import autocast, grad_scaler
from buildllm.device.rng import rng_state, set_rng_state
from buildllm.errors import TrainingFailed, UserError
from buildllm.model.gpt import build_model
from buildllm.plan.run_plan import RunPlan, facts
from buildllm.train import checkpoint, distributed
from buildllm.train.background_save import BackgroundSave, host_copy
from buildllm.train.distributed import World
from buildllm.train.optimizer import plan_optimizers
from buildllm.train.run_log import RunLog
from buildllm.train.schedule import make_schedule


class NonFiniteLoss(TrainingFailed):
    def __init__(self, step: int, loss: float):
        super().__init__(f"training loss became {loss} at step {step}")
        self.step, self.loss = step, loss


class TrainingInterrupted(TrainingFailed):
    exit_code = 130


class DataCursor:
    """Micro-batches in the deterministic epoch order, from a position a checkpoint can restore."""

    def __init__(
        self,
        windows: Windows,
        batch_size: int,
        seed: int,
        world: World,
        workers: int = 0,
        pin_memory: bool = False,
        context: str | None = None,
    ):
        self.seed, self.global_batch = seed, batch_size * world.size
        if batches_per_epoch(len(windows), self.global_batch) < 1:
            raise UserError(
                f"{len(windows)} training examples are fewer than one batch of {self.global_batch} "
                "(batch_size x processes); raise --training-examples or lower --batch-size"
            )
        # The batches from any position, such as the one a checkpoint restores.
        self._loader = lambda epoch, batch: loader(
            RunBatches(windows, batch_size, seed, epoch, batch, world.rank, world.size), workers, pin_memory, context
        )
        self.epoch, self.batch, self._batches = 0, 0, None

    def next(self) -> torch.Tensor:
        """The next micro-batch as Windows.pair gives it: inputs and targets in one tensor."""
        if self._batches is None:  # one loader for the rest of the run: its workers start once
            self._batches = self._loader(self.epoch, self.batch)
        self.epoch, index, pair = next(self._batches)
        self.batch = index + 1
        return pair

    def state(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch, "seed": self.seed, "global_batch": self.global_batch}

    def load(self, state: dict) -> None:
        # A forced resume with another batch size continues at the same example, not the same batch number.
        examples = state["batch"] * state["global_batch"]
        self.epoch, self.batch, self._batches = state["epoch"], examples // self.global_batch, None


def run_signature(plan: RunPlan, world_size: int, training_examples: int) -> dict:
    """What must match for a resume to continue the same schedule (device and threads may change):
    the knobs the config declares `resume=True`, and what the plan resolved."""
    declared = {key.rsplit(".", 1)[-1]: value_at(plan.config, key) for key, f, _ in knobs() if f.metadata["resume"]}
    return {
        **declared,
        "profile": plan.profile.name,
        **{f"model.{k}": v for k, v in asdict(plan.model).items()},
        "batch_size": plan.batch_size,
        "processes": world_size,
        "training_examples": training_examples,
        "precision": plan.precision.precision,
        "learning_rate": plan.learning_rate,
        "optimizer": plan.recipe.optimizer,
        "muon_learning_rate": plan.recipe.muon_learning_rate,
        "schedule": plan.recipe.schedule,
        "decay_fraction": plan.recipe.decay_fraction,
    }


class Trainer:
    def __init__(
        self,
        plan: RunPlan,
        train_windows: Windows,
        validation_windows: Windows | None = None,
        *,
        world: World | None = None,
        tokenizer: str | Path | None = None,
        directory: str | Path | None = None,
    ):
        cfg = plan.config.train
        self.plan, self.config, self.device = plan, plan.config, plan.device
        # Peak memory from here on: weights, optimizer state and activations, not the Python runtime.
        self.memory = plan.device.peak_memory()
        self.world = world or World()
        self.directory = Path(directory or cfg.checkpoint_directory)
        self.tokenizer = str(tokenizer or "")
        self.validation_windows = validation_windows
        self.cursor = DataCursor(
            train_windows,
            plan.batch_size,
            plan.config.seed,
            self.world,
            plan.workers,
            pin_memory=self.device.pin_memory,
            context=self.device.worker_context,
        )
        self.planned_steps = optimizer_steps(len(train_windows), self.cursor.global_batch, cfg.grad_accum, cfg.epochs)
        recipe = plan.recipe
        self.schedule = make_schedule(
            plan.learning_rate,
            self.planned_steps,
            cfg.warmup_steps,
            cfg.min_learning_rate_ratio,
            recipe.schedule,
            recipe.decay_fraction,
        )
        self.signature = run_signature(plan, self.world.size, len(train_windows))
        self.scaler = grad_scaler(plan.precision, self.device)
        self.tokens_per_step = plan.tokens_per_step * self.world.size
        self.step_count, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self.learning_rate = self.schedule.rate(0)
        self.resumed_from: int | None = None
        self._saving: BackgroundSave | None = None
        self._host_state: dict | None = None  # the last save's host copy (background_save.host_copy)
        # This run's sizes beside the plan's facts: the startup line and the run log both show them.
        self.sizes = {
            "processes": self.world.size,
            "global_batch_size": plan.batch_size * cfg.grad_accum * self.world.size,
            "tokens_per_step": self.tokens_per_step,
            "planned_steps": self.planned_steps,
            "warmup_steps": self.schedule.warmup_steps,
            "decay_steps": self.schedule.decay_steps,
            "epochs": cfg.epochs,
            "training_examples": len(train_windows),
            "validation_examples": len(validation_windows or ()),
            "validation_windows_available": validation_windows.available if validation_windows is not None else None,
            "checkpoint_directory": str(self.directory),
            "tokenizer": self.tokenizer,
        }
        self.log = RunLog(self.world, plan.tokens_per_step, {**facts(plan), **self.sizes}, plan.cores)
        self.model = build_model(plan.model, self.device.device, seed=plan.config.seed)
        self.model.gradient_checkpointing = cfg.gradient_checkpointing
        self.model.loss_chunk_rows = plan.loss.chunk_rows
        self.model.attention = plan.attention.kernel
        self.optimizer = plan_optimizers(self.model, plan)
        self.ddp = None
        if self.world.distributed:
            self.ddp = DistributedDataParallel(self.model, device_ids=self.device.ddp_device_ids)
        module = self.ddp or self.model
        # The compiled wrapper is used for steps only; checkpoints come from the raw module.
        self.forward = torch.compile(module) if plan.compile.enabled else module

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the mean loss of this process's micro-batches as a detached 0-d
        tensor on the device, without waiting for it: reading it makes the host wait for the device, so
        the run loop reads losses only when it logs (read_losses averages them over processes then)."""
        self.learning_rate = self.schedule.rate(self.step_count)  # AdamW's: the log's column
        factor = self.schedule.factor(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = group["peak_lr"] * factor
        accum = self.config.train.grad_accum
        total = None  # the loss summed on the device: reading it would make the host wait
        for micro in range(accum):
            inputs, targets = self.device.put_pair(self.cursor.next())
            # Gradients are averaged across processes once per step, on the last micro-batch.
            sync = self.ddp is None or micro == accum - 1
            with nullcontext() if sync else self.ddp.no_sync():
                with autocast(self.plan.precision, self.device):
                    _, loss = self.forward(inputs, targets)
                self.scaler.scale(loss / accum).backward()
            total = loss.detach() if total is None else total + loss.detach()
        loss = total / accum
        if self.config.train.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.train.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.device.end_step()  # XLA: one graph per optimizer step
        self.step_count += 1
        self.tokens_seen += self.tokens_per_step
        return loss

    def read_losses(self, losses: list[torch.Tensor], stop: bool = False) -> tuple[list[float], bool]:
        """The last len(losses) steps' losses (averaged over processes) and whether any process asked to
        `stop`, in one collective and one sync; a non-finite loss stops every process at the first step
        it happened (read before each checkpoint: none holds a later step)."""
        stacked = torch.stack(losses) if losses else torch.zeros(0)
        values, stop = distributed.mean_and_any(self.world, stacked, stop)
        for offset, value in enumerate(values):
            if not math.isfinite(value):
                raise NonFiniteLoss(self.step_count - len(values) + offset + 1, value)
        return values, stop

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per token over the validation examples (each process takes every size-th batch)."""
        self.model.eval()
        total, count = 0.0, 0
        try:
            batches = sequential_batches(self.validation_windows, self.plan.batch_size)
            for batch in islice(batches, self.world.rank, None, self.world.size):
                inputs, targets = self.device.put(*batch)
                with autocast(self.plan.precision, self.device):
                    _, loss = self.model(inputs, targets)
                total += loss.detach().float() * inputs.shape[0]  # read once, after the loop: no sync per batch
                count += inputs.shape[0]
        finally:
            self.model.train()
        total, count = distributed.all_sum(self.world, [float(total), count])
        return total / count

    def state(self) -> dict:
        return {
            "format": 1,
            "step": self.step_count,
            "tokens_seen": self.tokens_seen,
            "train_seconds": self.train_seconds,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "schedule": asdict(self.schedule),
            "cursor": self.cursor.state(),
            "rng": rng_state(),
            "signature": self.signature,
            "model_config": asdict(self.plan.model),
            checkpoint.GELU: checkpoint.GELU_EXACT,
            "config": config_to_dict(self.config),
            "tokenizer": self.tokenizer,
            "device": self.device.device,
            "precision": self.plan.precision.precision,
            "log": list(self.log.rows),
            "elapsed_seconds": self.log.elapsed(),
        }

    def load_state(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step_count, self.tokens_seen = state["step"], state["tokens_seen"]
        self.train_seconds = state["train_seconds"]
        self.cursor.load(state["cursor"])
        # A checkpoint from before elapsed_seconds was kept: its step time is the nearest record.
        self.log.restore(state.get("log", []), self.step_count, state.get("elapsed_seconds", self.train_seconds))
        self.learning_rate = self.schedule.rate(max(0, self.step_count - 1))
        set_rng_state(state["rng"])

    def save_checkpoint(self, wait: bool = True) -> tuple[float, int]:
        """Save this step's state: (seconds, bytes) of the write. wait=False writes a host copy of it in
        the background (train/background_save.py) and returns (0.0, 0); wait_for_save() ends it."""
        if not self.world.is_main:
            return 0.0, 0
        self.wait_for_save()  # one save at a time, in step order
        # Into the last save's copy, kept for the next: one host copy for the whole run.
        self._host_state = state = host_copy(self.state(), into=self._host_state)
        keep = self.config.train.keep_checkpoints
        self._saving = BackgroundSave(lambda: checkpoint.save(self.directory, state, keep))
        return self.wait_for_save() if wait else (0.0, 0)

    def wait_for_save(self) -> tuple[float, int]:
        """Wait for the save under way, if any: its (seconds, bytes), or its error (a full disk) raised here."""
        saving, self._saving = self._saving, None
        if saving is None:
            return 0.0, 0
        seconds, size, _ = saving.join()
        self.log.saves.append((seconds, size))
        return seconds, size
