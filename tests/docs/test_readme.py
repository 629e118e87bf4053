"""The documentation, checked against what it describes.

The walkthrough (docs/walkthrough.md), run as written: every ```bash block marked `<!-- walkthrough -->`
is taken from the document itself and run line by line, in order, with real DVC in a temporary copy of
the project whose params.yaml is bounded (the walkthrough says how). Each command's stated outcome is
checked, and after every command the workspace is still on the defaults (params.yaml unchanged). On a
machine without CUDA, the CUDA lines must print the one-line refusal and leave the workspace's files as
they were.

The README (fast checks): its set-up commands are the ones CI runs, its course route's commands are the
walkthrough's (so the test above runs them) with flags and keys that exist, its links and the docs'
lead to files, it stays short, and neither it nor the docs hold a machine's name or a hand-typed speed
(measured figures come from committed files, in the generated docs/measured.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, copy_project, run, wait_for_queue

from buildllm.device import cpu_bf16

WALKTHROUGH = "docs/walkthrough.md"
MARKER = "<!-- walkthrough -->"
REFUSAL = "CUDA is not available"
# bf16 on a CPU without a bf16 matmul path is refused the same way (buildllm/device/cpu_bf16.py).
CPU_BF16_REFUSED = not cpu_bf16.native_bf16()
CPU_BF16_REFUSAL = "no bf16 matmul path"
WIDTH = 160


def walkthrough(text: str) -> list[str]:
    """The commands of the marked blocks, in order (a trailing backslash continues a line)."""
    commands = []
    for block in re.findall(re.escape(MARKER) + r"\s*```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [line.strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]
    return commands


def bound(project: Path, cuda: bool) -> None:
    """The sizes the walkthrough states for this test: preset tiny, 64 examples, a 5-step benchmark;
    without CUDA, vocabulary 4096 alone."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["preset"] = "tiny"
    if not cuda:
        # 16384 is the vocabulary of iterations 2 and 3, which only the CUDA lines use; without CUDA those
        # are refused before any token file is read, so building it (in `dvc repro dry_run`) proves nothing
        # here and costs about 10 s. tests/data/test_tokenize_e2e.py builds tokenize@16384 with real DVC.
        params["tokenize"]["vocabularies"] = [4096]
    params["train"].update(training_examples=64, validation_examples=16, log_interval=2, eval_interval=2)
    params["benchmark"].update(warmup_steps=1, measured_steps=4, intervals=2)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (project / WALKTHROUGH).parent.mkdir(parents=True, exist_ok=True)
    (project / WALKTHROUGH).write_text((ROOT / WALKTHROUGH).read_text())
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "bounded params for the walkthrough"], project)


def files(project: Path) -> dict:
    return {
        p.relative_to(project).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((project / "metrics").rglob("*"))
        if p.is_file()
    }


def lines(result) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def queue_ended_well(project: Path) -> None:
    """`dvc queue status`: "wait until none is Queued or Running"; none may have failed (but a CPU bf16
    run on a CPU that refuses bf16)."""
    status = wait_for_queue(project, timeout=600)
    failed = [line for line in status.splitlines() if re.search(r"\bFailed\b", line)]
    assert all(CPU_BF16_REFUSED and "bf16" in line for line in failed), status


