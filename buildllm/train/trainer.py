"""Training: the Trainer, which owns everything one optimizer step touches, and the run around it.

Trainer.step() is one optimizer step: grad_accum micro-batches drawn from a resumable data cursor,
each under autocast, gradients scaled for fp16, averaged across processes only on the last
micro-batch, clipped, then AdamW at the schedule's learning rate. The benchmark times this same
method. Trainer.state() is everything a bitwise-exact resume needs.

train(config) is the loop around it: validation every eval_interval steps, a log row every
log_interval steps, checkpoints every checkpoint_interval steps, and the stop rules: a non-finite
loss or out-of-memory stops with the last good checkpoint kept; Ctrl-C (or SIGTERM) saves and exits.
"""

from __future__ import annotations

import math
import sys
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from buildllm.train import checkpoint
from buildllm.train.stop import StopRequest
from buildllm.train import distributed
from buildllm.train import storage
from buildllm.config import Config, config_to_dict, knobs, value_at
from buildllm.data.windows import Windows, batches_per_epoch, load_windows, loader, sequential_batches
from buildllm.train.distributed import World
from buildllm.disk import DiskFull
from buildllm.errors import TrainingFailed, UserError
from buildllm.model.gpt import build_model
from buildllm.device.oom import OutOfMemory, advice, describe_memory, out_of_memory
from buildllm.device.rng import rng_state, seed_all, set_rng_state
from buildllm.optimizer import build_optimizer
from buildllm.paths import tokenizer_path
from buildllm.plan import RunPlan, announce, apply_plan, facts, make_plan
from buildllm.train.run_log import RunLog
from buildllm.device.precision import autocast, grad_scaler
from buildllm.device.xla import step_boundary
from buildllm.train.schedule import make_schedule
from buildllm.data.windows import optimizer_steps
from buildllm.train.unigram import unigram_loss
from buildllm.data.tokenization import load_tokenizer


class NonFiniteLoss(TrainingFailed):
    def __init__(self, step: int, loss: float):
        super().__init__(f"training loss became {loss} at step {step}")
        self.step, self.loss = step, loss


class TrainingInterrupted(TrainingFailed):
    exit_code = 130


class DataCursor:
    """Micro-batches in the deterministic epoch order, from a position a checkpoint can restore."""

    def __init__(self, windows: Windows, batch_size: int, seed: int, world: World, workers: int = 0,
                 pin_memory: bool = False):
        self.windows, self.batch_size, self.seed, self.world = windows, batch_size, seed, world
        self.workers, self.pin_memory = workers, pin_memory
        self.global_batch = batch_size * world.size
        self.batches_per_epoch = batches_per_epoch(len(windows), self.global_batch)
        if self.batches_per_epoch < 1:
            raise UserError(f"{len(windows)} training examples are fewer than one batch of {self.global_batch} "
                            "(batch_size x processes); raise --training-examples or lower --batch-size")
        self.epoch, self.batch, self._batches = 0, 0, None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch >= self.batches_per_epoch:
            self.epoch, self.batch, self._batches = self.epoch + 1, 0, None
        if self._batches is None:
            self._batches = loader(self.windows, self.batch_size, self.seed, self.epoch, self.batch, self.world.rank,
                                   self.world.size, self.workers, self.pin_memory)
        index, inputs, targets = next(self._batches)
        self.batch = index + 1
        return inputs, targets

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
    return {**declared, "profile": plan.profile.name, **{f"model.{k}": v for k, v in asdict(plan.model).items()},
            "batch_size": plan.batch_size, "processes": world_size, "training_examples": training_examples,
            "precision": plan.precision.precision, "learning_rate": plan.learning_rate}


