"""Where a training step's time goes: torch.profiler over Trainer.step() on random tokens, by operator group.

    python -m lab.profile_step --profile iteration1 --steps 5
    python -m lab.profile_step --profile iteration1 --precision fp32 bf16 --rounds 4 --onednn

Prints the milliseconds per step and the share of self CPU time per operator group (matmuls,
attention, cross-entropy, GELU, fills, copies, norms, optimizer, autocast's casts, the rest) and the
top operators. With two precisions the trainers take turns, round after round (A B A B, each
profiled apart over --steps steps), so a competing job slows both alike; the table gives each
group's median milliseconds per step in each precision and their ratio: where bf16 autocast gains
and where it loses, op by op. --onednn also says which oneDNN kernel (and instruction set: AVX2,
AVX-512, AMX) the step's matmul shapes take in each precision, from ONEDNN_VERBOSE in a child process.

On a CPU without a bf16 matmul path (buildllm/device/cpu_bf16.py) bf16 is refused, as the plan refuses it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from torch.profiler import ProfilerActivity, profile

from buildllm.device import cpu_bf16
from lab.harness import PROFILES, cpu_plan, random_token_trainer

# An operator goes to the first group with a key in its name, so the norms come before the
# optimizer's "norm" (gradient clipping's vector norm). On the CPU the flash attention kernel does
# its own softmax: an aten::_softmax in a step is the fused loss's (or math attention's, with dropout).
# Under autocast, aten::_to_copy is mostly its weight and activation casts: a group of its own.
GROUPS = [
    ("matmuls (mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul")),
    ("attention", ("flash_attention", "efficient_attention", "scaled_dot_product")),
    (
        "cross-entropy",
        (
            "log_softmax",
            "nll_loss",
            "aten::logsumexp",
            "aten::exp",
            "chunked_cross_entropy",
            "aten::gather",
            "aten::scatter",
            "aten::_softmax",
            "LinearCrossEntropy",
        ),
    ),
    ("gelu / silu", ("gelu", "silu")),
    ("fill_ / zero_", ("aten::fill_", "aten::zero_")),
    ("casts (_to_copy)", ("aten::_to_copy",)),
    ("copies", ("aten::copy_", "aten::clone", "aten::contiguous")),
    ("norms", ("layer_norm", "rms_norm")),
    ("optimizer + clipping", ("adam", "foreach", "aten::_fused_adamw", "norm")),
]


def group_of(name: str) -> str:
    for label, keys in GROUPS:
        if any(key in name for key in keys):
            return label
    return "the rest"


def profiled(trainer, steps: int) -> tuple[float, dict[str, float], dict[str, tuple[float, int]]]:
    """(wall seconds per step, self CPU ms per step by group, by operator (ms, calls) per step)."""
    begin = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.step()
    seconds = (time.perf_counter() - begin) / steps
    groups: dict[str, float] = collections.Counter()
    ops = {}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1000 / steps
        groups[group_of(e.key)] += ms
        ops[e.key] = (ms, e.count // steps)
    return seconds, dict(groups), ops


ONEDNN_PROBE = """
import sys, torch
torch.set_num_threads(int(sys.argv[4]))
rows, width, out = (int(v) for v in sys.argv[1:4])
for dtype in (torch.float32, torch.bfloat16):
    x, w = torch.randn(rows, width, dtype=dtype), torch.randn(out, width, dtype=dtype)
    print("== " + str(dtype).split(".")[1], flush=True)
    torch.nn.functional.linear(x, w)
    torch.mm(x.t().contiguous(), torch.randn(rows, out, dtype=dtype))
