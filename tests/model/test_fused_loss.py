"""The fused, chunked output layer + cross-entropy equals the plain computation: loss and gradients,
both architectures, fp32 and bf16 autocast, with several chunks and a ragged last chunk."""

from __future__ import annotations

import pytest
import torch

from buildllm.model import fused_loss
from buildllm.model.fused_loss import linear_cross_entropy, plain_linear_cross_entropy
from buildllm.model.gpt import GPTConfig, build_model

# bf16 rounds logits and gradients to 8 bits of mantissa; the fused path rounds the weight
# gradient per chunk where the plain graph rounds it once, so bf16 agrees to bf16's precision.
TOLERANCE = {"fp32": dict(rtol=1e-5, atol=1e-6), "bf16": dict(rtol=1e-2, atol=1e-3)}


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


@pytest.fixture
def small_chunks(monkeypatch):
    # 100 rows x vocabulary 96 in chunks of 21 rows: five chunks, the last one ragged.
    monkeypatch.setattr(fused_loss, "CHUNK_BYTES", 21 * 4 * 96)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_loss_and_gradients_equal_the_plain_computation(precision, small_chunks):
    torch.manual_seed(0)
    assert fused_loss.chunk_rows(96, 100) == 21
    x = torch.randn(100, 32, requires_grad=True)
    weight = (torch.randn(96, 32) * 0.5).requires_grad_()
    targets = torch.randint(0, 96, (100,))
    results = []
    for loss_fn in (plain_linear_cross_entropy, linear_cross_entropy):
        x.grad = weight.grad = None
        with autocast(precision):
            loss = loss_fn(x, weight, targets)
        (loss * 3).backward()  # a scaled loss (accumulation, fp16 scaling) scales the gradients
        results.append((loss.detach(), x.grad.clone(), weight.grad.clone()))
    (plain_loss, plain_dx, plain_dw), (fused, dx, dw) = results
    assert fused.dtype == torch.float32 and plain_loss.dtype == torch.float32
    torch.testing.assert_close(fused, plain_loss, **TOLERANCE[precision])
    for grad, plain in ((dx, plain_dx), (dw, plain_dw)):
        if precision == "bf16":  # single elements near zero differ by a bf16 rounding: compare by norm
            assert (grad - plain).norm() <= 1e-2 * plain.norm()
        else:
            torch.testing.assert_close(grad, plain, **TOLERANCE[precision])
    assert dx.dtype == x.dtype and dw.dtype == weight.dtype


def test_a_target_far_below_its_row_keeps_an_exact_finite_loss(small_chunks):
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
    fused = linear_cross_entropy(x, weight, targets)
    fused.backward()
    dx, dw = x.grad.clone(), weight.grad.clone()
    x.grad = weight.grad = None
    plain = plain_linear_cross_entropy(x, weight, targets)
    plain.backward()
    assert torch.isfinite(fused) and plain.item() > 2.0  # row 7 alone adds 200 / 100 rows
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, weight.grad, rtol=1e-5, atol=1e-6)


def test_without_gradients_only_the_loss_is_computed(small_chunks):
    x, weight = torch.randn(100, 32, requires_grad=True), torch.randn(96, 32, requires_grad=True)
    targets = torch.randint(0, 96, (100,))
    with torch.no_grad():
        loss = linear_cross_entropy(x, weight, targets)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, plain_linear_cross_entropy(x, weight, targets).detach())


@pytest.mark.parametrize("architecture", ["classic", "modern"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_model_loss_and_every_gradient_match_the_plain_logits_path(architecture, precision, monkeypatch):
    # 2 x 16 rows in chunks of 5: the tied embedding gets gradient from both ends, as before.
    monkeypatch.setattr(fused_loss, "CHUNK_BYTES", 5 * 4 * 64)
    config = GPTConfig(architecture=architecture, vocab_size=64, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = build_model(config)
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