class Trainer:
    def __init__(self, plan: RunPlan, train_windows: Windows, validation_windows: Windows | None = None, *,
                 world: World | None = None, tokenizer: str | Path | None = None, directory: str | Path | None = None):
        cfg = plan.config.train
        self.plan, self.config, self.device = plan, plan.config, plan.device
        # Peak memory from here on: weights, optimizer state and activations, not the Python runtime.
        self.memory = plan.device.peak_memory()
        self.world = world or World()
        self.directory = Path(directory or cfg.checkpoint_directory)
        self.tokenizer = str(tokenizer or "")
        self.train_windows, self.validation_windows = train_windows, validation_windows
        self.cursor = DataCursor(train_windows, plan.batch_size, plan.config.seed, self.world, plan.workers,
                                 pin_memory=self.device.pin_memory)
        self.planned_steps = optimizer_steps(len(train_windows), self.cursor.global_batch, cfg.grad_accum, cfg.epochs)
        self.schedule = make_schedule(plan.learning_rate, self.planned_steps, cfg.warmup_steps,
                                      cfg.min_learning_rate_ratio)
        # The same initial weights and random draws whoever builds the trainer, and in every process.
        seed_all(plan.config.seed)
        self.model = build_model(plan.model, self.device.device)
        self.model.gradient_checkpointing = cfg.gradient_checkpointing
        self.optimizer = build_optimizer(self.model, plan.learning_rate, cfg.weight_decay, plan.fused_adamw)
        self.scaler = grad_scaler(plan.precision, self.device)
        self.ddp = None
        if self.world.distributed:
            self.ddp = DistributedDataParallel(self.model, device_ids=self.device.ddp_device_ids)
        module = self.ddp or self.model
        # The compiled wrapper is used for steps only; checkpoints come from the raw module.
        self.forward = torch.compile(module) if plan.compile.enabled else module
        self.signature = run_signature(plan, self.world.size, len(train_windows))
        self.tokens_per_step = plan.tokens_per_step * self.world.size
        self.step_count, self.tokens_seen, self.train_seconds = 0, 0, 0.0
        self.learning_rate = self.schedule.rate(0)
        self.resumed_from: int | None = None
        self.log = RunLog(self.world, plan.tokens_per_step, {
            **facts(plan), "processes": self.world.size,
            "global_batch_size": plan.batch_size * cfg.grad_accum * self.world.size,
            "tokens_per_step": self.tokens_per_step, "planned_steps": self.planned_steps,
            "warmup_steps": self.schedule.warmup_steps, "epochs": cfg.epochs, "training_examples": len(train_windows),
            "validation_examples": len(validation_windows or ()),
            "validation_windows_available": validation_windows.available if validation_windows is not None else None,
            "checkpoint_directory": str(self.directory),
            "tokenizer": self.tokenizer})

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the mean loss of its micro-batches (over all processes) as a
        detached 0-d tensor on the device, without waiting for it: reading it (float(), .item()) makes
        the host wait for the device, so the run loop reads losses only when it logs (read_losses)."""
        self.learning_rate = self.schedule.rate(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate
        accum = self.config.train.grad_accum
        total = None  # the loss summed on the device: reading it would make the host wait
        for micro in range(accum):
            inputs, targets = self.device.put(*self.cursor.next(), pin=True)
            # Gradients are averaged across processes once per step, on the last micro-batch.
            sync = self.ddp is None or micro == accum - 1
            with nullcontext() if sync else self.ddp.no_sync():
                with autocast(self.plan.precision, self.device):
                    _, loss = self.forward(inputs, targets)
                self.scaler.scale(loss / accum).backward()
            total = loss.detach() if total is None else total + loss.detach()
        loss = distributed.all_mean_(self.world, total / accum)
        if self.config.train.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.train.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        step_boundary(self.device)  # XLA: one graph per optimizer step
        self.step_count += 1
        self.tokens_seen += self.tokens_per_step
        return loss

    def read_losses(self, losses: list[torch.Tensor]) -> list[float]:
        """The last len(losses) steps' losses as floats, in one device sync; a non-finite one stops
        training at the first step it happened (read before each checkpoint: none holds a later step)."""
        if not losses:
            return []
        values = torch.stack(losses).tolist()
        for offset, value in enumerate(values):
            if not math.isfinite(value):
                raise NonFiniteLoss(self.step_count - len(values) + offset + 1, value)
        return values

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per token over the validation examples (each process takes every size-th batch)."""
        if self.validation_windows is None:
            raise ValueError("this trainer was built without validation examples")
        self.model.eval()
        total, count = 0.0, 0
        try:
            for index, batch in enumerate(sequential_batches(self.validation_windows, self.plan.batch_size)):
                if index % self.world.size != self.world.rank:
                    continue
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
            "format": 1, "step": self.step_count, "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "schedule": asdict(self.schedule), "cursor": self.cursor.state(),
            "rng": rng_state(), "signature": self.signature, "model_config": asdict(self.plan.model),
            "config": config_to_dict(self.config), "tokenizer": self.tokenizer, "device": self.device.device,
            "precision": self.plan.precision.precision, "log": list(self.log.rows),
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

    def save_checkpoint(self) -> tuple[float, int]:
        """Write a checkpoint atomically (rank 0 only); returns (seconds, bytes)."""
        if not self.world.is_main:
            return 0.0, 0
        seconds, size, _ = checkpoint.save(self.directory, self.state(), self.config.train.keep_checkpoints)
        self.log.add_save(seconds, size)
        return seconds, size


