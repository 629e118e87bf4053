"""MFU truth: the same benchmark run several times, each in a fresh process, gives the same MFU.

Each run is `python -m buildllm benchmark` as a user runs it, in a temporary folder whose
params.yaml points at the project's token files (nothing in the project is touched). MFU must be
recomputable from each run's own metrics file (on the CPU the median over its measured steps of
each step's achieved FLOP/s ÷ the matmul rate measured beside it; achieved_flops ÷ peak_flops for a
datasheet peak) and no file outside the run may decide it.
Target: every run's MFU within ±3% of every other's; the script exits 1 when it misses.
A busy machine moves both the steps and the in-run matmul peak; run it on a quiet one.

    python scripts/mfu_truth.py                       # iteration 1 (gpt_first_cpu) on the CPU, 2 runs
    python scripts/mfu_truth.py --runs 4 --preset tiny
    python scripts/mfu_truth.py --runs 4 --measured-steps 60 --intervals 12   # a longer benchmark
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from buildllm.measure.benchmark import mfu_from_metrics  # noqa: E402
TARGET = 0.03


def params_for(args) -> dict:
    from buildllm.config import load_config
    from buildllm.paths import token_paths
    from buildllm.plan import make_plan

    chosen = {"preset": args.preset} if args.preset else {"iteration": args.iteration}
    plan = make_plan(load_config(None, {**chosen, "device": args.device, "precision": args.precision}))
    train, validation = (ROOT / path for path in token_paths(plan.config, plan.model.vocab_size))
    if not train.exists():
        raise SystemExit(f"no token file {train}; make it first with `buildllm corpus && buildllm tokenize` in {ROOT}")
    train_settings = {"train_tokens": str(train), "validation_tokens": str(validation)}
    if args.threads:
        train_settings["threads"] = args.threads
    params = {**chosen, "device": args.device, "precision": args.precision, "train": train_settings}
    if args.measured_steps:  # a longer benchmark: more steps, each paired with the matmuls beside it
        params["benchmark"] = {"measured_steps": args.measured_steps, "intervals": args.intervals}
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--iteration", type=int, default=1)
    parser.add_argument("--preset")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--measured-steps", type=int, help="the benchmark's measured steps (default: params.yaml's)")
    parser.add_argument("--intervals", type=int, default=4, help="with --measured-steps: how many intervals")
    args = parser.parse_args(argv)
    params = params_for(args)
    print(f"{'run':>4}{'tokens/s':>12}{'achieved TFLOP/s':>18}{'peak TFLOP/s':>14}{'before':>8}{'after':>8}"
          f"{'MFU':>8}  peak source", flush=True)
    mfus = []
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="buildllm-mfu-") as folder:
            work = Path(folder)
            (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            result = subprocess.run([sys.executable, "-m", "buildllm", "benchmark"], cwd=work,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                print(result.stdout[-2000:], result.stderr[-2000:], file=sys.stderr)
                return 1
            m = json.loads((work / "metrics" / "benchmark.json").read_text())
        # Recomputed from the file alone, as a reader of the metrics would: each step against the
        # peak measured beside it, the median of those (a datasheet peak: achieved ÷ peak).
        recomputed = mfu_from_metrics(m)
        if abs(recomputed - m["mfu"]) > 1e-9 * max(m["mfu"], 1):
            print(f"run {run}: MFU {m['mfu']} is not what its own file gives ({recomputed})")
            return 1
        mfus.append(m["mfu"])
        print(f"{run:>4}{m['tokens_per_second']:>12,.0f}{m['achieved_flops'] / 1e12:>18.4f}"
              f"{m['peak_flops'] / 1e12:>14.4f}{m['peak_flops_before'] / 1e12:>8.3f}{m['peak_flops_after'] / 1e12:>8.3f}"
              f"{m['mfu']:>8.2%}  {m['peak_flops_source']}", flush=True)
    spread = max(mfus) / min(mfus) - 1
    verdict = "within" if spread <= TARGET else "OUTSIDE"
    print(f"{len(mfus)} runs: MFU median {statistics.median(mfus):.2%}, highest ÷ lowest - 1 = {spread:.2%}, "
          f"{verdict} the ±{TARGET:.0%} target")
    return 0 if spread <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
