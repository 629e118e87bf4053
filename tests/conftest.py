"""Shared fixtures: a throw-away copy of the project in a git repo, for tests that run real DVC."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from filelock import FileLock

from buildllm.device import cpu_bf16

ROOT = Path(__file__).resolve().parents[1]
# Tests live in one folder per package; their shared helpers (this file, train_fixtures) live here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
# What a DVC run needs from the checkout; the package itself is installed (editable) in the venv.
PROJECT_FILES = ["dvc.yaml", "params.yaml", "stages", ".dvc/config", ".dvcignore", ".gitignore", "buildllm"]


# The files whose tests take a minute or more in CI (fresh clone, 2 cores, `--durations`), in the
# order xdist should hand them out: the longest first, so the short files fill in around them at the
# end instead of one worker finishing the run alone on a seven-minute test. The session's shared
# pipelines (bounded_repro, default_run) are built by the first file of each group below, and their
# other users come after it in the order, so they start once it is built rather than beside it.
LONGEST_FIRST = [
    "docs/test_readme.py",  # the walkthrough, about 6 minutes
    "report/test_compare_e2e.py",  # builds bounded_repro (about 2 minutes), then experiments_lab
    "report/test_run_card_e2e.py",  # experiments_lab's other user
    "measure/test_benchmark_gpu_check.py",
    "remote/test_git_route_e2e.py",  # bounded_run's: two experiment runs, a clone between them
    "pipeline/test_machine_stage_e2e.py",
    "pipeline/test_stage_deps_e2e.py",
    "predict/test_dry_run.py",  # builds default_run
    "measure/test_tune.py",
    "pipeline/test_tune_stage.py",
    "measure/test_batch_finder.py",
    # default_run's other user: after the files the other worker takes while it is built, not beside it
    "pipeline/test_train_pipeline.py",
    "verify/test_estimate_check.py",
    "report/test_compare_paired.py",
    "device/test_cuda.py",
    "model/test_fused_loss.py",
    "train/test_train.py",
    "train/test_distributed.py",
    "verify/test_mfu_check.py",
]
# A renamed or removed file would silently lose its place in the order: say so at once instead.
assert all((Path(__file__).parent / name).is_file() for name in LONGEST_FIRST), (
    "tests/conftest.py: LONGEST_FIRST names a missing file"
)


def pytest_configure(config) -> None:
    # xdist's loadfile would otherwise hand out the files with the most tests first, whatever they cost.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items) -> None:
    """The files of LONGEST_FIRST in its order, then the other slow end-to-end tests, then the rest;
    within each part the order stays as collected (xdist hands out whole files in this order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item) -> tuple:
        name = Path(str(item.path)).relative_to(Path(__file__).parent).as_posix()
        return (rank.get(name, len(rank)), item.get_closest_marker("slow") is None)

    items.sort(key=key)


def run_env() -> dict:
    env = dict(os.environ)
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        HF_HUB_OFFLINE="1",
        GIT_AUTHOR_NAME="BuildLLM Test",
        GIT_AUTHOR_EMAIL="test@buildllm.local",
        GIT_COMMITTER_NAME="BuildLLM Test",
        GIT_COMMITTER_EMAIL="test@buildllm.local",
    )
    return env