def train(config: Config, under_dvc: bool = False) -> dict:
    """`buildllm train` and the DVC train stage (under_dvc, set by stages/train.py): returns the
    metrics written to metrics/train.json."""
    plan = make_plan(config)
    world, device = distributed.start(plan.device)
    plan = replace(plan, device=device)
    together = False
    try:
        apply_plan(plan)
        train_windows, validation_windows = load_windows(config, plan.model)
        tokenizer = tokenizer_path(config, plan.model.vocab_size)
        if tokenizer.exists() or config.train.tokenizer:
            load_tokenizer(tokenizer, plan.model.vocab_size)  # refuses a tokenizer made for another vocabulary
        directory = Path(config.train.checkpoint_directory)
        trainer = Trainer(plan, train_windows, validation_windows, world=world,
                          tokenizer=tokenizer, directory=directory)
        # The best a model that ignores context can do: the bar the validation loss must clear.
        trainer.log.facts["unigram_validation_loss"] = unigram_loss(train_windows, validation_windows,
                                                                    plan.model.vocab_size)
        # Only rank 0 writes, so only rank 0 locks; every rank follows its resume decision.
        lock = checkpoint.DirectoryLock(directory)
        decision = None
        if world.is_main:
            try:
                lock.acquire()
                resumed = checkpoint.state_to_resume(directory, trainer.signature, config.train.resume,
                                                     config.train.force)
                storage.before_training(trainer, resumed)  # refuses a run its disk cannot hold
                decision = ("state", resumed)
            except UserError as exc:
                decision = ("error", str(exc))
        kind, value = distributed.from_main(world, decision)
        together = True  # from here on, every rank stops at the same step for the same reason
        try:
            if kind == "error":
                raise UserError(value)
            if value is not None:
                trainer.load_state(value)
                trainer.resumed_from = value["step"]
            metrics = run(trainer, resume_advice(under_dvc))
        finally:
            lock.release()
    except BaseException as exc:
        # Out of memory (or a full disk, rank 0's save) strikes one rank; the others never reach a barrier.
        distributed.stop(world, clean=together and isinstance(exc, UserError)
                         and not isinstance(exc, (OutOfMemory, DiskFull)))
        raise
    distributed.stop(world)
    return metrics


def resume_advice(under_dvc: bool) -> str:
    if under_dvc:  # DVC deletes a stage's outputs before it runs: `dvc repro train` would start over
        return ("`dvc repro train` would start over; to continue this run, run `buildllm train` with the same "
                "params.yaml, then `dvc commit train` to record its outputs")
    return "run the same command again to resume"


def eta(log: RunLog, remaining: int) -> str:
    """Remaining time from measured step time only: validation passes and checkpoint saves are not steps."""
    return tqdm.format_interval(log.seconds / log.steps * remaining) if log.steps else "?"


