import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from buildllm.model.flops import flops_per_token, matmul_parameters, mfu
from buildllm.model.gpt import GPTConfig, build_model
from buildllm.profiles import load_profile


@pytest.mark.parametrize("architecture", ["classic", "modern"])
@pytest.mark.parametrize("profile", ["gpt_first_cpu", "student", "tiny"])
def test_formula_matches_flop_counter_on_one_training_step(profile, architecture):
    base = load_profile(profile).model
    check_one_training_step(GPTConfig(**{**vars(base), "architecture": architecture}))


@pytest.mark.parametrize("architecture", ["classic", "modern"])
@pytest.mark.parametrize("knobs", [{"activation": "relu2"}, {"activation": "swiglu"}, {"qk_norm": True}], ids=str)
def test_the_architecture_knobs_keep_the_formula(architecture, knobs):
    # ReLU squared's and qk-norm's elementwise work is not counted; a gated MLP's third matrix is.
    check_one_training_step(GPTConfig(**{**vars(load_profile("tiny").model), "architecture": architecture, **knobs}))


def check_one_training_step(config: GPTConfig) -> None:
    model = build_model(config)
    batch = 2
    idx = torch.randint(0, config.vocab_size, (batch, config.sequence_length))
    # The math attention kernel is built from matmuls the counter sees; the fused CPU kernel is not counted.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(idx, idx)
        loss.backward()
    measured = counter.get_total_flops()
    predicted = flops_per_token(config, matmul_parameters(model)) * batch * config.sequence_length
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)


def test_matmul_parameters_count_tied_embedding_once_and_skip_positions():
    config = load_profile("gpt_first_cpu").model
    model = build_model(config, "meta")
    d, L, V = config.n_embd, config.n_layer, config.vocab_size
    assert matmul_parameters(model) == 12 * L * d * d + V * d
    untied = build_model(GPTConfig(**{**vars(config), "tied_output": False}), "meta")
    assert matmul_parameters(untied) == 12 * L * d * d + V * d  # the lookup table is no matmul


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_the_mfu_ceiling_times_every_matmul_that_mfu_counts(architecture):
    """lab/mfu_ceiling.py's matmul part must run the FLOPs of MFU's numerator, no more, no
    fewer: a Linear it missed would raise the ceiling it prints."""
    from lab import mfu_ceiling as ceiling

    base = load_profile("gpt_first_cpu").model
    config = GPTConfig(**{**vars(base), "architecture": architecture, "n_layer": 2})
    model = build_model(config)
    rows = 2 * config.sequence_length
    work, flops = ceiling.matmul_work(model, rows, chunk=config.sequence_length)
    with FlopCounterMode(display=False) as counter:
        work()
    assert counter.get_total_flops() == flops == 6 * matmul_parameters(model) * rows
    attention = flops_per_token(config, matmul_parameters(model)) * rows - flops
    assert attention == 12 * config.n_layer * config.n_embd * config.sequence_length * rows


def test_mfu_is_the_ratio():
    assert mfu(6e6, 1000, 1.2e10) == pytest.approx(0.5)
    assert mfu(6e6, 1000, 0) == 0.0


def test_peak_table_matches_whole_names_most_specific_first():
    from buildllm.device.peak_flops import table_peak

    assert "L40 " in table_peak("NVIDIA L40", "bf16", True).source
    assert "L4 " in table_peak("NVIDIA L4", "bf16", True).source
    assert table_peak("NVIDIA H100 80GB HBM3", "bf16", True).flops == pytest.approx(989.4e12)
    assert table_peak("NVIDIA H100 PCIe", "bf16", True).flops == pytest.approx(756e12)
    assert table_peak("NVIDIA A100-SXM4-80GB", "fp32", True).flops == pytest.approx(156e12)  # TF32 allowed
    assert table_peak("Tesla T4", "bf16", False) is None  # no bf16 entry: the peak is measured instead
    assert table_peak("Some Future GPU", "bf16", True) is None


def test_paired_mfu_pairs_each_step_with_its_own_peak():
    # A load that halves both the steps and the matmuls in interval 2 leaves its MFU as it was;
    # against one peak for the whole run the two intervals would read 0.5 and 0.25.
    from buildllm.model.flops import paired_mfu

    assert paired_mfu(1e6, 100, [2.0, 1.0, 2.0], [4e8, 2e8, 4e8]) == pytest.approx(0.5)
    assert paired_mfu(1e6, 100, [2.0, 1.0], [4e8, 4e8]) == pytest.approx((0.5 + 0.25) / 2)
    assert paired_mfu(1e6, 100, [], []) == 0.0
