"""The tune stage in the real DVC pipeline: it runs before the stages that plan, once per machine, and
keeps other machines' records; the plans read this machine's record (and none of another's)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from conftest import run, run_env, use_docs_corpus

OVERRIDE = "BUILDLLM_MACHINE_OVERRIDE"


def repro(project, *targets: str, env: dict | None = None) -> str:
    result = subprocess.run(
        ["dvc", "repro", *targets],
        cwd=project,
        env={**run_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"dvc repro exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_tune_stage_once_per_machine_and_the_plans_read_this_machines_record(project):
    use_docs_corpus(project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params.update(preset="tiny", device="cpu")
    params["train"].update(batch_size=8, training_examples=64, validation_examples=16)
    params["tune"].update(seconds=12, loss_steps=4)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "a small tune"], project)
    os.environ.pop(OVERRIDE, None)

    first = repro(project, "dry_run")
    assert "Running stage 'tune'" in first and "Running stage 'dry_run'" in first
    machines = json.loads((project / "metrics" / "tune.json").read_text())["machines"]
    here = json.loads((project / "metrics" / "machine.json").read_text())["machine_id"]
    assert list(machines) == [here] and machines[here]["tiny"]["cpu"]["precision"]["loss_check"]["tokens"] == "real"
    notes = json.loads((project / "metrics" / "dry_run_notes.json").read_text())
    assert "measured here" in notes["precision_reason"]

    # The same machine: nothing to measure again.
    again = repro(project, "dry_run")
    assert "Running stage 'tune'" not in again and "Running stage 'dry_run'" not in again

    # Another machine (another fingerprint): tune measures it, and the file keeps both records.
    other = repro(project, "dry_run", env={OVERRIDE: json.dumps({"cpu_model": "Other CPU 9000"})})
    assert "Running stage 'tune'" in other
    machines = json.loads((project / "metrics" / "tune.json").read_text())["machines"]
    assert here in machines and len(machines) == 2