def run(trainer: Trainer, advice_on_stop: str = "run the same command again to resume") -> dict:
    """Train to the planned step; validate, log, checkpoint on the way; write the metrics."""
    cfg, world, device = trainer.config.train, trainer.world, trainer.device
    if world.is_main:
        announce("train", trainer.plan, planned_steps=trainer.planned_steps, start_step=trainer.step_count,
                 epochs=cfg.epochs, training_examples=len(trainer.train_windows),
                 validation_examples=len(trainer.validation_windows),
                 validation_windows_available=trainer.validation_windows.available, processes=world.size,
                 tokens_per_step=trainer.tokens_per_step, checkpoint_directory=str(trainer.directory))
        if note := trainer.validation_windows.cap_note("train.validation_examples"):
            print(f"note: {note}", file=sys.stderr)
    trainer.log.begin()
    # tqdm's own rate would count validation and checkpoint time as step time; the ETA is ours.
    bar = tqdm(total=trainer.planned_steps, initial=trainer.step_count, unit="step", file=sys.stderr,
               disable=not world.is_main, dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")
    shown = {"eta": "?"}
    with StopRequest() as stop, bar:
        try:
            if trainer.step_count == 0:
                record(trainer, trainer.evaluate())  # the untrained model's loss: where the curve starts
            pending, mark = [], device.timed()
            while trainer.step_count < trainer.planned_steps:
                pending.append(trainer.step())
                step, last = trainer.step_count, trainer.step_count == trainer.planned_steps
                evaluate = last or (cfg.eval_interval > 0 and step % cfg.eval_interval == 0)
                log = evaluate or step % cfg.log_interval == 0
                save = not last and cfg.checkpoint_interval > 0 and step % cfg.checkpoint_interval == 0
                stopping = distributed.any_rank(world, stop.requested)
                if not (log or save or stopping):
                    bar.update(1)
                    continue  # no host-device sync between log rows: the device runs ahead
                settle(trainer, pending, device.timed() - mark)
                if log:
                    row = record(trainer, trainer.evaluate() if evaluate else None)
                    shown.update(loss=f"{row['train_loss']:.3f}", lr=f"{row['learning_rate']:.2e}",
                                 tok_s=f"{row['tokens_per_second']:.0f}")
                shown["eta"] = eta(trainer.log, trainer.planned_steps - step)  # known only where losses are read
                bar.set_postfix(shown, refresh=False)
                bar.update(1)
                if stopping:
                    break
                if save:
                    trainer.save_checkpoint()
                mark = device.timed()  # validation and saving are not training time
            if trainer.log.rows[-1]["validation_loss"] is None and trainer.step_count == trainer.planned_steps:
                record(trainer, trainer.evaluate())  # resumed at the very end: validate once more
        except NonFiniteLoss as exc:
            finish(trainer, "non_finite_loss", {"non_finite_step": exc.step})
            raise TrainingFailed(f"{exc}; {kept(trainer)}; lower --learning-rate (or train in bf16 or fp32 instead "
                                 "of fp16) and rerun into a fresh --checkpoint-directory") from None
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
            if not out_of_memory(exc):
                raise
            figures = device.oom_figures()
            finish(trainer, "out_of_memory", {"oom": True, "oom_batch_size": trainer.plan.batch_size,
                                              "oom_step": trainer.step_count + 1, **figures})
            raise OutOfMemory(
                f"{device.device} ran out of memory at step {trainer.step_count + 1} with batch size "
                f"{trainer.plan.batch_size} ({describe_memory(figures)}); {advice(trainer.plan.batch_size)}; "
                f"{kept(trainer)}") from None
    trainer.save_checkpoint()
    if trainer.step_count < trainer.planned_steps:
        finish(trainer, "interrupted", {})
        raise TrainingInterrupted(f"stopped at step {trainer.step_count} of {trainer.planned_steps}; checkpoint "
                                  f"saved in {trainer.directory}; {advice_on_stop}")
    return finish(trainer, "completed", {})


def record(trainer: Trainer, validation: float | None) -> dict:
    """A log row for the steps since the last one, with `validation` loss if one was measured."""
    return trainer.log.record(trainer.step_count, trainer.tokens_seen, trainer.learning_rate, validation)


def settle(trainer: Trainer, pending: list, seconds: float) -> None:
    """Read the losses of the steps since the last read (one sync; raises NonFiniteLoss at the first
    bad step) and book the steps with an equal share of the time they took together."""
    losses, pending[:] = trainer.read_losses(pending), []
    for loss in losses:
        trainer.log.add_step(loss, seconds / len(losses))
    trainer.train_seconds += seconds


def finish(trainer: Trainer, status: str, extra: dict) -> dict:
    """Write metrics/train.json, the plot file and the PNG (rank 0); print the summary."""
    progress = {"optimizer_steps": trainer.step_count, "tokens_processed": trainer.tokens_seen,
                "train_seconds": trainer.train_seconds, "resumed": trainer.resumed_from is not None,
                "resumed_from_step": trainer.resumed_from or 0}
    return trainer.log.finish(status, progress, {**trainer.memory.read(), **extra})


def kept(trainer: Trainer) -> str:
    saved = checkpoint.list_checkpoints(trainer.directory)
    if not saved:
        return "no checkpoint had been saved yet"
    return f"the last good checkpoint, {saved[-1].name}, is kept in {trainer.directory}"
