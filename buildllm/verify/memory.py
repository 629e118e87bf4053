"""`buildllm verify memory`: the dry run's memory estimate against the measured peak, per shape.

Two sets of shapes, printed apart: fitted, the shapes the CPU constants in
buildllm/memory/estimate.py were chosen on, and held out, shapes no constant was chosen on: a model
that only fits its calibration shapes fails there.

Each shape runs the batch finder's own try in fresh processes (one shape's memory cannot colour the
next); their median is judged against the estimate's stated range (-15%/+25% on the CPU, ±15% on CUDA).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from buildllm import profiles
from buildllm.config import load_config
from buildllm.errors import UserError
from buildllm.verify.harness import finish, machine

if TYPE_CHECKING:  # imported when a shape is measured: this module stays torch-free
    from buildllm.memory.estimate import MemoryEstimate

TARGET = 0.15  # the point estimate's aim, printed beside the stated range

# Profile -> batch sizes: each profile's CPU default, a smaller and a larger one (the fitted set).
FITTED_BATCHES = {
    "tiny": (8, 32, 128),
    "student": (4, 16, 64),
    "gpt_first_cpu": (4, 16, 64),
    "small": (2, 8, 32),
    "gpt_42m": (1, 4),
    "gpt_100m": (1, 2),
}


@dataclass(frozen=True)
class Shape:
    profile: str
    batch_size: int
    precision: str = "fp32"
    architecture: str | None = None
    grad_accum: int = 1
    checkpointing: bool = False
    sequence_length: int | None = None
    compiled: bool = False

    @property
    def label(self) -> str:
        extra = [
            self.architecture or "",
            f"accum {self.grad_accum}" if self.grad_accum > 1 else "",
            "ckpt" if self.checkpointing else "",
            f"seq {self.sequence_length}" if self.sequence_length else "",
            "compiled" if self.compiled else "",
        ]
        return f"{self.profile} {self.precision} b{self.batch_size} " + " ".join(e for e in extra if e)

    @property
    def key(self) -> str:
        return "_".join(self.label.split())


# Gradient checkpointing's range (memory/estimate.py, remade_after_backward) was chosen on these,
# fp32: they belong with the fitted set. gpt_first_cpu b24 was held out until its miss led to that range.
FITTED_CHECKPOINTING = [
    Shape("gpt_first_cpu", 8, checkpointing=True),
    Shape("gpt_first_cpu", 24, checkpointing=True),
    Shape("gpt_first_cpu", 48, checkpointing=True),
    Shape("student", 16, architecture="classic", checkpointing=True),  # student was classic when fitted
    Shape("student", 16, architecture="modern", checkpointing=True),
    Shape("tiny", 64, checkpointing=True),
    Shape("small", 4, checkpointing=True),
]
# torch.compile's CPU term (memory/estimate.py, CPU_COMPILED_RUNTIME_BYTES) was chosen on these.
FITTED_COMPILED = [
    Shape("tiny", 32, compiled=True),
    Shape("gpt_first_cpu", 16, compiled=True),
]
# Gradient accumulation's term and checkpointing's under bf16 autocast (remade_after_backward) were
# chosen on these diagnostic shapes (issue 33 item 2), after the earlier held-out set's misses.
FITTED_ACCUMULATION = [
    Shape("gpt_first_cpu", 8, grad_accum=2),
    Shape("gpt_first_cpu", 8, grad_accum=4),
    Shape("gpt_first_cpu", 8, precision="bf16", grad_accum=2),
    Shape("student", 8, architecture="modern", grad_accum=2),
    Shape("tiny", 64, grad_accum=2, checkpointing=True),
]
FITTED_BF16_CHECKPOINTING = [
    Shape("gpt_first_cpu", 24, precision="bf16", checkpointing=True),
    Shape("student", 16, architecture="classic", precision="bf16", checkpointing=True),
    Shape("tiny", 64, precision="bf16", checkpointing=True),
]
FITTED = [Shape(profile, batch) for profile, batches in FITTED_BATCHES.items() for batch in batches]
FITTED += FITTED_CHECKPOINTING + FITTED_COMPILED + FITTED_ACCUMULATION + FITTED_BF16_CHECKPOINTING

# Never used to choose a constant. All use the 4,096-token vocabulary (the iteration-1 token files
# are enough) and take seconds each on two CPU cores.
_HELD_OUT_FP32 = [
    Shape("student", 12, architecture="modern"),
    Shape("gpt_first_cpu", 16, grad_accum=4),
    Shape("gpt_first_cpu", 32, checkpointing=True, sequence_length=96),
    Shape("student", 28, checkpointing=True),
    Shape("tiny", 100, checkpointing=True, grad_accum=2),
    Shape("small", 6, sequence_length=64),
    Shape("tiny", 37),
    Shape("small", 3, architecture="modern", grad_accum=2, checkpointing=True, sequence_length=128),
    Shape("student", 20, architecture="modern", sequence_length=96),
]
# Chosen and committed before any was measured (c915097), gradient checkpointing among them; first
# measured on a loaded 2-core AMD EPYC, 3 fresh processes each (estimate ÷ median peak): 0.86, 1.17
# (a miss: the modern architecture with accumulation is over-estimated), 0.96. A miss stays a miss.
HELD_OUT_COMMITTED = [
    Shape("gpt_first_cpu", 40, checkpointing=True, sequence_length=64),
    Shape("student", 10, architecture="modern", grad_accum=3, sequence_length=112),
    Shape("small", 6, precision="bf16", sequence_length=192),
]
# Chosen and committed before any was measured (issue 33, 28ac73b), before the checkpointing term was
# refitted and the compiled term written: gradient checkpointing and torch.compile, alone and together.
# First measured with those terms on a loaded 2-core AMD EPYC (family 25 model 17), 2 fresh processes
# each (estimate ÷ median peak), in this order: 1.116, 1.110, 1.024, 0.953, 0.961, 0.900, 1.078.
HELD_OUT_CKPT_COMPILE = [
    Shape("student", 24, architecture="modern", checkpointing=True, sequence_length=96),
    Shape("gpt_first_cpu", 12, precision="bf16", checkpointing=True),
    Shape("small", 5, checkpointing=True, sequence_length=160),
    Shape("tiny", 48, architecture="classic", compiled=True),
    Shape("tiny", 32, architecture="classic", precision="bf16", compiled=True),
    Shape("gpt_first_cpu", 20, compiled=True),
    Shape("student", 8, architecture="modern", checkpointing=True, compiled=True),
]
# Chosen and committed before any was measured (issue 33 item 2), after the accumulation and bf16
# checkpointing misses above led to refitting those terms: accumulation in both precisions and with
# checkpointing, bf16 checkpointing on both architectures, at sequence lengths and batches no fitted
# or earlier held-out shape has. First measured with the refitted terms on a loaded 2-core AMD EPYC
# (family 25 model 17), 2 fresh processes each (estimate ÷ median peak), in this order: 0.972, 0.998,
# 0.971, 1.087, 1.021, 1.029, 1.027.
HELD_OUT_ACCUM_BF16_CKPT = [
    Shape("tiny", 80, precision="bf16", grad_accum=3),
    Shape("student", 6, architecture="classic", grad_accum=2, sequence_length=96),
    Shape("gpt_first_cpu", 6, grad_accum=5, sequence_length=80),
    Shape("gpt_first_cpu", 20, precision="bf16", checkpointing=True, sequence_length=112),
    Shape("student", 14, architecture="modern", precision="bf16", checkpointing=True),
    Shape("tiny", 56, architecture="modern", precision="bf16", checkpointing=True, sequence_length=48),
    Shape("small", 2, precision="bf16", grad_accum=2, checkpointing=True, sequence_length=192),
]
# Chosen and committed before any was measured (issue 43 item 5, 2026-12-04): gradient checkpointing
# at iteration 1's profile at batches larger than any fitted bf16 checkpointing shape, under bf16
# autocast (as tune chose on an Intel Xeon with AMX, where one process read 0.83 of the measured peak
# and the next 0.95), each in several fresh processes: whether the range holds one process's spread.
# First measured (2026-12-04, 16:07-16:30 UTC) on a loaded 2-core AMD EPYC (family 25 model 17,
# AVX512-BF16, no AMX; load average 6-13), 4 fresh processes each, estimate ÷ median peak in this
# order: 1.073, 1.057, 1.079, 1.065; every single run inside the range (runs 152-162, 190-198,
# 239-252 and 123-138 MiB). The Intel AMX machine's 0.83 was not reproduced here: no constant changed.
HELD_OUT_BF16_CKPT_LARGE = [
    Shape("gpt_first_cpu", 48, precision="bf16", checkpointing=True),
    Shape("gpt_first_cpu", 64, precision="bf16", checkpointing=True),
    Shape("gpt_first_cpu", 96, precision="bf16", checkpointing=True),
    Shape("gpt_first_cpu", 40, precision="bf16", checkpointing=True, sequence_length=96),
]
HELD_OUT = [
    *_HELD_OUT_FP32,
    *(replace(s, precision="bf16") for s in _HELD_OUT_FP32),
    *HELD_OUT_COMMITTED,
    *HELD_OUT_CKPT_COMPILE,
    *HELD_OUT_ACCUM_BF16_CKPT,
    *HELD_OUT_BF16_CKPT_LARGE,
]

# The bounded check: a few of each set, cheap on two cores (each is also in the full set).
BOUNDED = {
    "fitted": [Shape("tiny", 32), Shape("gpt_first_cpu", 16)],
    "held_out": [
        Shape("tiny", 37),
        Shape("student", 12, architecture="modern"),
        Shape("gpt_first_cpu", 16, grad_accum=4),
    ],
}


def add_arguments(parser) -> None:
    parser.add_argument("--device", default="cpu", help="the device to check (default cpu)")
    parser.add_argument("--full", action="store_true", help="every fitted and held-out shape, fp32 and bf16")
    parser.add_argument("--sets", nargs="+", default=["fitted", "held_out"], choices=("fitted", "held_out"))
    parser.add_argument(
        "--profiles", nargs="+", choices=sorted(FITTED_BATCHES), metavar="PROFILE", help="only shapes of these profiles"
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=["fp32"],
        choices=("fp32", "bf16", "fp16"),
        help="precisions of the fitted set (its bf16 shapes keep theirs; the held-out set has its own: fp32, "
        "and bf16 with --full)",
    )
    parser.add_argument(
        "--batch-sizes",
        type=int,
        nargs="+",
        metavar="N",
        help="for the fitted set, these batch sizes instead of each profile's",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="fresh processes per shape; the median peak is judged (glibc's retained blocks move "
        "one run's peak by up to ±10%%), each run's figure is shown (default 3)",
    )
    parser.add_argument(
        "--max-fraction",
        type=float,
        default=0.6,
        metavar="F",
        help="skip shapes whose estimate exceeds this share of the memory available now (default 0.6)",
    )


def shape_settings(shape: Shape, device: str) -> dict:
    iteration = {name: number for number, name in profiles.iterations().items()}.get(shape.profile)
    chosen = {"iteration": iteration, "preset": None} if iteration else {"preset": shape.profile}
    optional = {"model.architecture": shape.architecture, "model.sequence_length": shape.sequence_length}
    # Two measured steps after one warm-up: the peak comes in the second step, once AdamW's state
    # exists beside a full forward and backward.
    return {
        **chosen,
        **{key: value for key, value in optional.items() if value},
        "device": device,
        "precision": shape.precision,
        "train.batch_size": shape.batch_size,
        "train.grad_accum": shape.grad_accum,
        "train.gradient_checkpointing": shape.checkpointing,
        "train.compile": "true" if shape.compiled else "false",
        "train.training_examples": None,
        "train.validation_examples": 8,
        "benchmark.warmup_steps": 1,
        "benchmark.measured_steps": 2,
        "benchmark.intervals": 1,
    }


def chosen_shapes(args) -> dict[str, list[Shape]]:
    sets = dict({"fitted": FITTED, "held_out": HELD_OUT} if args.full else BOUNDED)
    keep = set(args.profiles or FITTED_BATCHES)
    fitted = sets["fitted"]
    if args.batch_sizes:  # the profiles at these batch sizes, plain (no checkpointing shape)
        names = args.profiles or list(dict.fromkeys(s.profile for s in fitted))
        fitted = [Shape(name, batch) for name in names for batch in args.batch_sizes]
    # Shapes fitted in bf16 keep their precision; the others are measured in each --precision.
    fitted = [replace(s, precision=p) for p in args.precision for s in fitted if s.precision == "fp32"] + [
        s for s in fitted if s.precision != "fp32"
    ]
    sets["fitted"] = list(dict.fromkeys(fitted))
    from buildllm.device.precision import trains_in  # torch, only when a check runs
    from buildllm.plan.device import resolve_device

    device = resolve_device(args.device)
    # Shapes in a precision the plan would refuse on this device (fp16 on the CPU, bf16 where the CPU or
    # GPU has none) are left out.
    refused = {p for p in ("fp16", "bf16") if not trains_in(p, device)}
    return {
        name: [s for s in shapes if s.profile in keep and s.precision not in refused]
        for name, shapes in sets.items()
        if name in args.sets
    }


def measure_shape(shape: Shape, args, limit: float) -> tuple[str, MemoryEstimate | None, list[dict]]:
    """(the line's start or a skip note, the estimate, each fresh process's try by its peak: none when
    skipped or out of memory)."""
    from buildllm.measure.batch_finder import try_in_child
    from buildllm.memory.estimate import plan_memory
    from buildllm.paths import token_paths
    from buildllm.plan.run_plan import make_plan

    try:
        config = load_config(args.params, shape_settings(shape, args.device))
        plan = make_plan(config)
    except UserError as exc:
        return f"{shape.label:<48}  skipped: {exc}", None, []
    estimate = plan_memory(plan, training=False)
    train_path, _ = token_paths(config, plan.model.vocab_size)
    span = f"{estimate.low / 2**20:.0f}-{estimate.high / 2**20:.0f}"
    label = f"{shape.label:<48}{estimate.total / 2**20:>13.1f}{span:>16}"
    if not train_path.exists():
        return f"{label}  skipped: no {train_path} (make it with `buildllm tokenize`)", estimate, []
    if estimate.high > limit:
        return f"{label}  skipped: over {args.max_fraction:.0%} of the memory available", estimate, []
    tries = [try_in_child(config) for _ in range(args.repeats)]
    if any(t["oom"] for t in tries):
        return f"{label}  did not fit (out of memory)", estimate, []
    return label, estimate, sorted(tries, key=lambda t: t["peak_memory_bytes"])


def run_set(name: str, shapes: list[Shape], args, limit: float, record: dict, cuda: bool) -> tuple[int, int]:
    """Measure each shape and print its line; returns (shapes inside the stated range, shapes measured).
    cuda: the device's caching allocator reserves more than it allocates, which is shown beside it."""
    print(
        f"\n{name} set ({len(shapes)} shapes): the measured peak must lie inside the estimate's stated range",
        flush=True,
    )
    print(
        f"{'shape':<48}{'estimate MiB':>13}{'range MiB':>16}{'measured MiB':>14}{'ratio':>7}{'runs MiB':>14}"
        + (f"{'reserved MiB':>14}{'ratio':>7}" if cuda else ""),
        flush=True,
    )
    inside = measured = close = single_misses = singles = 0
    for shape in shapes:
        label, estimate, tries = measure_shape(shape, args, limit)
        if not tries:
            print(label, flush=True)
            continue
        peaks = [t["peak_memory_bytes"] for t in tries]
        peak = statistics.median(peaks)
        reserved = tries[len(tries) // 2].get("peak_memory_reserved_bytes")
        ok = estimate.low <= peak <= estimate.high
        ratio = estimate.total / peak
        measured, inside, close = measured + 1, inside + ok, close + (abs(ratio - 1) <= TARGET)
        single_misses += sum(not estimate.low <= p <= estimate.high for p in peaks)
        singles += len(peaks)
        line = f"{label}{peak / 2**20:>14.1f}{ratio:>7.3f}{f'{peaks[0] / 2**20:.0f}-{peaks[-1] / 2**20:.0f}':>14}"
        if cuda and reserved:
            line += f"{reserved / 2**20:>14.1f}{estimate.total / reserved:>7.3f}"
            record[f"{name}_{shape.key}_reserved_bytes"] = reserved
        print(line + ("" if ok else "  MISSES the stated range"), flush=True)
        figures = {
            "estimate_bytes": estimate.total,
            "low_bytes": estimate.low,
            "high_bytes": estimate.high,
            "measured_bytes": peak,
            "ratio": ratio,
            "inside": ok,
        }
        record.update({f"{name}_{shape.key}_{key}": value for key, value in figures.items()})
    print(
        f"{name}: {inside} of {measured} shapes inside the stated range; {close} of {measured} ratios within "
        f"±{TARGET:.0%}; {single_misses} of {singles} single runs outside the range",
        flush=True,
    )
    record.update({f"{name}_shapes": measured, f"{name}_inside": inside, f"{name}_within_target": close})
    return inside, measured


def command(args) -> int:
    from buildllm.plan.device import resolve_device

    if args.repeats < 1:
        raise UserError(f"--repeats {args.repeats}: give at least 1 fresh process per shape")
    sets = chosen_shapes(args)
    if not any(sets.values()):
        raise UserError("no shape of the chosen --profiles is in the chosen --sets; add --full or other profiles")
    device = resolve_device(args.device)
    limit = device.memory_free() * args.max_fraction
    record = {"device": args.device, "full": args.full, "repeats": args.repeats, **machine()}
    inside = judged = 0
    for name, shapes in sets.items():
        within, measured = run_set(name, shapes, args, limit, record, device.caching_allocator)
        inside, judged = inside + within, judged + measured
    print()
    return finish("memory", args.out, record, judged - inside, judged)
