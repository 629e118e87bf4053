"""The fused loss's chunk size is the plan's decision: cache-sized on the CPU, a few large chunks on a
GPU (here a simulated 141 GiB one: only CUDA's availability and memory queries are stood in for),
read by the model, the facts and the memory estimate, never decided again below the plan."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from buildllm.config import load_config
from buildllm.data.windows import Windows, load_tokens
from buildllm.device.device import Device
from buildllm.memory.estimate import FP32, plan_memory
from buildllm.model.fused_loss import chunk_bytes_per_row
from buildllm.plan import run_plan
from buildllm.plan.loss_chunk import CPU_CHUNK_BYTES, DEVICE_MEMORY_SHARE, MIN_ROWS, ROW_MULTIPLE, decide_loss
from buildllm.plan.run_plan import facts, make_plan
from buildllm.train.trainer import Trainer

GIB = 2**30
# Each micro-batch of gpt_100m on a 141 GiB GPU runs at most this many loss chunks up to batch 128,
# where the CPU's cache-sized chunks (128 rows at vocabulary 16384) would run 1024.
MOST_CHUNKS = 8


@pytest.fixture
def gpu_141_gib(monkeypatch):
    """A CUDA device of 141 GiB as torch reports one: what this CPU machine cannot have. Fused AdamW
    is probed by allocating on the device, so its probe answers as a CUDA build does."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index=0: SimpleNamespace(name="NVIDIA H200", total_memory=141 * GIB, major=9, minor=0),
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=0: (140 * GIB, 141 * GIB))
    monkeypatch.setattr(run_plan, "fused_adamw_support", lambda device: (True, f"fused AdamW builds on {device}"))


def gpt_100m_plan(**settings):
    return make_plan(load_config(None, {"iteration": 3, "device": "cuda", **settings}), training_examples=100_000)


def test_gpt_100m_on_a_141_gib_gpu_runs_a_few_large_chunks_per_micro_batch(gpu_141_gib):
    plan = gpt_100m_plan()
    assert plan.device.kind == "cuda" and plan.precision.precision == "bf16" and plan.batch_size == 16
    # At the profile's GPU batch every row fits the budget: one chunk, as the plain loss.
    assert (plan.loss.chunk_rows, plan.loss.chunks) == (16 * 1024, 1)
    assert plan.loss.reason.startswith("one chunk of 16384 rows")
    budget = 141 * GIB * DEVICE_MEMORY_SHARE
    for batch in (32, 64, 128):
        for precision in ("bf16", "fp32"):
            loss = gpt_100m_plan(**{"train.batch_size": batch, "precision": precision}).loss
            rows, per_row = batch * 1024, chunk_bytes_per_row(16384, 2 if precision == "bf16" else 4)
            assert loss.rows == rows and loss.chunks <= MOST_CHUNKS, loss.reason
            assert loss.chunk_rows >= MIN_ROWS and loss.chunk_rows * per_row <= budget, loss.reason
            assert loss.chunk_rows == rows or loss.chunk_rows % ROW_MULTIPLE == 0
    # The figure: batch 64 in bf16, 512 cache-sized chunks per micro-batch before.
    at_64 = gpt_100m_plan(**{"train.batch_size": 64}).loss
    assert at_64.chunks == 3 and at_64.chunk_rows == 23 * ROW_MULTIPLE
    assert decide_loss(16384, 64 * 1024, 2, Device("cpu", "cpu", "cpu", "test")).chunks == 512


def test_the_plan_records_the_decision_and_the_memory_estimate_uses_its_chunk(gpu_141_gib):
    for batch in (16, 64):
        plan = gpt_100m_plan(**{"train.batch_size": batch})
        record = facts(plan)
        assert plan.decisions["loss"] == plan.loss.reason == record["loss_reason"]
        assert (record["loss_chunk_rows"], record["loss_chunks"]) == (plan.loss.chunk_rows, plan.loss.chunks)
        model = plan.model
        # The chunk's buffers and the weight gradient the fused loss keeps until backward.
        expected = (
            plan.loss.chunk_rows * chunk_bytes_per_row(model.vocab_size, 2) + model.vocab_size * model.n_embd * FP32
        )
        assert plan_memory(plan).logits == expected


def test_a_gpu_too_small_for_the_floor_keeps_the_floor_and_says_so():
    gpu = Device("cuda", "cuda:0", "cuda", "test")
    loss = decide_loss(16384, 64 * 1024, 2, gpu, capacity=8 * GIB)
    # 1/32 of 8 GiB holds 1365 rows of vocabulary 16384 in bf16: fewer than the floor.
    assert loss.chunk_rows == MIN_ROWS and loss.chunks == 16
    assert "floor" in loss.reason and "past the budget" in loss.reason


def test_a_measured_chunk_size_is_preferred():
    gpu = Device("cuda", "cuda:0", "cuda", "test")
    loss = decide_loss(16384, 64 * 1024, 2, gpu, capacity=141 * GIB, measured_rows=8192)
    assert (loss.chunk_rows, loss.chunks) == (8192, 8) and "measured" in loss.reason
    # Never more than one micro-batch: a measurement at a larger batch means one chunk here.
    assert decide_loss(16384, 4096, 2, gpu, capacity=141 * GIB, measured_rows=65536).chunk_rows == 4096


def test_the_cpu_keeps_its_cache_sized_chunks_and_the_trainer_hands_them_to_the_model(tokens):
    plan = make_plan(
        load_config(None, {"device": "cpu", "preset": "tiny", "train.batch_size": 4}), training_examples=64
    )
    rows = 4 * plan.model.sequence_length
    assert plan.loss.chunk_rows == min(rows, CPU_CHUNK_BYTES // (4 * plan.model.vocab_size))
    assert "cache" in plan.loss.reason and plan.loss.chunks == -(-rows // plan.loss.chunk_rows)
    trainer = Trainer(
        plan,
        Windows(load_tokens(tokens["train"]), plan.model.sequence_length, 64),
        directory=tokens["train"].parent / "unused",
    )
    assert trainer.model.loss_chunk_rows == plan.loss.chunk_rows
