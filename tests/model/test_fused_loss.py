"""The fused, chunked output layer + cross-entropy equals the plain computation: loss and gradients,
both architectures, fp32 and bf16 autocast, with several chunks and a ragged last chunk."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from buildllm.device.device import Device
from buildllm.model.fused_loss import linear_cross_entropy, plain_linear_cross_entropy
from buildllm.model.gpt import GPTConfig, build_model
from buildllm.plan.loss_chunk import MIN_ROWS, decide_loss

# bf16 rounds logits and gradients to 8 bits of mantissa; the fused path rounds the weight
# gradient per chunk where the plain graph rounds it once, so bf16 agrees to bf16's precision.
TOLERANCE = {"fp32": dict(rtol=1e-5, atol=1e-6), "bf16": dict(rtol=1e-2, atol=1e-3)}


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


# 100 rows x vocabulary 96 in chunks of 21 rows: five chunks, the last one ragged.
SMALL_CHUNKS = 21


def fused_against_plain(rows: int, vocab: int, chunk_rows: int, precision: str, width: int = 32):
    """Loss and gradients of both computations on the same seeded inputs: (plain, fused), each
    (loss, input gradient, weight gradient)."""
    torch.manual_seed(0)
    x = torch.randn(rows, width, requires_grad=True)
    weight = (torch.randn(vocab, width) * 0.5).requires_grad_()
    targets = torch.randint(0, vocab, (rows,))
    results = []
    for loss_fn in (plain_linear_cross_entropy, partial(linear_cross_entropy, chunk_rows=chunk_rows)):
        x.grad = weight.grad = None
        with autocast(precision):
            loss = loss_fn(x, weight, targets)
        (loss * 3).backward()  # a scaled loss (accumulation, fp16 scaling) scales the gradients
        results.append((loss.detach(), x.grad.clone(), weight.grad.clone()))
    assert results[1][1].dtype == x.dtype and results[1][2].dtype == weight.dtype
    return results


def assert_equal_to_plain(results, precision: str) -> None:
    (plain_loss, plain_dx, plain_dw), (fused, dx, dw) = results
    assert fused.dtype == torch.float32 and plain_loss.dtype == torch.float32
    torch.testing.assert_close(fused, plain_loss, **TOLERANCE[precision])
    for grad, plain in ((dx, plain_dx), (dw, plain_dw)):
        if precision == "bf16":  # single elements near zero differ by a bf16 rounding: compare by norm
            assert (grad - plain).norm() <= 1e-2 * plain.norm()
        else:
            torch.testing.assert_close(grad, plain, **TOLERANCE[precision])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_loss_and_gradients_equal_the_plain_computation(precision):
    assert_equal_to_plain(fused_against_plain(100, 96, SMALL_CHUNKS, precision), precision)


GIB = 2**30
CPU = Device("cpu", "cpu", "cpu", "test")
GPU = Device("cuda", "cuda:0", "cuda", "test: a CUDA device of a stated size")


# The plan's rule at shapes small enough for this CPU, one case per branch of it, with the (rows per
# chunk, chunks) it gives in fp32 and in bf16: the CPU's cache-sized chunks (iteration 1's
# vocabulary and micro-batch); on a GPU, chunks that fill the budget (1/32 of 0.5 GiB: 16 MiB), the
# floor of MIN_ROWS rows past the budget (1/32 of 128 MiB), and one chunk where every row fits.
CHOSEN = {
    "cpu": (2048, 4096, CPU, None, {"fp32": (512, 4), "bf16": (512, 4)}),
    "gpu budget": (12000, 256, GPU, GIB // 2, {"fp32": (8192, 2), "bf16": (5120, 3)}),
    "gpu floor": (10000, 256, GPU, 128 * 2**20, {"fp32": (MIN_ROWS, 3), "bf16": (MIN_ROWS, 3)}),
    "gpu one chunk": (10000, 256, GPU, 141 * GIB, {"fp32": (10000, 1), "bf16": (10000, 1)}),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CHOSEN))
def test_loss_and_gradients_equal_the_plain_computation_at_the_plans_chunk_sizes(case, precision):
    rows, vocab, device, capacity, expected = CHOSEN[case]
    decision = decide_loss(vocab, rows, 2 if precision == "bf16" else 4, device, capacity)
    assert (decision.chunk_rows, decision.chunks) == expected[precision], decision.reason
    assert_equal_to_plain(fused_against_plain(rows, vocab, decision.chunk_rows, precision, width=16), precision)


def test_a_target_far_below_its_row_keeps_an_exact_finite_loss():
    # On the CPU the loss is log(softmax) at the target; a target logit 200 below the row's largest
    # underflows that softmax to 0, where log-softmax still gives the exact loss (about 200).
    torch.manual_seed(0)
    x = torch.randn(100, 32)
    x[7] = 0.0
    x[7, 0] = 10.0
    weight = torch.randn(96, 32) * 0.1
    weight[:, 0] = 0.0
    weight[3, 0], weight[5, 0] = 10.0, -10.0  # row 7: logit 100 for class 3, -100 for class 5
    targets = torch.randint(0, 96, (100,))
    targets[7] = 5
    x.requires_grad_(), weight.requires_grad_()
    fused = linear_cross_entropy(x, weight, targets, SMALL_CHUNKS)
    fused.backward()
    dx, dw = x.grad.clone(), weight.grad.clone()
    x.grad = weight.grad = None
    plain = plain_linear_cross_entropy(x, weight, targets)
    plain.backward()
    assert torch.isfinite(fused) and plain.item() > 2.0  # row 7 alone adds 200 / 100 rows
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, weight.grad, rtol=1e-5, atol=1e-6)


def test_without_gradients_only_the_loss_is_computed():
    x, weight = torch.randn(100, 32, requires_grad=True), torch.randn(96, 32, requires_grad=True)
    targets = torch.randint(0, 96, (100,))
    with torch.no_grad():
        loss = linear_cross_entropy(x, weight, targets, SMALL_CHUNKS)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, plain_linear_cross_entropy(x, weight, targets).detach())


@pytest.mark.parametrize("architecture", ["classic", "modern"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_model_loss_and_every_gradient_match_the_plain_logits_path(architecture, precision):
    # 2 x 16 rows in chunks of 5: the tied embedding gets gradient from both ends, as before.
    config = GPTConfig(architecture=architecture, vocab_size=64, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = build_model(config)
    model.loss_chunk_rows = 5
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    runs = []
    for return_logits in (True, False):
        model.zero_grad(set_to_none=True)
        with autocast(precision):
            logits, loss = model(idx, targets, return_logits=return_logits)
        loss.backward()
        runs.append((logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (logits, plain_loss, plain_grads), (no_logits, fused, grads) = runs
    assert logits.shape == (2, 16, 64) and no_logits is None
    torch.testing.assert_close(fused, plain_loss, **TOLERANCE[precision])
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        # bf16: gradients that flow back through every layer carry the rounding; compare by norm.
        if precision == "bf16":
            assert (grad - plain_grads[name]).norm() <= 3e-2 * plain_grads[name].norm() + 1e-6, name
        else:
            torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow  # inductor compiles the forward and backward graphs: about a minute on 2 cores
@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_the_compiled_model_gives_the_plain_loss_and_gradients(architecture):
    """torch.compile (inductor, on the CPU) traces the fused loss whole: no graph break, and the loss
    and every gradient of 2 x 16 rows in 3 chunks (the last ragged) equal the plain logits path's."""
    from torch._dynamo.utils import counters

    config = GPTConfig(architecture=architecture, vocab_size=64, sequence_length=16, n_layer=1, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = build_model(config)
    model.loss_chunk_rows = 12
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    _, plain = model(idx, targets, return_logits=True)
    plain.backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    counters.clear()
    logits, fused = torch.compile(model, backend="inductor")(idx, targets)
    fused.backward()
    assert logits is None and not counters["graph_break"], dict(counters["graph_break"])
    # Inductor may sum in another order than eager: agreement to fp32 rounding of that order.
    torch.testing.assert_close(fused.detach(), plain.detach(), rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)