def run(cmd: list[str], cwd: Path, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=run_env(), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def copy_project(dest: Path) -> Path:
    """The project's pipeline files in `dest`, committed in a fresh git repo with DVC initialised."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "tmp"))
        elif source.exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    # The tune stage, which every planning stage depends on, at its least budget: its own tests run it
    # longer (tests/measure/test_tune.py, tests/pipeline/test_tune_stage.py).
    params = dest / "params.yaml"
    params.write_text(re.sub(r"(?m)^(tune:.*\n(?:  .*\n)*?  seconds: )[0-9.]+", r"\g<1>5.0", params.read_text()))
    run(["git", "init", "-q", "-b", "main"], dest)
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-qm", "project copy for a test"], dest)
    return dest


def use_docs_corpus(project: Path) -> None:
    """Point the project copy at a small user corpus (60 of Python's documentation topics as .txt
    files under my_texts/, corpus name python_docs), tokenized with vocabulary 4096 alone: real
    stages, short runs."""
    from pydoc_data.topics import topics

    import yaml

    (project / "my_texts").mkdir()
    for title in sorted(topics)[:60]:
        (project / "my_texts" / f"{title}.txt").write_text(topics[title])
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["corpus"].update(source="files", files=["my_texts/*.txt"], name="python_docs")
    params["tokenize"]["vocabularies"] = [4096]  # too little text for 16384 tokens, and no run here uses them
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def set_params(project: Path, values: dict) -> None:
    """Write dotted-key values (e.g. "train.training_examples") into the project copy's params.yaml."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    for dotted, value in values.items():
        *parents, leaf = dotted.split(".")
        node = params
        for part in parents:
            node = node[part]
        node[leaf] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def clone_project(source: Path, dest: Path) -> Path:
    """A copy of a reproduced project copy, with its git history, DVC cache and outputs: tests that
    start from one shared pipeline run each work on their own copy, so none can spoil another's."""
    shutil.copytree(source, dest, symlinks=True)
    return dest


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


# The whole bounded pipeline (tiny preset, a few steps and examples), reproduced once per session.
BOUNDED = {
    "preset": "tiny",
    "benchmark.warmup_steps": 1,
    "benchmark.measured_steps": 4,
    "benchmark.intervals": 2,
    "train.training_examples": 256,
    "train.validation_examples": 32,
    "train.log_interval": 2,
    "train.eval_interval": 4,
    "train.checkpoint_interval": 8,
    "tokenize.vocabularies": [4096],  # tiny's: 16384 (iterations 2 and 3) would add about 15 s to each build
}


def once_per_run(tmp_path_factory, name: str, make) -> tuple[Path, str]:
    """(folder, output) of `make(folder)`, made once per test run. Under xdist every worker has a
    session of its own: the first worker to ask makes it in the run's shared temporary folder, the
    others wait for it and then read the same folder (each test works on its own clone_project)."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's folder, above each worker's own
    folder, output = root / name, root / f"{name}.out"
    with FileLock(str(root / f"{name}.lock")):
        if not output.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what an attempt that failed left
            text = make(folder)
            output.write_text(text)
    return folder, output.read_text()


@pytest.fixture(scope="session")
def bounded_repro(tmp_path_factory) -> tuple[Path, str]:
    """A project copy with BOUNDED params after a full `dvc repro`, committed, and that command's
    stdout: the baseline that the run-card, compare and machine-stage tests start from (each on its
    own clone_project of it). Running the same pipeline with the same params once instead of once
    per module saves minutes on 2 cores."""

    def make(folder: Path) -> str:
        project = copy_project(folder)
        set_params(project, BOUNDED)
        out = run(["dvc", "repro"], project).stdout
        run(["git", "add", "-A"], project)
        run(["git", "commit", "-qm", "baseline: the bounded pipeline, run"], project)
        return out

    return once_per_run(tmp_path_factory, "bounded", make)


@pytest.fixture(scope="session")
def bounded_run(bounded_repro) -> Path:
    return bounded_repro[0]


def queue_workers(repo: Path) -> list[psutil.Process]:
    """The DVC queue workers (`dvc exp queue-worker`) that `dvc queue start` left running in `repo`."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        if "queue-worker" in (process.info["cmdline"] or []) and process.info["cwd"] == str(repo.resolve()):
            found.append(process)
    return found


def wait_for_queue(repo: Path, timeout: float = 900) -> str:
    """`dvc queue status` once nothing is Queued or Running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The worker exits when the queue is empty. Waiting on it costs nothing, where every `dvc queue
        # status` costs about a second of CPU that the queued runs need on 2 cores.
        psutil.wait_procs(queue_workers(repo), timeout=max(0.0, deadline - time.monotonic()))
        status = run(["dvc", "queue", "status"], repo).stdout
        if not any(word in status for word in ("Queued", "Running")):
            return status
        time.sleep(3)
    raise AssertionError(f"queue still busy after {timeout} s:\n{status}")


# The experiments of the lab below, each with its settings (bf16 only on a CPU with a bf16 matmul path).
LAB_RUNS = {"cpu-fp32": "precision=fp32", **({"cpu-bf16": "precision=bf16"} if cpu_bf16.native_bf16() else {})}
LAB_QUEUED = {
    "cpu-bs8": ("device=cpu", "precision=fp32", "train.batch_size=8"),
    "cuda-bf16": ("device=cuda", "precision=bf16"),
}


@pytest.fixture(scope="session")
def experiments_lab(bounded_run, tmp_path_factory) -> tuple[Path, str]:
    """(the lab's project, `dvc queue status` after its queue ran), made once per test run from the
    bounded pipeline and read by the compare and run-card tests, each on its own clone_project.

    The project has a DVC remote beside it (`dvc-store`, which only the compare tests push to) and four
    experiments of its one commit: first two through the queue from the clean baseline, `benchmark
    estimate` only (fp32 at batch 8, and a cuda run that fails on a CUDA-less machine); then LAB_RUNS
    as whole-pipeline runs (`dvc exp run`, no --temp), each applied to the workspace in turn, so the
    workspace holds the last one's outputs, run card included. The queue goes first because a queued
    run starts from the workspace's tracked files: after a whole run it would carry that run's files."""

    def make(folder: Path) -> str:
        project = clone_project(bounded_run, folder / "laptop")
        # An absolute path: DVC resolves a relative one against the filesystem's root in `dvc exp push`.
        run(["dvc", "remote", "add", "-d", "store", str(folder / "dvc-store")], project)
        run(["git", "commit", "-qam", "a DVC remote"], project)
        for name, settings in LAB_QUEUED.items():
            sets = [arg for item in settings for arg in ("-S", item)]
            run(["dvc", "exp", "run", "--queue", "-n", name, *sets, "benchmark", "estimate"], project)
        run(["dvc", "queue", "start"], project)
        status = wait_for_queue(project)
        for name, setting in LAB_RUNS.items():
            run(["dvc", "exp", "run", "-n", name, "-S", "device=cpu", "-S", setting], project)
        return status

    folder, status = once_per_run(tmp_path_factory, "experiments", make)
    return folder / "laptop", status


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """A tokenizer and train/validation token files for the tiny preset, made once per test session."""
    from train_fixtures import make_token_files

    return make_token_files(tmp_path_factory.mktemp("tokens"))


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory (metrics/ and plots/ are written relative to it)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def check_params(tokens, workdir) -> Path:
    """For the `buildllm verify` tests: a params file pointing at the test token files, small and on one thread."""
    params = {
        "preset": "tiny",
        "device": "cpu",
        "train": {
            "threads": 1,
            "batch_size": 16,
            "validation_examples": 16,
            "eval_interval": 10,
            "checkpoint_interval": 20,
            "log_interval": 5,
            "train_tokens": str(tokens["train"]),
            "validation_tokens": str(tokens["validation"]),
            "tokenizer": str(tokens["tokenizer"]),
        },
        "benchmark": {"warmup_steps": 1, "measured_steps": 4, "intervals": 2},
    }
    path = workdir / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> tuple[Path, str]:
    """A project copy on the defaults (iteration 1, the real default corpus, its vocabulary 4096
    alone) with the train stage's own bound of 500 examples (the default trains 8000) and the
    bounded pipeline's benchmark (9 steps, not 83), after `dvc repro train`, and that command's
    stdout. The train-pipeline test checks the run; the dry-run test starts its stage from it, each
    on its own clone_project, so neither runs corpus, tokenize and tune for the same params again."""

    def make(folder: Path) -> str:
        project = copy_project(folder)
        benchmark = {key: value for key, value in BOUNDED.items() if key.startswith("benchmark.")}
        set_params(project, {"train.training_examples": 500, "tokenize.vocabularies": [4096], **benchmark})
        return run(["dvc", "repro", "train"], project).stdout

    return once_per_run(tmp_path_factory, "default", make)


# bf16 on the CPU runs only where the CPU has a bf16 matmul path (buildllm/device/cpu_bf16.py); on
# others it is refused, and a bf16 run there would take a generic kernel tens of times slower.
needs_cpu_bf16 = pytest.mark.skipif(
    not cpu_bf16.native_bf16(),
    reason="this CPU has no bf16 matmul path: bf16 is refused here (tests/device/test_resolution.py checks that)",
)


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    """Plan and decision logic as on a CPU with a bf16 matmul path, whatever this CPU is (a bf16
    matmul that runs here takes this CPU's own kernel)."""
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: True)
