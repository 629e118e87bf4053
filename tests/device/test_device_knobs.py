"""The hardware guide's last rows: PYTORCH_ENABLE_MPS_FALLBACK set before torch is imported when asked
for (and recorded), and one XLA step boundary per optimizer step (a stand-in torch_xla module here,
where torch_xla cannot be installed)."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from buildllm.device.device import Device
from buildllm.train import trainer as trainer_module

SET_BEFORE_TORCH = """
import os, sys
from buildllm.cli import {how}
{call}
assert "torch" not in sys.modules, "torch was imported before the setting"
print(os.environ.get("PYTORCH_ENABLE_MPS_FALLBACK"))
"""


def run_python(code: str, cwd, env_drop=("PYTORCH_ENABLE_MPS_FALLBACK",)) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_flag_sets_the_fallback_before_torch_is_imported(tmp_path):
    call = "config_from_args(build_parser().parse_args(['dry-run', '--mps-fallback']))"
    out = run_python(SET_BEFORE_TORCH.format(how="build_parser, config_from_args", call=call), tmp_path)
    assert out.strip() == "1"
    call = "config_from_args(build_parser().parse_args(['dry-run']))"
    assert (
        run_python(SET_BEFORE_TORCH.format(how="build_parser, config_from_args", call=call), tmp_path).strip() == "None"
    )


def test_a_stage_sets_it_from_params_before_importing_its_function(tmp_path):
    (tmp_path / "params.yaml").write_text("mps_fallback: true\n")
    code = SET_BEFORE_TORCH.replace("buildllm.cli", "buildllm.torch_env")
    out = run_python(code.format(how="stage_settings", call="stage_settings()"), tmp_path)
    assert out.strip() == "1"


def test_it_is_recorded_in_the_startup_line_and_the_metrics(tmp_path):
    code = "from buildllm.cli import main; main(['dry-run', '--preset', 'tiny', '--device', 'cpu', '--mps-fallback'])"
    first = json.loads(run_python(code, tmp_path).splitlines()[0])
    assert first["action"] == "dry_run" and first["mps_fallback"] is True
    assert json.loads((tmp_path / "metrics" / "dry_run.json").read_text())["mps_fallback"] is True


def stand_in_xla(monkeypatch, with_sync: bool) -> list[str]:
    calls = []
    module = types.ModuleType("torch_xla")
    if with_sync:
        module.sync = lambda: calls.append("sync")
    core = types.ModuleType("torch_xla.core")
    xla_model = types.ModuleType("torch_xla.core.xla_model")
    xla_model.mark_step = lambda: calls.append("mark_step")
    for name, value in (("torch_xla", module), ("torch_xla.core", core), ("torch_xla.core.xla_model", xla_model)):
        monkeypatch.setitem(sys.modules, name, value)
    return calls


@pytest.mark.parametrize("with_sync, expected", [(True, "sync"), (False, "mark_step")])
def test_an_xla_step_boundary_uses_sync_or_mark_step(monkeypatch, with_sync, expected):
    calls = stand_in_xla(monkeypatch, with_sync)
    Device("xla", "xla", "xla", "test").end_step()
    assert calls == [expected]
    Device("cpu", "cpu", "cpu", "test").end_step()
    Device("cuda", "cuda:0", "cuda", "test").end_step()
    assert calls == [expected]  # no boundary off XLA


def test_the_train_step_marks_one_boundary_per_optimizer_step(tokens, tmp_path, monkeypatch):
    from buildllm.config import load_config
    from buildllm.data.windows import Windows, load_tokens
    from buildllm.plan.run_plan import apply_plan, make_plan

    seen = []
    monkeypatch.setattr(Device, "end_step", lambda device: seen.append(device))
    plan = make_plan(
        load_config(
            None, {"preset": "tiny", "device": "cpu", "train.threads": 1, "train.batch_size": 4, "train.grad_accum": 3}
        )
    )
    apply_plan(plan)
    windows = Windows(load_tokens(tokens["train"]), plan.model.sequence_length, 64)
    trainer = trainer_module.Trainer(plan, windows, directory=tmp_path / "run")
    for _ in range(2):
        trainer.step()
    assert [device.kind for device in seen] == ["cpu", "cpu"]  # once per optimizer step, not per micro-batch
