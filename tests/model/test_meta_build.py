"""A meta model counts parameters without initialising them, and planning a run imports no
torch._dynamo: the ~2 s that a dry run, an estimate or a preflight would otherwise pay for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from buildllm.model.gpt import GPTConfig, build_model
from buildllm.profiles import load_profile


@pytest.mark.parametrize("architecture", ["classic", "modern"])
def test_a_meta_model_has_the_parameters_and_buffers_of_a_real_one(architecture):
    config = GPTConfig(**{**vars(load_profile("tiny").model), "architecture": architecture})
    meta, real = build_model(config, "meta"), build_model(config, "cpu", seed=0)
    assert [(n, p.shape) for n, p in meta.named_parameters()] == [(n, p.shape) for n, p in real.named_parameters()]
    assert meta.num_parameters() == real.num_parameters()
    assert {p.device.type for p in meta.parameters()} | {b.device.type for b in meta.buffers()} == {"meta"}
    # The real model is initialised: GPT-2's 0.02 standard deviation, not an uninitialised buffer.
    assert 0.015 < real.token_embedding.weight.std().item() < 0.025


def test_planning_a_run_imports_no_torch_dynamo(tmp_path):
    code = (
        "import sys\n"
        "from buildllm.config import load_config\n"
        "from buildllm.plan.run_plan import make_plan\n"
        "for architecture in ('classic', 'modern'):\n"
        "    config = load_config(None, {'device': 'cpu', 'preset': 'tiny', 'model.architecture': architecture})\n"
        "    plan = make_plan(config, training_examples=64)\n"
        "print(plan.fused_adamw, 'torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout
