"""Muon's Newton-Schulz precision: torch's own result in bf16, a more exact one in fp32, and the
plan's rule for which one a device runs."""

from __future__ import annotations

import pytest
import torch

from buildllm.plan import newton_schulz
from buildllm.train.optimizer import MUON_ADJUST_LR, Muon, orthogonalise


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator) * 0.02) for shape in [(96, 32), (32, 64)]]


def run(optimizer_class, settings: dict, steps: int = 3) -> list[torch.Tensor]:
    params = matrices()
    optimizer = optimizer_class(params, lr=0.01, weight_decay=0.1, adjust_lr_fn=MUON_ADJUST_LR, **settings)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
    return [p.detach().clone() for p in params]


def test_bf16_gives_torchs_muon_bit_for_bit_and_fp32_does_not():
    ours, torchs = run(Muon, {"orthogonalise_in": "bf16"}), run(torch.optim.Muon, {})
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs))
    in_fp32 = run(Muon, {"orthogonalise_in": "fp32"})
    assert not all(torch.equal(a, b) for a, b in zip(in_fp32, torchs))


def test_fp32_iterates_closer_to_the_exact_iteration_than_bf16():
    update = torch.randn(96, 32, generator=torch.Generator().manual_seed(2))
    coefficients = torch.optim._muon.DEFAULT_A, torch.optim._muon.DEFAULT_B, torch.optim._muon.DEFAULT_C
    exact = orthogonalise(update.double(), coefficients, 5, 1e-7, torch.float64)
    error = {
        name: (orthogonalise(update, coefficients, 5, 1e-7, dtype).double() - exact).abs().max().item()
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32))
    }
    assert error["fp32"] < error["bf16"] / 100, error


def test_the_momentum_buffer_is_not_changed_by_the_orthogonalisation():
    params = matrices()
    optimizer = Muon(params, lr=0.01, nesterov=False, orthogonalise_in="fp32")
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    # Without nesterov the update is the buffer itself: it must hold (1 - momentum) x the gradient.
    for p in params:
        assert torch.allclose(optimizer.state[p]["momentum_buffer"], torch.full_like(p, 1 - 0.95))


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "fp32")])
def test_the_cpu_iterates_in_bf16_only_where_it_has_a_bf16_matmul_path(monkeypatch, native, expected):
    monkeypatch.setattr(newton_schulz, "native_bf16", lambda: native)
    cpu = type("D", (), {"host_memory": True, "device": "cpu"})()
    gpu = type("D", (), {"host_memory": False, "device": "cuda:0"})()
    chosen, why = newton_schulz.decide_newton_schulz(cpu)
    assert chosen == expected and expected in why
    assert newton_schulz.decide_newton_schulz(gpu)[0] == "bf16"
