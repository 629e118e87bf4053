"""The GPU check's runner (scripts/gpu_check.sh starts it): staged steps in value order, each with a
cost estimate, run only while it fits the time left, each result written the moment it is known.

A lent GPU gives 15 minutes of device time in all, the machine's start included, at most 10 per
command, and brings back at most 8 files. So the check runs as two calls of at most 5 minutes each
(GPU_CHECK_PART=1, then 2), each under GPU_CHECK_BUDGET_S seconds (default 285), and writes only
these files, each complete after every step (a kill keeps everything finished before it):

    results.jsonl   one JSON line per step: name, status, seconds, its estimate, its figures
    summary.txt     the one-screen table, rewritten after each step
    log.txt         every step's command and output
    env.json        `buildllm env --json`
    pytest.log      the CUDA tests' output

Statuses: ok; refused (an expected refusal, named by its message: fp16 on the CPU, and bf16 on a CPU
without a bf16 matmul path); skipped (did
not fit the time left, or what it needs is missing); miss (a crash, a config error, a NaN, a
failed test, a truth check's miss, a step that overran the time left). Any miss: exit 1.

GPU_CHECK_STEPS=name,name reruns only those steps (after a miss, in the time left).
GPU_CHECK_DEVICE=cpu runs every step on the CPU with preset tiny (the stand-in of the GPU machine,
tests/measure/test_benchmark_gpu_check.py); GPU_CHECK_OUT (else $OUT, else ./gpu_check_out) is
where the files go.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

# ---- Where the check calls `buildllm verify` (being added beside this script). The lead adjusts
# ---- the flags here on merge; until the CLI offers `verify`, the scripts it replaces run instead.
VERIFY = {
    "memory": {
        "cuda": [
            "--precision",
            "bf16",
            "--sets",
            "fitted",
            "--profiles",
            "gpt_first_cpu",
            "gpt_42m",
            "--batch-sizes",
            "8",
            "--repeats",
            "1",
        ],
        "cpu": [
            "--precision",
            "fp32",
            "--sets",
            "fitted",
            "--profiles",
            "tiny",
            "--batch-sizes",
            "8",
            "--repeats",
            "1",
        ],
    },
    "estimate": {
        "cuda": [
            "--iteration",
            "1",
            "--precision",
            "bf16",
            "--warmup-steps",
            "2",
            "--measured-steps",
            "10",
            "--intervals",
            "2",
            "--factor",
            "5",
        ],
        "cpu": [
            "--preset",
            "tiny",
            "--warmup-steps",
            "1",
            "--measured-steps",
            "4",
            "--intervals",
            "2",
            "--factor",
            "3",
            "--threads",
            "1",
        ],
    },
}


def verify_command(what: str, device: str, json_path: Path) -> list[str]:
    flags = [*VERIFY[what][device], "--device", device]
    return [PY, "-m", "buildllm.cli", "verify", what, *flags, "--out", str(json_path)]


# ---- Where the check asks for the plain (unfused) loss; the fused-loss work names the flag. Until
# ---- `benchmark` offers it, the fused-against-plain steps are skipped, by name.
PLAIN_LOSS = ["--loss", "plain"]
# ----

# Bounded runs: what each benchmark measures (its own params.yaml in a scratch folder).
BOUNDS = {
    "cuda": {
        "benchmark": {"warmup_steps": 2, "measured_steps": 10, "intervals": 2},
        "train": {"training_examples": 512, "validation_examples": 64},
    },
    "cpu": {
        "benchmark": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1},
        "train": {"training_examples": 64, "validation_examples": 16, "threads": 1},
    },
}
FINDER = {
    "cuda": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1, "max_batch_size": 128},
    "cpu": {"warmup_steps": 1, "measured_steps": 2, "intervals": 1, "max_batch_size": 2},
}
# What each model label means, and its vocabulary (the carried data/tokens/wiki_vital_<vocab>).
MODELS = {
    "it1": (["--iteration", "1"], 4096),
    "it2": (["--iteration", "2"], 16384),
    "it3": (["--iteration", "3"], 16384),
    "tiny": (["--preset", "tiny"], 4096),
}
REFUSALS = {"fp16_on_cpu": "precision fp16 requested on the CPU", "bf16_on_cpu": "no bf16 matmul path"}


@dataclass
class Step:
    name: str
    part: int
    cost: float  # seconds, estimated for this device (the results record the real ones beside)
    command: object  # list[str], or a function of the results so far returning one (or a skip reason)
    kind: str = "run"  # env | pytest | benchmark | finder | verify
    refusal: str | None = None  # the name of an expected refusal (REFUSALS)
    needs_flag: list[str] = field(default_factory=list)


def cli_offers(command: list[str], text: str) -> bool:
    result = subprocess.run(
        [PY, "-m", "buildllm", *command], capture_output=True, text=True, cwd=ROOT, env=environment()
    )
    return result.returncode == 0 and text in result.stdout


def environment() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }  # the GPU machine's pytest has no plugins; take none here


def tokens(vocab: int) -> list[str]:
    folder = ROOT / "data" / "tokens" / f"wiki_vital_{vocab}"
    return [
        "--train-tokens",
        str(folder / "train_tokens.pt"),
        "--validation-tokens",
        str(folder / "validation_tokens.pt"),
    ]


@functools.cache
def cpu_refuses_bf16() -> bool:
    """The stand-in on a CPU without a bf16 matmul path, where the plan refuses bf16 (buildllm/device/cpu_bf16.py)."""
    return not cli_offers(["env", "--device", "cpu", "--json"], '"cpu_bf16_native": true')


def steps(device: str) -> list[Step]:
    cpu = device == "cpu"
    big = "tiny" if cpu else "it3"
    bf16_refusal = "bf16_on_cpu" if cpu and cpu_refuses_bf16() else None
    out: list[Step] = [
        Step("env", 0, 10, [PY, "-m", "buildllm", "env", "--device", device, "--json"], kind="env"),
        # The CUDA tests only; the stand-in runs the same file's quick CPU bodies.
        Step(
            "cuda_tests",
            1,
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
    ]
    costs = {"tiny": 30, "it1": 15, "it2": 20, "it3": 25}
    for model in ["tiny"] if cpu else ["it1", "it2", "it3"]:
        for precision in ("bf16", "fp16", "fp32"):
            flags, vocab = MODELS[model]
            refusal = {"fp16": "fp16_on_cpu" if cpu else None, "bf16": bf16_refusal}.get(precision)
            out.append(
                Step(
                    f"bench_{model}_{precision}",
                    1,
                    costs[model],
                    ["benchmark", *flags, "--precision", precision, *tokens(vocab)],
                    kind="benchmark",
                    refusal=refusal,
                )
            )
    flags, vocab = MODELS[big]
    out.append(
        Step(
            f"finder_{big}_bf16",
            2,
            60 if cpu else 45,
            ["benchmark", *flags, "--precision", "bf16", "--find-batch-size", *tokens(vocab)],
            kind="finder",
            refusal=bf16_refusal,
        )
    )

    def at_found(*extra):
        def command(results):
            found = (results.get(f"finder_{big}_bf16", {}).get("figures") or {}).get("found_batch_size")
            if not found:
                return "the batch finder found no batch"
            return ["benchmark", *flags, "--precision", "bf16", "--batch-size", str(found), *extra, *tokens(vocab)]

        return command

    out.append(Step(f"bench_{big}_bf16_found", 2, 30 if cpu else 25, at_found(), kind="benchmark"))
    out.append(Step(f"bench_{big}_bf16_found_compile", 2, 120 if cpu else 75, at_found("--compile"), kind="benchmark"))
    # The fused side of each pair is part 1's bench_<model>_bf16 (the same bounded run): only the plain one here.
    for model in ["tiny"] if cpu else ["it2", "it3"]:
        flags_m, vocab_m = MODELS[model]
        out.append(
            Step(
                f"bench_{model}_bf16_plain_loss",
                2,
                costs[model],
                ["benchmark", *flags_m, "--precision", "bf16", *PLAIN_LOSS, *tokens(vocab_m)],
                kind="benchmark",
                needs_flag=PLAIN_LOSS[:1],
                refusal=bf16_refusal,
            )
        )
    out.append(Step("verify_memory", 2, 40, lambda results: "memory", kind="verify"))
    out.append(Step("verify_estimate", 2, 60 if cpu else 40, lambda results: "estimate", kind="verify"))
    return out


def finite(value) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


class Runner:
    def __init__(self, device: str, part: str, budget: float, out: Path):
        self.device, self.part, self.budget, self.out = device, part, budget, out
        self.start = time.monotonic()
        self.results: dict[str, dict] = {}
        self.work = Path(tempfile.mkdtemp(prefix="buildllm-gpu-check-"))
        out.mkdir(parents=True, exist_ok=True)
        for name in ("results.jsonl", "log.txt"):
            (out / name).write_text("")

    def elapsed(self) -> float:
        return time.monotonic() - self.start

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

    def run(self, step: Step) -> None:
        command = step.command(self.results) if callable(step.command) else step.command
        if isinstance(command, str) and step.kind != "verify":
            return self.record(step, "skipped", 0, command)
        if step.needs_flag and not cli_offers(["benchmark", "--help"], step.needs_flag[0]):
            return self.record(step, "skipped", 0, f"`buildllm benchmark` offers no {step.needs_flag[0]} yet")
        left = self.budget - self.elapsed()
        if step.cost > left:
            return self.record(step, "skipped", 0, f"estimated {step.cost:.0f} s, {left:.0f} s left")
        json_path = self.work / f"{step.name}.json"
        cwd = ROOT
        if step.kind == "verify":
            command = verify_command(command, self.device, json_path)
        elif step.kind in ("benchmark", "finder"):
            cwd = self.work / step.name
            (cwd / "metrics").mkdir(parents=True)
            bounds = {"benchmark": FINDER[self.device]} if step.kind == "finder" else BOUNDS[self.device]
            if step.kind == "finder":
                bounds["train"] = {k: v for k, v in BOUNDS[self.device]["train"].items() if k == "threads"}
            (cwd / "params.yaml").write_text(yaml.safe_dump(bounds))
            command = [PY, "-m", "buildllm", *command, "--device", self.device]
            json_path = cwd / "metrics" / ("batch_size.json" if step.kind == "finder" else "benchmark.json")
        self.log(f"\n=== {step.name}: {' '.join(command)}")
        began = time.monotonic()
        try:
            done = subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired as exc:
            self.log(f"{exc.stdout or ''}{exc.stderr or ''}")
            return self.record(
                step, "miss", time.monotonic() - began, f"still running when the {left:.0f} s left ran out"
            )
        seconds = time.monotonic() - began
        output = done.stdout + "".join(line + "\n" for line in done.stderr.splitlines() if "\r" not in line)
        self.log(output)
        if step.kind == "env" and done.returncode == 0:
            write_atomic(self.out / "env.json", done.stdout)
        if step.kind == "pytest":
            write_atomic(self.out / "pytest.log", output)
        figures = json.loads(json_path.read_text()) if json_path.exists() else {}
        status, note = judge(step, done.returncode, output, figures)
        self.record(step, status, seconds, note, figures)

    def go(self, parts: list[Step]) -> int:
        try:
            for step in parts:
                self.run(step)
        finally:  # what the steps wrote there that matters is already in out/ (log.txt, figures)
            shutil.rmtree(self.work, ignore_errors=True)
        print(summary(self.results.values(), self.device, self.budget, self.elapsed()), flush=True)
        return 1 if any(r["status"] == "miss" for r in self.results.values()) else 0


def judge(step: Step, code: int, output: str, figures: dict) -> tuple[str, str]:
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    if step.refusal:
        if code != 0 and REFUSALS[step.refusal] in output:
            return "refused", f"expected: {step.refusal}"
        return "miss", f"expected the refusal {step.refusal}, got exit code {code}: {last[:120]}"
    if code != 0:
        what = {
            1: "a truth check missed" if step.kind == "verify" else "failed",
            2: "refused or a config error",
            3: "training failed (non-finite loss or out of memory)",
        }.get(code, "crashed")
        return "miss", f"exit code {code} ({what}): {last[:160]}"
    if step.kind == "pytest" and (" passed" not in last or "failed" in last or "error" in last):
        return "miss", f"not every selected test passed: {last[:160]}"
    bad = [key for key, value in figures.items() if not finite(value)]
    if bad:
        return "miss", f"non-finite figures: {', '.join(bad[:5])}"
    if step.kind == "benchmark" and not figures.get("tokens_per_second", 0) > 0:
        return "miss", "no tokens/s recorded"
    if step.kind == "finder" and not figures.get("found_batch_size", 0) >= 1:
        return "miss", "no batch size fits"
    return "ok", last[:100] if step.kind == "pytest" else ""


def summary(results, device: str, budget: float, elapsed: float) -> str:
    lines = [
        f"gpu_check on {device}: {elapsed:.0f} s of a {budget:.0f} s budget",
        f"{'step':<34}{'status':<9}{'s':>6}{'est':>6}{'tok/s':>12}{'MFU':>7}{'peak MiB':>10}{'est/pk':>7}",
    ]
    for r in results:
        f = r["figures"]
        row = f"{r['name']:<34}{r['status']:<9}{r['seconds']:>6.0f}{r['estimate_seconds']:>6.0f}"
        if "tokens_per_second" in f:
            row += (
                f"{f['tokens_per_second']:>12,.0f}{f.get('mfu', 0):>7.1%}"
                f"{f.get('peak_memory_bytes', 0) / 2**20:>10.0f}{f.get('memory_estimate_ratio', 0):>7.2f}"
            )
        elif "found_batch_size" in f:
            row += f"  found batch {f['found_batch_size']} in {f.get('tries')} tries"
        if r["note"] and r["status"] != "ok":
            row += f"  {r['note'][:70]}"
        lines.append(row)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "refused", "skipped", "miss")}
    verdict = "  -> FAILED" if counts["miss"] else "  -> passed"
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()) + verdict)
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def main() -> int:
    device = os.environ.get("GPU_CHECK_DEVICE", "cuda")
    if device not in ("cuda", "cpu"):
        print(f"error: GPU_CHECK_DEVICE={device!r}; use cuda or cpu", file=sys.stderr)
        return 2
    part = os.environ.get("GPU_CHECK_PART", "all")
    if part not in ("1", "2", "all"):
        print(f"error: GPU_CHECK_PART={part!r}; use 1, 2 or all", file=sys.stderr)
        return 2
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S", "285"))
    out = Path(os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT") or ROOT / "gpu_check_out").resolve()
    chosen = [s for s in steps(device) if part == "all" or s.part in (0, int(part))]
    if only := os.environ.get("GPU_CHECK_STEPS"):  # a rerun of named steps (env always runs)
        names = set(only.split(","))
        unknown = names - {s.name for s in steps(device)}
        if unknown:
            print(
                f"error: GPU_CHECK_STEPS names no step {sorted(unknown)}; see results.jsonl for the names",
                file=sys.stderr,
            )
            return 2
        chosen = [s for s in steps(device) if s.part == 0 or s.name in names]
    return Runner(device, part, budget, out).go(chosen)


if __name__ == "__main__":
    sys.exit(main())
