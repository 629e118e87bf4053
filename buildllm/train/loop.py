"""The training run around the Trainer: `buildllm train` and the DVC train stage.

The stop rules: a non-finite loss or out-of-memory stops with the last good checkpoint kept; Ctrl-C
(or SIGTERM) saves and exits.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from dataclasses import replace

import torch
from tqdm import tqdm

from buildllm.config import Config
from buildllm.data.text_bytes import validation_bytes
from buildllm.data.tokenization import load_tokenizer
from buildllm.data.windows import Windows, load_windows
from buildllm.device.oom import OutOfMemory, advice, describe_memory, out_of_memory
from buildllm.disk import DiskFull, probe_writable
from buildllm.errors import TrainingFailed, UserError
from buildllm.paths import tokenizer_path
from buildllm.plan.memory import refuse_unless_fits
from buildllm.plan.run_plan import announce, apply_plan, make_plan
from buildllm.train import checkpoint, distributed, run_log, storage
from buildllm.train.trainer import NonFiniteLoss, Trainer, TrainingInterrupted

# The train stage starts over under DVC (its outputs are persist: the stage clears them itself).
RESUME_UNDER_DVC = (
    "`dvc repro train` would start over; to continue this run, run `buildllm train` with the same "
    "params.yaml, then `dvc commit train` to record its outputs"
)


def train(config: Config, under_dvc: bool = False) -> dict:
    """`buildllm train` and the DVC train stage (under_dvc, set by stages/train.py): returns the
    metrics written to metrics/train.json."""
    plan = make_plan(config)
    refuse_unless_fits(plan)  # before a process group, a checkpoint folder or a tensor exists
    checkpoint.refuse_a_file(config.train.checkpoint_directory)
    # Missing or unfit data files stop the run here, in one line, before any process group exists; a
    # tokenizer made for another vocabulary too (a run may go without one: its path is recorded).
    vocab = plan.model.vocab_size
    tokenizer = tokenizer_path(config, vocab)
    train_windows, validation_windows = load_windows(config, plan.model)
    encoder = load_tokenizer(tokenizer, vocab) if tokenizer.exists() or config.train.tokenizer else None
    world, device = distributed.start(plan.device)
    plan = replace(plan, device=device)
    together = False
    try:
        apply_plan(plan)
        trainer = None
        try:
            trainer = Trainer(plan, train_windows, validation_windows, world=world, tokenizer=tokenizer)
        except (RuntimeError, MemoryError) as exc:
            if not out_of_memory(exc):
                raise
        if trainer is None:  # raised outside the except clause, whose traceback holds what was built
            raise OutOfMemory(
                f"{plan.device.device} ran out of memory building the model and optimizer; {advice(plan.batch_size)}"
            )
        trainer.log.facts["unigram_validation_loss"] = unigram_loss(train_windows, validation_windows, vocab)
        trainer.log.facts.update(validation_bytes(encoder, validation_windows))
        # Only rank 0 writes, so only rank 0 locks; every rank follows its resume decision.
        lock = checkpoint.DirectoryLock(trainer.directory)
        decision = None
        if world.is_main:
            try:
                lock.acquire()
                resumed = (
                    None
                    if under_dvc
                    else checkpoint.state_to_resume(
                        trainer.directory, trainer.signature, config.train.resume, config.train.force
                    )
                )
                storage.before_training(trainer, resumed)  # refuses a run its disk cannot hold
                for folder in run_log.FOLDERS:  # a read-only metrics/ stops the run now, not after training
                    probe_writable(folder)
                if under_dvc:  # a new run, as before; what the directory holds goes only once every check passed
                    checkpoint.start_over(trainer.directory, config.train.resume)
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
            metrics = run(trainer, RESUME_UNDER_DVC if under_dvc else "run the same command again to resume")
        finally:
            with contextlib.suppress(Exception):  # a save's own error has been raised already, or is moot
                trainer.wait_for_save()  # the lock is held until the last write ends
            lock.release()
    except BaseException as exc:
        # Out of memory (or a full disk, rank 0's save) strikes one rank; the others never reach a barrier.
        distributed.stop(
            world, clean=together and isinstance(exc, UserError) and not isinstance(exc, (OutOfMemory, DiskFull))
        )
        raise
    distributed.stop(world)
    return metrics


def run(trainer: Trainer, advice_on_stop: str) -> dict:
    cfg, world, device = trainer.config.train, trainer.world, trainer.device
    if world.is_main:
        announce("train", trainer.plan, **trainer.sizes, start_step=trainer.step_count)
        if note := trainer.validation_windows.cap_note("train.validation_examples"):
            print(f"note: {note}", file=sys.stderr)
    trainer.log.begin()
    # tqdm's own rate would count validation and checkpoint time as step time; the ETA is ours.
    bar = tqdm(
        total=trainer.planned_steps,
        initial=trainer.step_count,
        unit="step",
        file=sys.stderr,
        disable=not world.is_main,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )
    shown = {"eta": "?"}
    ran_out, pending = False, []
    with StopRequest() as stop, bar:
        try:
            if trainer.step_count == 0:
                record(trainer, trainer.evaluate())  # the untrained model's loss: where the curve starts
            mark = device.timed()
            while trainer.step_count < trainer.planned_steps:
                pending.append(trainer.step())
                step, last = trainer.step_count, trainer.step_count == trainer.planned_steps
                evaluate = last or (cfg.eval_interval > 0 and step % cfg.eval_interval == 0)
                log = evaluate or step % cfg.log_interval == 0
                save = not last and cfg.checkpoint_interval > 0 and step % cfg.checkpoint_interval == 0
                # Alone, a stop request ends the run after this step; under torchrun the ranks agree on it
                # where they read losses (log rows, saves): no collective or sync between, one stop step.
                if not (log or save or (stop.requested and not world.distributed)):
                    bar.update(1)
                    continue  # no host-device sync between log rows: the device runs ahead
                stopping = settle(trainer, pending, device.timed() - mark, stop.requested)
                # A save runs beside the steps after it until here, where the run next writes (a log
                # row): a full disk then ends the run at the save that failed, as a plain save did.
                trainer.wait_for_save()
                if log:
                    row = record(trainer, trainer.evaluate() if evaluate else None)
                    shown.update(
                        loss=f"{row['train_loss']:.3f}",
                        lr=f"{row['learning_rate']:.2e}",
                        tok_s=f"{row['tokens_per_second']:.0f}",
                    )
                # Known only where losses are read; from step time only: validation and saves are not steps.
                booked, left = trainer.log, trainer.planned_steps - step
                shown["eta"] = tqdm.format_interval(booked.seconds / booked.steps * left) if booked.steps else "?"
                bar.set_postfix(shown, refresh=False)
                bar.update(1)
                if stopping:
                    break
                if save:
                    trainer.save_checkpoint(wait=False)
                mark = device.timed()  # validation and saving are not training time
            if trainer.log.rows[-1]["validation_loss"] is None and trainer.step_count == trainer.planned_steps:
                record(trainer, trainer.evaluate())  # resumed at the very end: validate once more
        except NonFiniteLoss as exc:
            finish(trainer, "non_finite_loss", {"non_finite_step": exc.step})
            raise TrainingFailed(
                f"{exc}; {kept(trainer, weights=True)}; lower --learning-rate (or train in bf16 or fp32 instead "
                "of fp16) and rerun into a fresh --checkpoint-directory"
            ) from None
        except (RuntimeError, MemoryError) as exc:  # torch.cuda.OutOfMemoryError is one; the CPU's allocator too
            if not out_of_memory(exc):
                raise
            figures = device.oom_figures()  # before the failed step's tensors are let go
            ran_out = True
    if ran_out:
        # Out of the except clause, whose traceback held the failed step's tensors: their memory is
        # free again for writing the metrics and the plot.
        pending.clear()
        trainer.optimizer.zero_grad(set_to_none=True)
        device.release_cached_memory()
        step, batch = trainer.step_count + 1, trainer.plan.batch_size
        finish(trainer, "out_of_memory", {"oom": True, "oom_batch_size": batch, "oom_step": step, **figures})
        raise OutOfMemory(
            f"{device.device} ran out of memory at step {step} with batch size {batch} ({describe_memory(figures)}); "
            f"{advice(batch)}; {kept(trainer, weights=False)}"
        )
    trainer.save_checkpoint()
    if trainer.step_count < trainer.planned_steps:
        finish(trainer, "interrupted", {})
        raise TrainingInterrupted(
            f"stopped at step {trainer.step_count} of {trainer.planned_steps}; checkpoint "
            f"saved in {trainer.directory}; {advice_on_stop}"
        )
    return finish(trainer, "completed", {})


def record(trainer: Trainer, validation: float | None) -> dict:
    return trainer.log.record(trainer.step_count, trainer.tokens_seen, trainer.learning_rate, validation)


def settle(trainer: Trainer, pending: list, seconds: float, stop: bool) -> bool:
    """Read the losses of the steps since the last read (one sync; raises NonFiniteLoss at the first
    bad step) and book the steps with an equal share of the time they took together; returns whether
    any process asked to stop."""
    (losses, stopping), pending[:] = trainer.read_losses(pending, stop), []
    for loss in losses:
        trainer.log.add_step(loss, seconds / len(losses))
    trainer.train_seconds += seconds
    return stopping


def finish(trainer: Trainer, status: str, extra: dict) -> dict:
    trainer.wait_for_save()  # the record counts every save, and names only checkpoints that are whole
    progress = {
        "optimizer_steps": trainer.step_count,
        "tokens_processed": trainer.tokens_seen,
        "train_seconds": trainer.train_seconds,
        "resumed": trainer.resumed_from is not None,
        "resumed_from_step": trainer.resumed_from or 0,
    }
    return trainer.log.finish(status, progress, {**trainer.memory.read(), **extra})


def kept(trainer: Trainer, weights: bool) -> str:
    """The checkpoint a rerun continues from: the newest intact one (with `weights`, whose weights are
    finite too), not merely the newest file. Rank 0 alone says it, so only rank 0 reads checkpoints."""
    if not trainer.world.is_main:
        return "rank 0 names the checkpoint kept"
    saved = checkpoint.list_checkpoints(trainer.directory)
    if not saved:
        return "no checkpoint had been saved yet"
    good = checkpoint.last_good(trainer.directory, weights)
    if good is None:
        return f"none of the {len(saved)} checkpoint(s) in {trainer.directory} is intact (each is named above)"
    return f"the last good checkpoint, {good.name}, is kept in {trainer.directory}"


def unigram_loss(train: Windows, validation: Windows, vocab_size: int) -> float:
    """The unigram level, the bar a model must clear to show it uses context: the validation loss (nats per
    token) of predicting every token by its frequency in the training examples (add-one smoothed, so no
    validation token has zero probability)."""
    used = train.tokens[: len(train) * train.sequence_length + 1]
    counts = torch.bincount(used.to(torch.int64), minlength=vocab_size).double() + 1.0
    log_p = (counts / counts.sum()).log()
    # Window i's targets are tokens i*L+1 .. i*L+L: together, tokens 1 .. n*L.
    targets = validation.tokens[1 : len(validation) * validation.sequence_length + 1].to(torch.int64)
    return float(-log_p[targets].mean())


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop after the current step, so the checkpoint it saves is
    a whole step's state."""

    def __init__(self):
        self.requested, self.interrupted, self._previous = False, False, {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        # Only a second Ctrl-C stops at once: torchrun follows a terminal's Ctrl-C with its own SIGTERM.
        if self.interrupted and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            print("\nstopping after this step to save a checkpoint (Ctrl-C again stops at once)", file=sys.stderr)
        self.requested = True
        self.interrupted |= signum == signal.SIGINT

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
