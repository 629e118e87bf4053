"""The written-out attention (model/gpt.py, explicit_attention) computes what torch's
scaled_dot_product_attention computes, in every architecture, and keeps what the memory estimate
counts for it: one (batch x heads x tokens x tokens) tensor per layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from saved_tensors import saved_bytes_of_one_block

from buildllm.model.gpt import build_model
from buildllm.shape import GPTConfig

SHAPE = GPTConfig(vocab_size=256, sequence_length=32, n_layer=2, n_head=4, n_embd=64)


def loss_and_gradients(config: GPTConfig, attention: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model = build_model(config, seed=0).double()
    model.attention = attention
    idx = torch.randint(
        0, config.vocab_size, (3, config.sequence_length + 1), generator=torch.Generator().manual_seed(1)
    )
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize(
    "knobs", [{"architecture": "classic"}, {"architecture": "modern"}, {"architecture": "classic", "qk_norm": True}]
)
def test_the_written_out_form_gives_the_same_loss_and_gradients(knobs):
    config = replace(SHAPE, **knobs)
    loss, gradients = loss_and_gradients(config, "sdpa")
    written_loss, written_gradients = loss_and_gradients(config, "explicit")
    assert written_loss.item() == pytest.approx(loss.item(), abs=1e-12)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(gradients, written_gradients))


def test_the_kernel_is_set_on_every_block_and_an_unknown_one_is_refused():
    model = build_model(SHAPE)
    assert model.attention == "sdpa"
    model.attention = "explicit"
    assert all(block.attn.explicit for block in model.blocks) and model.attention == "explicit"
    with pytest.raises(ValueError, match="neither 'sdpa' nor 'explicit'"):
        model.attention = "flash"


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_layer_keeps_one_score_sized_tensor_more_than_with_sdpa(dtype):
    config = replace(SHAPE, sequence_length=128)
    batch, element = 4, 2 if dtype else 4
    score_bytes = batch * config.n_head * config.sequence_length**2 * element
    extra = saved_bytes_of_one_block(config, dtype, batch, attention="explicit") - saved_bytes_of_one_block(
        config, dtype, batch
    )
    # The softmax's output (kept for its backward and the weighted values'), and a causal mask of
    # tokens x tokens booleans: the estimate counts score_bytes per layer.
    assert extra == pytest.approx(score_bytes, rel=0.02), (extra, score_bytes)
