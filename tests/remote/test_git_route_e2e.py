"""The git route to a GPU machine (docs/gpu.md), rehearsed with git and real DVC on the CPU.

Here `buildllm carry` writes a bare clone of the committed project and a DVC remote that is a plain
folder. A clone of that bare repository stands in for the GPU machine: a Python that cannot import
the corpus package (tests/standin.py; DVC installed, as a wheelhouse would put it there), no
network. It pulls the corpus and token files from the folder remote, runs `dvc exp run -S
device=cpu` in place of cuda, and pushes the experiment to the bare repository; home pulls it, and
DVC's own commands and `buildllm compare` read it beside the home CPU run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import standin
from conftest import clone_project, run, run_env

pytestmark = pytest.mark.slow
# Tiny training bounds on top of the bounded pipeline: two optimizer steps, one evaluation.
BOUNDS = ["-S", "train.training_examples=64", "-S", "train.validation_examples=16", "-S", "train.eval_interval=2"]


def carry(home: Path, into: Path, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "buildllm", "carry", "--into", str(into), *flags], home, check=check)


def test_an_experiment_run_in_a_clone_comes_home_by_git_and_dvc(bounded_run, tmp_path):
    began = time.monotonic()
    home = clone_project(bounded_run, tmp_path / "home")
    carried = tmp_path / "carry"
    prepared = carry(home, carried).stdout
    total = float(re.search(r"([\d.]+) MiB\s+in all", prepared).group(1))
    travels = sum(p.stat().st_size for p in carried.rglob("*") if p.is_file()) / 2**20
    assert total == pytest.approx(travels, abs=0.06) and total <= 56, prepared
    refused = carry(home, tmp_path / "too-big", "--limit-mib", "1", check=False)
    assert refused.returncode == 2 and "over the 1 MiB limit" in refused.stderr.splitlines()[-1], refused.stderr

    # The GPU machine's stand-in: git, DVC, no corpus package, no network.
    far = tmp_path / "far"
    run(["git", "clone", "-q", str(carried / "project.git"), str(far)], tmp_path)
    env = {**run_env(), **standin.environment(far, installed=("dvc",))}
    env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", PIP_CONFIG_FILE="/dev/null")

    def there(*command: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(command, cwd=far, env=env, capture_output=True, text=True, timeout=600)
        assert not check or done.returncode == 0, f"{command}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    # Without the carried data the corpus stage would stop at once, in one line saying what to carry.
    stopped = there(sys.executable, "stages/corpus.py", check=False)
    assert stopped.returncode == 2 and stopped.stderr.count("\n") == 1, stopped.stderr
    assert "`buildllm carry` where they were built" in stopped.stderr
    there("dvc", "remote", "add", "--local", "carry", str(carried / "dvc-store"))
    there("dvc", "pull", "-r", "carry", "corpus", "tokenize")
    ran = there("dvc", "exp", "run", "-n", "far-cpu", "-S", "device=cpu", *BOUNDS).stdout
    assert "Running stage 'train'" in ran and "Running stage 'corpus'" not in ran, ran
    assert "Running stage 'tokenize" not in ran, ran
    there("dvc", "exp", "push", "origin", "far-cpu", "--no-cache")
    far_seconds = time.monotonic() - began

    # Home: its own CPU run with the same settings, then the far one pulled beside it.
    run(["dvc", "exp", "run", "-n", "home-cpu", "-S", "device=cpu", *BOUNDS], home)
    run(["dvc", "exp", "pull", str(carried / "project.git"), "far-cpu", "--no-cache"], home)
    shown = run(["dvc", "exp", "show", "--csv"], home).stdout
    assert "far-cpu" in shown and "home-cpu" in shown
    everything = json.loads(run(["dvc", "metrics", "diff", "home-cpu", "far-cpu", "--all", "--json"], home).stdout)
    tokens = {path: figures for path, figures in everything.items() if "/tokens_" in path}
    assert tokens and all(f["diff"] == 0 for figures in tokens.values() for f in figures.values()), tokens
    changed = json.loads(run(["dvc", "metrics", "diff", "home-cpu", "far-cpu", "--json"], home).stdout)
    assert not [path for path in changed if "/tokens_" in path or "/corpus" in path], changed
    compared = run([sys.executable, "-m", "buildllm", "compare", "home-cpu", "far-cpu", "--out", "reports/git"], home)
    assert "Equal-budget comparison: every control matches" in compared.stdout, compared.stdout[-3000:]
    rows = [line.split("|") for line in (home / "reports" / "git.md").read_text().splitlines() if line.startswith("| ")]
    controls = {cells[1].strip(): cells[-2].strip() for cells in rows if cells[2].strip() in ("params", "data file")}
    assert controls["data/tokens"] == "same" and set(controls.values()) == {"same"}, controls
    print(
        f"\ngit route: far side {far_seconds:.0f} s, whole {time.monotonic() - began:.0f} s; "
        f"what travels {total:.1f} MiB (bare clone + folder DVC remote; no wheelhouse here)"
    )