def check(command: str, result, project: Path) -> None:
    """The outcome the walkthrough states for each command; a command with no stated outcome fails the
    test, so a new walkthrough command comes with its check."""
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    if command.startswith("buildllm env"):
        assert "Resolved device:" in out
    elif command.startswith("buildllm dry-run"):
        assert json.loads(result.stdout.splitlines()[0])["action"] == "dry_run" and "parameters" in out
    elif command.startswith("dvc repro tokenize"):
        assert list((project / "data" / "tokens").glob("*/*/train_tokens.pt"))  # data/tokens/VOCAB/CORPUS_VOCAB/
    elif command.startswith("buildllm benchmark"):
        assert json.loads(result.stdout.splitlines()[0])["action"] == "benchmark", out
        metrics = json.loads((project / "metrics" / "benchmark.json").read_text())
        assert metrics["tokens_per_second"] > 0 and 0 < metrics["mfu"] and metrics["peak_memory_bytes"] > 0
        assert "tokens/s" in result.stdout and "MFU" in result.stdout
    elif command.startswith("buildllm estimate"):
        metrics = json.loads((project / "metrics" / "estimate.json").read_text())
        assert metrics["estimated_seconds_low"] <= metrics["estimated_seconds"] <= metrics["estimated_seconds_high"]
        assert "total ≈" in result.stdout and "kept on disk" in result.stdout
    elif command.startswith("dvc repro dry_run"):
        assert (project / "metrics" / "dry_run.json").exists()
    elif command.startswith("git add dvc.lock"):
        assert run(["git", "status", "--porcelain", "dvc.lock", "metrics"], project).stdout == ""
    elif command.startswith(("dvc exp run --temp", "dvc exp run --queue", "dvc queue start", "git checkout")):
        pass  # the exit code (checked by the caller); the runs are read by the commands after them
    elif command.startswith("dvc queue status"):
        queue_ended_well(project)
    elif command.startswith("dvc metrics show"):
        rows = result.stdout.splitlines()
        assert rows[0].startswith("Path") and max(len(row) for row in rows) <= WIDTH, out
        assert any(row.startswith("metrics/summary/") for row in rows[1:]), out
    elif command.startswith("dvc metrics diff"):
        # One row per metric that differs, and every row fits a terminal.
        assert "| Path" in out and max(len(line) for line in result.stdout.splitlines()) <= WIDTH, out
        # Without --targets the stages' summaries (short names); with one, that stage's full record.
        assert ("estimated_seconds" if "estimate.json" in command else "tokens_per_s") in out
    elif command.startswith("buildllm compare"):
        target = re.search(r"--out (\S+)", command)
        assert (project / f"{target.group(1) if target else 'reports/comparison'}.md").exists(), out
        # The walkthrough's comparisons are equal-budget: their speed-ups are shown, not withheld.
        assert "Equal-budget comparison" in result.stdout and "Not an equal-budget" not in result.stdout, out
    elif command.startswith("dvc repro train"):
        metrics = json.loads((project / "metrics" / "train.json").read_text())
        assert metrics["status"] == "completed" and metrics["unigram_validation_loss"] > 0
    elif command.startswith("buildllm generate"):
        startup, text = result.stdout.split("\n", 1)
        assert json.loads(startup)["action"] == "generate" and text.startswith("The history of")
    else:
        raise AssertionError(f"walkthrough command with no stated outcome in this test: {command}")


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    commands = walkthrough((ROOT / WALKTHROUGH).read_text())
    assert len(commands) >= 15 and any("cuda" in c for c in commands)
    names = [m for c in commands for m in re.findall(r"-n (\S+)", c)]
    assert len(names) == len(set(names)), f"experiment names used twice: {names}"
    project = copy_project(tmp_path / "project")
    cuda = torch.cuda.is_available()
    bound(project, cuda)
    defaults = (project / "params.yaml").read_text()
    for command in commands:
        before = files(project)
        result = run(["bash", "-c", command], project, check=False, timeout=600)
        out = result.stdout + result.stderr
        if CPU_BF16_REFUSED and "cpu-bf16" in command and not command.startswith("dvc exp run"):
            # The refused run below left no cpu-bf16 to diff or compare: a one-line error, no traceback.
            assert result.returncode != 0 and "cpu-bf16" in out and "Traceback" not in out, f"{command}\n{out}"
        elif CPU_BF16_REFUSED and "--temp" in command and "device=cpu" in command and "precision=bf16" in command:
            assert result.returncode != 0, f"{command}\n{out}"
            # The stages before the benchmark (machine, tune) run; the benchmark refuses, in one line.
            refusals = [line for line in lines(result) if line.startswith("error:") and CPU_BF16_REFUSAL in line]
            assert len(refusals) == 1 and refusals[0].startswith("error: precision bf16 requested"), f"{command}\n{out}"
            assert files(project) == before, command
        elif "cuda" in command and not cuda:
            # The stated one-line refusal, once, and the workspace as it was.
            assert result.returncode != 0, f"{command}\n{out}"
            refusals = [line for line in lines(result) if REFUSAL in line]
            assert len(refusals) == 1 and refusals[0].startswith("error: device cuda requested"), f"{command}\n{out}"
            assert files(project) == before, command
        else:
            assert result.returncode == 0, f"{command} exited {result.returncode}\n{out}"
            check(command, result, project)
        # The next step starts from the defaults: no command leaves other params behind.
        assert (project / "params.yaml").read_text() == defaults, f"{command} changed params.yaml"


# --- The README and the docs, fast checks ---------------------------------------------------------

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# docs/measured.md and docs/recipes.md are written by their generators (buildllm/report/measured.py,
# lab/recipes.py) from the committed files under benchmarks/, never by hand; until a generator has run on
# this branch a link to its document is allowed to wait for it.
GENERATED = {ROOT / "docs" / "measured.md", ROOT / "docs" / "recipes.md"}
# Documented before its branch is merged (issue 20 item 3); once the CLI has it, it is checked like the others.
PENDING_COMMANDS = {"verify"}
MACHINE_NAMES = re.compile(
    r"\b(EPYC|Xeon|Ryzen|Threadripper|Core i[3579]|GeForce|Quadro|Tesla|RTX ?\d+|[ABHL]\d{2,3})\b"
)
HAND_TYPED_SPEED = re.compile(r"\d[\d,.]*\s*(tokens/s|steps/s|[TG]FLOP/s)|MFU( of)? \d[\d.]*\s*%")


def fenced(text: str, language: str = "bash") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def without_comment(line: str) -> str:
    return re.sub(r"\s+#\s.*$", "", line).strip()


