"""The GPU check's runner (scripts/gpu_check.sh starts it): the route a user takes on a rented GPU
machine, in one call that brings the runs home as one archive of DVC runs.

In value order: the environment; the CUDA tests; the recipes' time to a quality (their whole record
in results.jsonl: the files that may come back are few); DVC installed from the carried wheelhouse
(the machine has no network); then the experiments, each a `buildllm pack-run` (dvc repro of its
stages, its params.yaml, dvc.lock and metrics added to runs.tar.gz the moment it ends):

    recipes-it1      classic against muon at iteration 1, trained against the clock (lab/recipes.py,
    recipes-it1-b16  3 rounds taking turns): the time each takes to a common validation bits per
                     byte, at the GPU route's own batch, then at the CPU comparisons' batch of 16
    cuda-it3-bf16    iteration 3 in bf16 at the batch the finder chose (finder-it3), the tune
                     stage first with the time to measure torch.compile (TUNE): compiled where
                     tune measures that it pays for a run of about 1,000 steps
    verify-speed-it3 `buildllm verify speed` at iteration 3: the product's step against a bare one
                     (skipped where the tree has no such command)
    cuda-course      the course's comparison: iteration 1, fp32, batch 4, 1 epoch, 500 training and
                     100 validation examples, benchmarked and trained
    cuda-it1-fp32    iteration 1 at the CPU default's controls (batch 16, the default examples and
    cuda-it1-bf16    steps), fp32 then bf16
    cuda-it2-bf16    iteration 2 in bf16 at the finder's batch (finder-it2), tune first

At home, `python scripts/gpu_home.py OUT` imports them and writes the CPU-vs-CUDA report.

The budget is true: its clock starts in gpu_check.sh before any Python imports torch
(GPU_CHECK_T0), a step starts only when 1.3x its estimate fits in what is left of
GPU_CHECK_BUDGET_S (default 520 s), and a step still running when the budget ends is killed
with its processes and recorded as "cut" (a budget's verdict, not a code failure). Files under
the output folder ($GPU_CHECK_OUT, else $OUT, else ./gpu_check_out), each complete after every step:

    runs.tar.gz     the finished runs (buildllm/remote/archive.py)
    results.jsonl   one JSON line per step: name, status, seconds, its estimate, its figures
    summary.txt     the one-screen table, rewritten after each step
    log.txt         every step's command and output
    env.json        `buildllm env --json`
    pytest.log      the CUDA tests' output

Statuses: ok; refused (an expected refusal, by name); skipped (did not fit, or what it needs is
missing); cut (killed by the budget); miss (a crash, a config error, a NaN, a failed test). Any
miss: exit 1. GPU_CHECK_STEPS=name,name runs only those steps (env always runs).
GPU_CHECK_DEVICE=cpu runs the same route on the CPU with preset tiny and tiny bounds: the stand-in
that rehearses it (tests/measure/test_benchmark_gpu_check.py).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # buildllm from the tree: the GPU machine has it only there
from buildllm.remote import archive  # noqa: E402

PY = sys.executable
HEADROOM = 1.3  # a step starts only when this many times its estimate fits in what is left
# What each run measures beyond its -S values: the stand-in's tiny bounds (both sides of a
# comparison use the same, so the controls still match).
TINY = ["preset=tiny", "benchmark.warmup_steps=1", "benchmark.measured_steps=2", "benchmark.intervals=1"]
FINDER = {
    "cuda": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1, "max_batch_size": 128},
    "cpu": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1, "max_batch_size": 2},
}
VOCAB = {1: 4096, 2: 16384, 3: 16384}
# The tune stage's budget and the run it plans for. Iteration 3 on CUDA: 150 s, so torch.compile is
# measured after precision (about 45 s at gpt_100m, batch 128 on an H200), in a window of about 85 s
# (a compile took 31 s there, the child's start and both trainers' warm-up more); and 150 epochs of
# the carried token file (990 windows: 7 steps an epoch at batch 128), a run of about 1,000 steps,
# long enough for a compile measured at +26% to pay back its time (its break-even was about 600
# steps at the median), so the default route is judged where compiling can pay.
TUNE = {
    "cuda": {3: ["tune.seconds=150", "train.epochs=150"], 2: ["tune.seconds=40"]},
    "cpu": {3: ["tune.seconds=20"], 2: ["tune.seconds=20"]},
}
REFUSALS = {"bf16_on_cpu": "no bf16 matmul path"}


@dataclass
class Step:
    name: str
    cost: float  # seconds, estimated for this device (the results record the real ones beside)
    command: object  # list[str], or a function of the results so far returning one (or a skip reason)
    kind: str = "run"  # env | pytest | install | recipes | pack | finder | verify
    refusal: str | None = None  # the name of an expected refusal (REFUSALS)
    record: str | None = None  # a recipes step's record name (lab/recipes.py writes <record>.json)


def environment(step: str = "", work: Path | None = None) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the GPU machine's pytest has no plugins; take none here
    }
    if work is not None:
        # Each step's torch.compile caches in its own folder: two processes sharing inductor's and
        # triton's default cache (/tmp/torchinductor_$USER) can read each other's half-written
        # files, which made a compiled stand-in step fail under the parallel suite.
        cache = work / "caches" / step
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
    return env


def cpu_refuses_bf16() -> bool:
    """On a CPU without a bf16 matmul path the plan refuses bf16 (buildllm/device/cpu_bf16.py)."""
    done = subprocess.run(
        [PY, "-m", "buildllm", "env", "--device", "cpu", "--json"], capture_output=True, text=True, env=environment()
    )
    return '"cpu_bf16_native": true' not in done.stdout


def pack(name: str, overrides: list[str], stages: list[str], out: Path) -> list[str]:
    sets = [flag for item in overrides for flag in ("-S", item)]
    return [PY, "-m", "buildllm", "pack-run", name, *sets, "--stages", *stages, "--into", str(out / "runs.tar.gz")]


def recipes(name: str, device: str, batch: int | None) -> Step:
    """Classic against muon at iteration 1 by time to a quality (lab/recipes.py): at the route's own
    batch (None) or at `batch`, fp32 and eager on both sides, the machine's own thread count; the
    stand-in trains preset tiny on a few examples, one round."""
    cpu = device == "cpu"
    model = "preset=tiny train.training_examples=32 train.validation_examples=8" if cpu else "iteration=1"
    shared = f"device={device} {model} train.compile=false" + (f" train.batch_size={batch}" if batch else "")
    command = [PY, "-m", "lab.recipes", "run", "--rounds", "1" if cpu else "3", "--threads", "0"]
    record = f"{name}-{device}-{datetime.date.today().isoformat()}"
    command += ["--name", record]
    for recipe in ("classic", "muon"):
        command += ["--recipe", recipe, f"{shared} train.recipe={recipe}"]
    # Guessed, not measured: six fresh `train` processes at iteration 1, each under the 37 s the H200
    # took on 2026-12-04 for the course's benchmark, estimate and 125-step train under dvc.
    cost = 40 if cpu else (90 if batch is None else 110)
    return Step(name, cost, command, kind="recipes", record=record)


def steps(device: str, out: Path) -> list[Step]:
    cpu = device == "cpu"
    bounds = TINY if cpu else []
    bf16_refusal = "bf16_on_cpu" if cpu and cpu_refuses_bf16() else None
    base = [f"device={device}", *bounds]
    course = ["train.batch_size=4", "train.epochs=1", "train.training_examples=500", "train.validation_examples=100"]
    if cpu:  # the stand-in trains a few examples: the route is rehearsed, not the course's figures
        course = ["train.batch_size=4", "train.epochs=1", "train.training_examples=32", "train.validation_examples=8"]
    default = ["train.batch_size=16", "train.compile=false"]
    out_steps = [
        Step("env", 10, [PY, "-m", "buildllm", "env", "--device", device, "--json"], kind="env"),
        Step(
            "cuda_tests",
            45 if cpu else 60,
            [
                PY,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                "not cuda and not slow" if cpu else "cuda",
                "tests/device/test_cuda.py",
            ],
            kind="pytest",
        ),
        recipes("recipes-it1", device, None),
        recipes("recipes-it1-b16", device, 16),
        Step("install_dvc", 60 if cpu else 40, None, kind="install"),
        Step(
            "cuda-course",
            90 if cpu else 60,
            pack(
                "cuda-course",
                [*base, "iteration=1", "precision=fp32", "train.compile=false", *course],
                ["benchmark", "estimate", "train"],
                out,
            ),
            kind="pack",
        ),
        Step(
            "cuda-it1-fp32",
            60 if cpu else 40,
            pack("cuda-it1-fp32", [*base, "iteration=1", "precision=fp32", *default], ["benchmark", "estimate"], out),
            kind="pack",
        ),
        Step(
            "cuda-it1-bf16",
            60 if cpu else 40,
            pack("cuda-it1-bf16", [*base, "iteration=1", "precision=bf16", *default], ["benchmark", "estimate"], out),
            kind="pack",
            refusal=bf16_refusal,
        ),
    ]
    runs, out_steps = out_steps[5:], out_steps[:5]  # env, tests, recipes, DVC; the runs after iteration 3
    for iteration in (3, 2):
        finder = f"finder-it{iteration}"
        model = ["--preset", "tiny"] if cpu else ["--iteration", str(iteration)]
        vocab = 4096 if cpu else VOCAB[iteration]
        tokens = ROOT / "data" / "tokens" / str(vocab) / f"wiki_vital_{vocab}"  # buildllm/paths.py's layout
        out_steps.append(
            Step(
                finder,
                60 if cpu else 30,
                [
                    "benchmark",
                    *model,
                    "--precision",
                    "bf16",
                    "--find-batch-size",
                    "--train-tokens",
                    str(tokens / "train_tokens.pt"),
                    "--validation-tokens",
                    str(tokens / "validation_tokens.pt"),
                ],
                kind="finder",
                refusal=bf16_refusal,
            )
        )

        def at_found(results, iteration=iteration, finder=finder):
            found = (results.get(finder, {}).get("figures") or {}).get("found_batch_size")
            if not found:
                return f"{finder} found no batch"
            sets = [
                *base,
                f"iteration={iteration}",
                "precision=bf16",
                f"train.batch_size={found}",
                "train.compile=auto",
                *TUNE[device][iteration],
            ]
            return pack(f"cuda-it{iteration}-bf16", sets, ["tune", "benchmark", "estimate"], out)

        cost = 120 if cpu else {3: 230, 2: 90}[iteration]
        out_steps.append(Step(f"cuda-it{iteration}-bf16", cost, at_found, kind="pack"))
        if iteration == 3:
            out_steps.append(Step("verify-speed-it3", 60 if cpu else 75, partial(verify_speed, device), kind="verify"))
            out_steps += runs  # then the course's and iteration 1's runs, and iteration 2 last
    return out_steps


def verify_speed(device: str, results: dict) -> list[str] | str:
    """`buildllm verify speed` at iteration 3 (the product's step against a bare one), at the finder's
    batch where the command takes one; a skip reason where this tree has no such command yet."""
    found = (results.get("finder-it3", {}).get("figures") or {}).get("found_batch_size")
    command = [PY, "-m", "buildllm", "verify", "speed"]
    shown = subprocess.run([*command, "--help"], capture_output=True, text=True, env=environment())
    if shown.returncode != 0:
        return "`buildllm verify speed` is not in this tree"
    model = ["--preset", "tiny"] if device == "cpu" else ["--iteration", "3"]
    batch = ["--batch-size", str(found)] if found and "--batch-size" in shown.stdout else []
    return [*command, *model, "--device", device, *batch]


def finite(value) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


class Runner:
    def __init__(self, device: str, budget: float, out: Path, started: float):
        self.device, self.budget, self.out, self.started = device, budget, out, started
        self.results: dict[str, dict] = {}
        self.work = Path(tempfile.mkdtemp(prefix="buildllm-gpu-check-"))
        out.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "log.txt"):
            (out / name).write_text("")
        (out / "runs.tar.gz").unlink(missing_ok=True)  # this call's runs only

    def elapsed(self) -> float:
        return time.time() - self.started  # wall clock since gpu_check.sh began, torch's import included

    def log(self, text: str) -> None:
        with open(self.out / "log.txt", "a") as handle:
            handle.write(text if text.endswith("\n") else text + "\n")

    def record(self, step: Step, status: str, seconds: float, note: str = "", figures: dict | None = None) -> None:
        entry = {
            "name": step.name,
            "status": status,
            "seconds": round(seconds, 1),
            "estimate_seconds": step.cost,
            "elapsed_seconds": round(self.elapsed(), 1),
            "note": note,
            "figures": figures or {},
        }
        self.results[step.name] = entry
        with open(self.out / "results.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        print(f"[gpu_check {self.elapsed():.0f}s] {step.name}: {status} {note}".rstrip(), flush=True)
        write_atomic(self.out / "summary.txt", summary(self.results.values(), self.device, self.budget, self.elapsed()))

    def command(self, step: Step) -> list[str] | str:
        if step.kind == "install":
            if importlib.util.find_spec("dvc") is not None:
                return "DVC is installed in this Python already"
            wheels = ROOT / "wheelhouse"
            if not wheels.is_dir():
                return "no DVC here and no wheelhouse/ carried (buildllm wheelhouse makes one)"
            return [PY, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), "dvc"]
        return step.command(self.results) if callable(step.command) else step.command

    def run(self, step: Step) -> None:
        command = self.command(step)
        if isinstance(command, str):
            return self.record(step, "skipped" if step.kind != "install" or "no DVC" in command else "ok", 0, command)
        left = self.budget - self.elapsed()
        if HEADROOM * step.cost > left:
            return self.record(step, "skipped", 0, f"needs {HEADROOM} x {step.cost:.0f} s, {left:.0f} s left")
        json_path, cwd = None, ROOT
        if step.kind == "finder":
            cwd = self.work / step.name
            (cwd / "metrics").mkdir(parents=True)
            (cwd / "params.yaml").write_text(yaml.safe_dump({"benchmark": FINDER[self.device]}))
            command = [PY, "-m", "buildllm", *command, "--device", self.device]
            json_path = cwd / "metrics" / "batch_size.json"
        if step.kind == "recipes":
            folder = self.work / step.name
            command = [*command, "--out", str(folder)]
            json_path = folder / f"{step.record}.json"
        self.log(f"\n=== {step.name}: {' '.join(command)}")
        began = time.monotonic()
        # Its own process group: a cut kills DVC's stage processes too, not only their parent.
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=environment(step.name, self.work),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            self.log(output or "")
            return self.record(
                step, "cut", time.monotonic() - began, f"cut by the budget: still running after {left:.0f} s"
            )
        except BaseException:  # a SIGTERM's SystemExit or a Ctrl-C: the step's own processes go too
            os.killpg(process.pid, signal.SIGKILL)
            raise
        seconds = time.monotonic() - began
        output = "".join(line + "\n" for line in output.splitlines() if "\r" not in line)
        self.log(output)
        if step.kind == "env" and process.returncode == 0:
            write_atomic(self.out / "env.json", output[output.index("{") :] if "{" in output else output)
        if step.kind == "pytest":
            write_atomic(self.out / "pytest.log", output)
        figures = json.loads(json_path.read_text()) if json_path and json_path.exists() else {}
        if step.kind == "pack":
            figures = pack_figures(self.out / "runs.tar.gz", step.name)
        if step.kind == "recipes" and figures:
            figures = recipe_figures(json_path.stem, figures)
        status, note = judge(step, process.returncode, output, figures)
        self.record(step, status, seconds, note, figures)

    def go(self, chosen: list[Step]) -> int:
        # A SIGTERM (the device tool's limit, a timeout) unwinds through the finally below, which removes
        # the scratch folder, and through run(), which kills the step's processes; by default it would
        # leave both behind.
        previous = signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
        try:
            for step in chosen:
                self.run(step)
        finally:  # what the steps wrote there that matters is already in out/
            shutil.rmtree(self.work, ignore_errors=True)
            signal.signal(signal.SIGTERM, previous)
        print(summary(self.results.values(), self.device, self.budget, self.elapsed()), flush=True)
        return 1 if any(r["status"] == "miss" for r in self.results.values()) else 0


def pack_figures(archive_path: Path, name: str) -> dict:
    """The run's benchmark figures as the archive holds them (what comes home is what is judged)."""
    if not archive_path.exists():
        return {}
    run = next((r for r in archive.read(archive_path) if r.name == name), None)
    data = run.files.get("metrics/benchmark.json") if run else None
    return json.loads(data) if data else {}


def recipe_figures(name: str, record: dict) -> dict:
    """The comparison's outcome flat (the target, each recipe's median time and ratio) and the whole
    record under "record", which gpu_home.py files under benchmarks/recipes/."""
    from lab.recipes import summarise

    found = summarise(record)
    figures = {"target_bits_per_byte": found["target"]}
    for recipe, entry in found["recipes"].items():
        figures |= {f"{recipe}_{key}": entry[key] for key in ("median_seconds", "ratio") if key in entry}
    return {**figures, "name": name, "record": record}


def judge(step: Step, code: int, output: str, figures: dict) -> tuple[str, str]:
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    if step.refusal:
        if code != 0 and REFUSALS[step.refusal] in output:
            return "refused", f"expected: {step.refusal}"
        return "miss", f"expected the refusal {step.refusal}, got exit code {code}: {last[:120]}"
    if code != 0:
        what = {2: "refused or a config error", 3: "the run failed (non-finite loss, out of memory, a stage)"}
        return "miss", f"exit code {code} ({what.get(code, 'crashed')}): {last[:160]}"
    if step.kind == "pytest" and (" passed" not in last or "failed" in last or "error" in last):
        return "miss", f"not every selected test passed: {last[:160]}"
    bad = [key for key, value in figures.items() if not finite(value)]
    if bad:
        return "miss", f"non-finite figures: {', '.join(bad[:5])}"
    if step.kind == "pack" and not figures.get("tokens_per_second", 0) > 0:
        return "miss", "the run brought home no tokens/s"
    if step.kind == "recipes" and "record" not in figures:
        return "miss", "the comparison wrote no record"
    if step.kind == "finder" and not figures.get("found_batch_size", 0) >= 1:
        return "miss", "no batch size fits"
    return "ok", last[:100] if step.kind in ("pytest", "verify") else ""


def summary(results, device: str, budget: float, elapsed: float) -> str:
    lines = [
        f"gpu_check on {device}: {elapsed:.0f} s of a {budget:.0f} s budget",
        f"{'step':<20}{'status':<9}{'s':>6}{'est':>6}{'tok/s':>12}{'MFU':>7}{'peak MiB':>10}{'batch':>7}",
    ]
    for r in results:
        f = r["figures"]
        row = f"{r['name']:<20}{r['status']:<9}{r['seconds']:>6.0f}{r['estimate_seconds']:>6.0f}"
        if "tokens_per_second" in f:
            row += (
                f"{f['tokens_per_second']:>12,.0f}{f.get('mfu', 0):>7.1%}"
                f"{f.get('peak_memory_bytes', 0) / 2**20:>10.0f}{f.get('batch_size', 0):>7}"
            )
        elif "found_batch_size" in f:
            row += f"  found batch {f['found_batch_size']} in {f.get('tries')} tries"
        elif "muon_ratio" in f:
            row += f"  muon {f['muon_ratio']:.2f}x classic's time to {f['target_bits_per_byte']:.3f} bits/byte"
        if r["note"] and (r["status"] != "ok" or r["name"].startswith("verify")):
            row += f"  {r['note'][:70]}"
        lines.append(row)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "refused", "skipped", "cut", "miss")}
    verdict = "  -> FAILED" if counts["miss"] else "  -> passed"
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + verdict)
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main() -> int:
    started = float(os.environ.get("GPU_CHECK_T0") or time.time())
    device = os.environ.get("GPU_CHECK_DEVICE", "cuda")
    if device not in ("cuda", "cpu"):
        print(f"error: GPU_CHECK_DEVICE={device!r}; use cuda or cpu", file=sys.stderr)
        return 2
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S", "520"))
    out = Path(os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT") or ROOT / "gpu_check_out").resolve()
    chosen = steps(device, out)
    if only := os.environ.get("GPU_CHECK_STEPS"):  # a rerun of named steps (env always runs)
        names = set(only.split(","))
        unknown = names - {s.name for s in chosen}
        if unknown:
            print(
                f"error: GPU_CHECK_STEPS names no step {sorted(unknown)}; see results.jsonl for the names",
                file=sys.stderr,
            )
            return 2
        chosen = [s for s in chosen if s.name == "env" or s.name in names]
    return Runner(device, budget, out, started).go(chosen)


if __name__ == "__main__":
    sys.exit(main())
