"""The memory model's point estimate against the measured peak on the committed held-out shapes.

The shapes are buildllm/predict/held_out_shapes.yaml, committed before they were first measured.
Each is measured as scripts/memory_truth.py measures a shape: the batch finder's try (two training
steps after one warm-up) in a fresh process, --repeats times; the median is compared with the
estimate's total. Target: within ±15%. Exits 1 on a miss; a miss is reported, not fitted away.

    python scripts/memory_held_out.py --tokens DIR   # DIR holds train.pt and validation.pt (4,096-token vocabulary)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from memory_truth import Shape, measured_peak, overrides, plan_and_estimate

SHAPES = ROOT / "buildllm" / "predict" / "held_out_shapes.yaml"
TARGET = 0.15


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", required=True, help="folder with train.pt and validation.pt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    folder = Path(args.tokens)
    rows, missed = [], 0
    print(f"{'shape':<52}{'estimate MiB':>13}{'measured MiB':>14}{'ratio':>7}  runs MiB")
    for entry in yaml.safe_load(SHAPES.read_text()):
        shape = Shape(**entry)
        settings = {**overrides(shape, "cpu"), "train.train_tokens": str(folder / "train.pt"),
                    "train.validation_tokens": str(folder / "validation.pt")}
        _, _, estimate = plan_and_estimate(settings)
        runs = [measured_peak(settings) for _ in range(args.repeats)]
        peaks = [run["peak_memory_bytes"] for run in runs if run]
        measured = statistics.median(peaks) if peaks else 0
        ratio = estimate.total / measured if measured else float("inf")
        missed += not (1 - TARGET <= ratio <= 1 + TARGET)
        rows.append({"shape": shape.label, "estimate_bytes": estimate.total, "measured_bytes": measured,
                     "runs_bytes": peaks, "estimate_over_measured": ratio,
                     "within_range": estimate.low <= measured <= estimate.high})
        print(f"{shape.label:<52}{estimate.total / 2**20:>13.1f}{measured / 2**20:>14.1f}{ratio:>7.2f}  "
              + ", ".join(f"{p / 2**20:.0f}" for p in peaks), flush=True)
    result = {"cpu": cpu_model(), "target": TARGET, "missed": missed, "shapes": rows}
    print(f"{len(rows) - missed} of {len(rows)} within ±{TARGET:.0%} (estimate / measured) on {result['cpu']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