"""


def onednn_kernels(rows: int, width: int, out: int, threads: int) -> dict[str, list[str]]:
    """The oneDNN primitives (kernel and instruction set) a linear layer and a weight gradient of
    these shapes take in fp32 and bf16, from ONEDNN_VERBOSE; an empty list: oneDNN was not used (MKL's
    or PyTorch's own kernel ran)."""
    done = subprocess.run(
        [sys.executable, "-c", ONEDNN_PROBE, str(rows), str(width), str(out), str(threads)],
        capture_output=True,
        text=True,
        env={**os.environ, "ONEDNN_VERBOSE": "1"},
        timeout=300,
    )
    kernels: dict[str, list[str]] = {}
    current = None
    for line in done.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:]
            kernels[current] = []
        elif current and line.startswith("onednn_verbose") and ",exec," in line:
            fields = line.split(",")
            start = fields.index("exec")
            kernels[current].append(f"{fields[start + 2]} {fields[start + 3]}")  # primitive, implementation
        elif line.startswith("onednn_verbose") and ",isa:" in line:
            kernels.setdefault("isa", []).append(line.split("isa:", 1)[1].strip())
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="iteration1", choices=sorted(PROFILES))
    parser.add_argument("--architecture", choices=("classic", "modern"), default=None)
    parser.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=["fp32"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps profiled per turn")
    parser.add_argument("--rounds", type=int, default=1, help="turns of each precision, interleaved")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--onednn", action="store_true", help="which oneDNN kernels the step's matmul shapes take")
    args = parser.parse_args()
    precisions = list(dict.fromkeys(args.precision))
    if "bf16" in precisions and (refused := cpu_bf16.refuse_without_bf16_path()):
        parser.error(refused)

    plans = {p: cpu_plan(args.profile, p, args.threads, args.architecture) for p in precisions}
    steps = args.warmup + args.rounds * args.steps
    trainers = {p: random_token_trainer(plan, steps) for p, plan in plans.items()}
    plan = plans[precisions[0]]
    length, batch = plan.model.sequence_length, plan.batch_size
    for trainer in trainers.values():
        for _ in range(args.warmup):
            trainer.step()
    walls = {p: [] for p in precisions}
    groups = {p: collections.defaultdict(list) for p in precisions}
    ops = {p: collections.defaultdict(list) for p in precisions}
    for _ in range(args.rounds):
        for p, trainer in trainers.items():
            seconds, by_group, by_op = profiled(trainer, args.steps)
            walls[p].append(seconds)
            for label in {label for label, _ in GROUPS} | {"the rest"}:
                groups[p][label].append(by_group.get(label, 0.0))
            for key, figure in by_op.items():
                ops[p][key].append(figure)
    median = {p: {label: statistics.median(v) for label, v in groups[p].items()} for p in precisions}
    print(
        f"{args.profile} {plan.model.architecture}, batch {batch} x {length}, {args.threads} threads, "
        f"{args.rounds} round(s) of {args.steps} profiled steps per precision: "
        + ", ".join(f"{p} {statistics.median(walls[p]) * 1000:.0f} ms/step" for p in precisions)
        + " under the profiler"
    )
    first = precisions[0]
    order = sorted(median[first], key=lambda label: -median[first][label])
    head = " | ".join(f"{p} ms | {p} share" for p in precisions)
    ratio = f" | {precisions[1]}/{first} |" if len(precisions) > 1 else " |"
    print(f"| group | {head}{ratio}\n|" + " --- |" * (1 + 2 * len(precisions) + (len(precisions) > 1)))
    totals = {p: sum(median[p].values()) for p in precisions}
    for label in order:
        cells = " | ".join(f"{median[p][label]:.1f} | {median[p][label] / totals[p]:.1%}" for p in precisions)
        extra = ""
        if len(precisions) > 1:
            base = median[first][label]
            extra = f" {median[precisions[1]][label] / base:.2f} |" if base > 0 else " - |"
        print(f"| {label} | {cells} |{extra}")
    print("| total | " + " | ".join(f"{totals[p]:.1f} | 100% " for p in precisions) + "|")
    for p in precisions:
        print(f"{p}: top {args.top} operators by self CPU time (ms per step, calls per step):")
        rows = {key: (statistics.median(ms for ms, _ in v), v[-1][1]) for key, v in ops[p].items()}
        for key, (ms, calls) in sorted(rows.items(), key=lambda item: -item[1][0])[: args.top]:
            print(f"  {key:60s} {ms:8.2f} ms  {ms / totals[p]:6.1%}  calls/step {calls}")
    if args.onednn:
        rows = batch * length
        shapes = {
            "qkv": (rows, plan.model.n_embd, 3 * plan.model.n_embd),
            "output": (rows, plan.model.n_embd, plan.model.vocab_size),
        }
        for name, shape in shapes.items():
            print(f"oneDNN at the {name} layer's shape {shape}: {json.dumps(onednn_kernels(*shape, args.threads))}")


if __name__ == "__main__":
    main()
