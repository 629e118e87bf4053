"""The architecture knobs (model.activation, model.qk_norm, model.zero_init_projections,
model.tied_output): each changes the model as docs/pipeline.md says, and only when asked for."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from buildllm.config import load_config, profile_for
from buildllm.errors import ConfigError
from buildllm.model.gpt import build_model
from buildllm.plan.run_plan import facts, make_plan
from buildllm.profiles import available_profiles, load_profile
from buildllm.shape import GPTConfig
from buildllm.train import checkpoint

TINY = GPTConfig(vocab_size=256, sequence_length=16, n_layer=2, n_head=2, n_embd=32)
OFF = {"qk_norm": False, "zero_init_projections": False}


def shape(architecture: str = "classic", **knobs) -> GPTConfig:
    return replace(TINY, architecture=architecture, **knobs)


def batch(config: GPTConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, config.vocab_size, (2, config.sequence_length + 1), generator=generator)
    return idx[:, :-1], idx[:, 1:]


class AttentionInputs(TorchFunctionMode):
    """The q and k each attention call receives (torch's own override mechanism: nothing is replaced)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            self.calls.append((args[0].detach(), args[1].detach()))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_the_defaults_build_the_model_the_knobs_switched_off_build(architecture):
    # Naming each knob's off value (the architecture's own activation among them) is the default model:
    # the same config, the same draws from the same seed, the same first loss and gradients.
    own = {"classic": "gelu", "modern": "swiglu"}[architecture]
    default, named = shape(architecture), shape(architecture, activation=own, **OFF)
    assert named == default and named.activation is None and default.mlp_activation == own
    a, b = build_model(default, seed=5), build_model(named, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    idx, targets = batch(default)
    loss_a, loss_b = a(idx, targets)[1], b(idx, targets)[1]
    loss_a.backward()
    loss_b.backward()
    assert loss_a.item() == loss_b.item()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_every_profile_keeps_the_knobs_off_and_its_output_layer_as_before():
    for name in available_profiles():
        model = load_profile(name).model
        assert (model.activation, model.qk_norm, model.zero_init_projections) == (None, False, False), name
        assert model.tied_output is (name != "tiny"), name  # tiny classic keeps its own output layer


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_relu2_is_relu_squared_in_a_two_matrix_mlp(architecture):
    model = build_model(shape(architecture, activation="relu2"), seed=1)
    mlp = model.blocks[0].mlp
    assert not hasattr(mlp, "gate") and mlp.up.out_features == 4 * TINY.n_embd
    assert (mlp.up.bias is not None) is (architecture == "classic")  # biases stay the architecture's
    x = torch.randn(3, 5, TINY.n_embd)
    torch.testing.assert_close(mlp(x), mlp.down(F.relu(mlp.up(x)) ** 2), rtol=0, atol=0)
    gelu = mlp.down(F.gelu(mlp.up(x)))
    assert not torch.allclose(mlp(x), gelu)


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_gelu_is_the_exact_form_and_gelu_tanh_gpt2s_approximation(architecture):
    x = torch.randn(3, 5, TINY.n_embd) * 3  # wide enough that the two forms differ visibly
    computed = {}
    for activation in ("gelu", "gelu_tanh"):
        mlp = build_model(shape(architecture, activation=activation), seed=1).blocks[0].mlp
        assert not hasattr(mlp, "gate") and mlp.up.out_features == 4 * TINY.n_embd
        form = "tanh" if activation == "gelu_tanh" else "none"
        torch.testing.assert_close(mlp(x), mlp.down(F.gelu(mlp.up(x), approximate=form)), rtol=0, atol=0)
        computed[activation] = mlp(x)
    # Same seed, same weights: only the activation's form differs, and it shows.
    assert not torch.equal(computed["gelu"], computed["gelu_tanh"])
    if architecture == "classic":  # the classic's own activation is the exact form
        own = build_model(shape(architecture), seed=1).blocks[0].mlp
        torch.testing.assert_close(own(x), computed["gelu"], rtol=0, atol=0)


def test_swiglu_on_the_classic_architecture_is_gated_with_the_classic_biases():
    mlp = build_model(shape("classic", activation="swiglu"), seed=1).blocks[0].mlp
    assert mlp.gate.bias is None and mlp.up.bias is not None and mlp.down.bias is not None
    x = torch.randn(3, 5, TINY.n_embd)
    torch.testing.assert_close(mlp(x), mlp.down(F.silu(mlp.gate(x)) * mlp.up(x)), rtol=0, atol=0)


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_qk_norm_gives_attention_unit_rms_queries_and_keys_and_no_new_parameters(architecture):
    idx, _ = batch(TINY)
    seen = {}
    for on in (False, True):
        model = build_model(shape(architecture, qk_norm=on), seed=2)
        with AttentionInputs() as inputs:
            model(idx)
        seen[on] = (inputs.calls, list(model.state_dict()))
    assert len(seen[True][0]) == TINY.n_layer and seen[True][1] == seen[False][1]  # no learned gain
    for on, (calls, _) in seen.items():
        for q, k in calls:
            rms = torch.cat((q, k)).pow(2).mean(-1).sqrt()  # per head, token (rotary keeps each head's norm)
            if on:
                # rms_norm's eps pulls the RMS of GPT-2's small q and k a little under 1 (1.7e-4 seen)
                torch.testing.assert_close(rms, torch.ones_like(rms), rtol=0, atol=1e-3)
            else:
                assert rms.max() < 0.5  # GPT-2's 0.02-scale weights make small queries and keys


def test_qk_norm_comes_before_rotary_positions():
    # Rotary turns each pair by its position's angle: normalising after it would give the same
    # norms, but the values differ from rotating the normalised head: check the order itself.
    from buildllm.model.gpt import apply_rotary

    config = shape("modern", qk_norm=True)
    model = build_model(config, seed=3)
    idx, _ = batch(config)
    attention = model.blocks[0].attn
    x = model.blocks[0].norm1(model.token_embedding(idx))
    B, T, C = x.shape
    q = attention.qkv(x).split(C, dim=2)[0].view(B, T, 2, C // 2).transpose(1, 2)
    rope = (model.rope_cos[:T], model.rope_sin[:T])
    expected = apply_rotary(F.rms_norm(q, (C // 2,), eps=1e-6), *rope)
    with AttentionInputs() as inputs:
        attention(x, rope)
    torch.testing.assert_close(inputs.calls[0][0], expected)


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_zero_init_projections_start_every_block_as_the_identity(architecture):
    config = shape(architecture, zero_init_projections=True)
    model = build_model(config, seed=4)
    for block in model.blocks:
        for layer in (block.attn.proj, block.mlp.down):
            assert not layer.weight.any() and (layer.bias is None or not layer.bias.any())
        assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)  # the rest as GPT-2's
    idx, targets = batch(config)
    reached = []
    model.final_norm.register_forward_pre_hook(lambda _, args: reached.append(args[0]))
    model(idx, targets)
    stream = model.token_embedding(idx)
    if architecture == "classic":
        stream = stream + model.position_embedding(torch.arange(config.sequence_length))
    assert torch.equal(reached[0], stream)  # the residual stream is the embeddings, bit for bit


def test_tied_output_is_a_knob_whose_default_is_the_profiles():
    def head(overrides):
        model = build_model(profile_for(load_config(None, overrides)).model, "meta")
        return model.lm_head.weight is model.token_embedding.weight

    assert head({}) and not head({"model.tied_output": False})
    assert not head({"preset": "tiny"}) and head({"preset": "tiny", "model.tied_output": True})
    assert head({"preset": "tiny", "model.architecture": "modern"})  # tiny modern ties, as before


def test_the_plan_announces_each_knob(tmp_path):
    settings = {"device": "cpu", "train.training_examples": 64, "train.train_tokens": str(tmp_path / "none.pt")}
    default = facts(make_plan(load_config(None, settings)))
    assert (default["activation"], default["qk_norm"], default["zero_init_projections"]) == ("gelu", False, False)
    assert default["tied_output"] is True
    knobs = {"model.activation": "relu2", "model.qk_norm": True, "model.zero_init_projections": True}
    on = facts(make_plan(load_config(None, {**settings, **knobs, "model.tied_output": False})))
    assert on["activation"] == "relu2" and on["qk_norm"] is on["zero_init_projections"] is True
    assert on["tied_output"] is False
    assert on["parameters"] == default["parameters"] + 4096 * 128  # its own output layer


@pytest.mark.parametrize(
    "key, value, said",
    [
        ("model.activation", "relu3", "allowed values: gelu, gelu_tanh, relu2, swiglu"),
        ("model.qk_norm", "yes", "must be true or false"),
        ("model.zero_init_projections", 1, "must be true or false"),
        ("model.tied_output", "no", "must be true or false"),
    ],
)
def test_a_bad_knob_value_is_refused_in_one_line(key, value, said):
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, {key: value})
    assert said in str(excinfo.value) and key in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_the_cli_refuses_a_bad_activation_in_one_line(capsys, tmp_path, monkeypatch):
    from buildllm.cli import main

    monkeypatch.chdir(tmp_path)  # no params.yaml: the flag alone

    assert main(["dry-run", "--device", "cpu", "--activation", "relu3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.activation='relu3' is not allowed" in err and "\n" not in err and "Traceback" not in err


def _saved(tmp_path, config: GPTConfig, signature_model: dict, gelu_exact: bool = True) -> dict:
    """A checkpoint as the Trainer saves it; without gelu_exact, as it saved it before `gelu` meant the exact form."""
    model = build_model(config, seed=3)
    signature = {"profile": "tiny", **{f"model.{k}": v for k, v in signature_model.items()}}
    state = {"step": 2, "model": model.state_dict(), "model_config": signature_model, "signature": signature}
    if gelu_exact:
        state[checkpoint.GELU] = checkpoint.GELU_EXACT
    checkpoint.save(tmp_path / "run", state, keep=2)
    return state


def _signature(config: GPTConfig) -> dict:
    from dataclasses import asdict

    return {"profile": "tiny", **{f"model.{k}": v for k, v in asdict(config).items()}}


def test_a_checkpoint_from_before_the_knobs_resumes_as_the_model_it_holds(tmp_path):
    from dataclasses import asdict

    from buildllm.errors import UserError

    config = load_profile("tiny").model
    before = {k: v for k, v in asdict(config).items() if k not in ("activation", "qk_norm", "zero_init_projections")}
    # Saved before the knobs, so before `gelu` meant the exact form: its model is GPT-2's tanh GELU.
    _saved(tmp_path, config, before, gelu_exact=False)
    with pytest.raises(UserError) as excinfo:
        checkpoint.state_to_resume(tmp_path / "run", _signature(config), resume=True, force=True)
    message = str(excinfo.value)
    assert "computes gelu_tanh" in message and "add --activation gelu_tanh" in message and "\n" not in message
    tanh = replace(config, activation="gelu_tanh")
    assert checkpoint.state_to_resume(tmp_path / "run", _signature(tanh), resume=True, force=False)["step"] == 2


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_a_checkpoint_saved_before_gelu_was_exact_generates_with_the_tanh_form_it_was_trained_with(
    tmp_path, architecture
):
    from dataclasses import asdict

    from buildllm.train.generate import model_from

    idx, _ = batch(TINY)
    config = shape(architecture, activation="gelu")
    for exact, form in ((False, "gelu_tanh"), (True, "gelu")):
        state = _saved(tmp_path / form, config, asdict(config), gelu_exact=exact)
        expected = build_model(replace(config, activation=form), seed=3).eval()
        with torch.no_grad():
            torch.testing.assert_close(model_from(state, "cpu")(idx)[0], expected(idx)[0], rtol=0, atol=0)
    # A checkpoint of another activation is read as saved, marked or not.
    relu2 = shape(architecture, activation="relu2")
    state = _saved(tmp_path / "relu2", relu2, asdict(relu2), gelu_exact=False)
    assert checkpoint.saved_model(state) == relu2


@pytest.mark.parametrize(
    "knob, said",
    [
        ({"qk_norm": True}, "model.qk_norm False -> True"),
        ({"activation": "relu2"}, "model.activation None -> 'relu2'"),
        ({"zero_init_projections": True}, "model.zero_init_projections False -> True"),
    ],
)
def test_resuming_a_checkpoint_with_other_knobs_is_refused_in_one_line_even_forced(tmp_path, knob, said):
    from dataclasses import asdict

    from buildllm.errors import UserError

    config = load_profile("tiny").model
    _saved(tmp_path, config, asdict(config))
    with pytest.raises(UserError) as excinfo:
        checkpoint.state_to_resume(tmp_path / "run", _signature(replace(config, **knob)), resume=True, force=True)
    message = str(excinfo.value)
    assert "different model" in message and said in message and "\n" not in message