def block_commands(block: str) -> list[str]:
    joined = block.replace("\\\n", " ")
    return [without_comment(line) for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def documents() -> list[Path]:
    return [README, *(path for path in DOCS if path not in GENERATED)]


def test_ci_installs_and_tests_as_the_readme_says():
    """.ci/run installs from scratch and runs the tests with the README's own two set-up commands."""
    setup = fenced(section(README.read_text(), "Set-up"))
    assert len(setup) == 1, "the set-up is one bash block in the README"
    install, tests = [line for line in setup[0].splitlines() if line and not line.startswith("#")]
    assert install.endswith("dvc repro") and "pip install" in install and "pytest" in tests
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    ci_install = [line for line in ci if line.startswith("python3 -m venv")]
    ci_tests = [line for line in ci if re.match(r"(\. \.venv/bin/activate && )?python -m pytest", line)]
    assert len(ci_install) == 1 and install.startswith(ci_install[0]), (install, ci_install)
    assert len(ci_tests) == 1 and tests.endswith(ci_tests[0]), (tests, ci_tests)


def test_the_readme_course_route_is_the_tested_walkthrough():
    """Each command of the README's five steps is run by the walkthrough test; a comparison names
    experiments the walkthrough makes."""
    route = section(README.read_text(), "The course route")
    steps = re.findall(r"\n\*\*\d\. ", route)
    assert len(steps) == 5, "five steps"
    commands = [command for block in fenced(route) for command in block_commands(block)]
    walked = {without_comment(command) for command in walkthrough((ROOT / WALKTHROUGH).read_text())}
    made = {name for command in walked for name in re.findall(r"-n (\S+)", command)}
    assert len(commands) >= 5
    for command in commands:
        if command.startswith("buildllm compare"):
            names = re.sub(r"--out \S+", "", command).split()[2:]
            assert names and set(names) <= made, f"{command}: the walkthrough makes {sorted(made)}"
        else:
            assert command in walked, f"README command not in {WALKTHROUGH}: {command}"


def _help(*command: str) -> str:
    return run([sys.executable, "-m", "buildllm", *command, "--help"], ROOT).stdout


def test_every_documented_buildllm_command_and_flag_exists():
    """Each `buildllm COMMAND --flag` in the README and the docs is a command with that flag."""
    choices = re.search(r"\{([a-z,-]+)\}", _help())
    known = set(choices.group(1).split(",")) if choices else set()
    assert {"train", "benchmark", "compare"} <= known, known
    used: dict[str, set] = {}
    for path in documents():
        text = path.read_text()
        spans = re.findall(r"`(buildllm [^`]+)`", text)
        spans += [line for block in fenced(text) for line in block_commands(block) if line.startswith("buildllm ")]
        for span in spans:
            words = span.split()
            if len(words) > 1 and not words[1].isupper() and not words[1].startswith("-"):
                used.setdefault(words[1], set()).update(w.split("=")[0] for w in words[2:] if w.startswith("--"))
    for command, flags in sorted(used.items()):
        if command not in known:
            assert command in PENDING_COMMANDS, f"documented command `buildllm {command}` does not exist"
            continue
        text = _help(command)
        missing = [flag for flag in flags if not re.search(rf"{re.escape(flag)}\b", text)]
        assert not missing, f"buildllm {command} has no {missing}"


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_lead_to_files_and_headings():
    for path in documents():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if linked in GENERATED and not linked.exists():
                continue
            assert linked.exists(), f"{path.name}: {target} does not exist"
            if anchor:
                headings = {_slug(h) for h in re.findall(r"^#+ (.*)$", linked.read_text(), flags=re.M)}
                assert anchor in headings, f"{path.name}: no heading #{anchor} in {file}"


# The README's headline of measured speed-ups is written by the generator (buildllm/report/measured.py)
# between these markers; tests/report/test_measured.py checks it against the committed files.
HEADLINE = re.compile(r"<!-- measured:.*?<!-- /measured -->", flags=re.S)


def test_the_readme_is_short_and_the_docs_hold_no_hand_typed_figures():
    assert len(README.read_text().splitlines()) <= 200
    for path in documents():
        text = HEADLINE.sub("", path.read_text())
        assert not MACHINE_NAMES.search(text), f"{path.name}: a machine's name: {MACHINE_NAMES.search(text).group(0)}"
        assert not HAND_TYPED_SPEED.search(text), f"{path.name}: {HAND_TYPED_SPEED.search(text).group(0)}"


def test_the_readme_headline_quotes_the_generated_page():
    """Each figure of the README's headline (tokens/s, MFU, speed-up and interval, loss) is on
    docs/measured.md, so the README quotes the committed record and nothing else."""
    found = HEADLINE.findall(README.read_text())
    assert len(found) == 1, "one generated headline block"
    figures = re.findall(r"\d[\d,]*\.?\d*[×%]?", re.sub(r"\]\([^)]*\)|`[^`]*`", "", found[0]))
    page = (ROOT / "docs" / "measured.md").read_text()
    assert figures and all(f in page for f in figures), [f for f in figures if f not in page]
