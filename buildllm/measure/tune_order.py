"""Which parts `buildllm tune` measures, in which order, and each one's share of `tune.seconds`: a
pure function of whether compile comes first (an accelerator), so the order a GPU gets is checked here without one.

Attention comes first everywhere, measured in each precision tune compares (a kernel alone, a few
seconds): the precision part then runs each side with the attention that side would run. Measured
after the precision, in the chosen precision only, a precision whose dispatch attention is slow lost
to fp32 before its written-out attention was ever timed (on a 2-core AMD EPYC at iteration 1, bf16
ran x1.18 fp32's speed with the dispatch and x1.50 written out, 2026-12-05). Precision comes next:
every later part is measured in the precision the run will use (what `auto` makes of the precision
figures, or the precision asked for), under its autocast.

- Accelerators: torch.compile right after it, in the time left less what the loss chunk keeps
  (its share). On an H200, iteration 3 in bf16 ran 627,896 tokens/s compiled against 498,807
  eager (+26%), while the loss chunk and the attention kernel move a step by a few percent at most;
  measured last, compile found 4 s of a 40 s budget left and was never measured (2026-12-04).
- The CPU: compile stays last, with what is left. A cold compile takes about 40 s on 2 cores and was
  measured x1.10 (interval 1.00-1.14) at iteration 1, not conclusively faster, while the thread count
  and the loss chunk decide measurable gains there in a few seconds each.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_COMPILE_SECONDS = 30.0  # a cold compile at iteration 1 took about 40 s on 2 cores, 31 s at iteration 3 on an H200


@dataclass(frozen=True)
class Part:
    name: str  # precision | threads | compile | loss_chunk | attention
    share: float | None  # of tune.seconds, the soft end of its turns; None: what is left (compile)


# attention's share is for all its precisions together (measure/tune.py divides it among them).
CPU_ORDER = (
    Part("attention", 0.05),
    Part("precision", 0.45),
    Part("threads", 0.10),
    Part("loss_chunk", 0.05),
    Part("compile", None),
)
ACCELERATOR_ORDER = (
    Part("attention", 0.05),
    Part("precision", 0.40),
    Part("compile", None),
    Part("loss_chunk", 0.05),
)


def tune_order(compile_first: bool) -> tuple[Part, ...]:
    """The parts in the order tune measures them: compile_first on an accelerator (Device.compile_pays_first)."""
    return ACCELERATOR_ORDER if compile_first else CPU_ORDER


def shares(compile_first: bool) -> dict[str, float]:
    return {part.name: part.share for part in tune_order(compile_first) if part.share is not None}


def compile_window(compile_first: bool, seconds: float, left: float) -> tuple[float, str]:
    """(seconds compile may take, why not when under MIN_COMPILE_SECONDS ("" when it may run)):
    what is left of the budget less the shares the parts after it keep."""
    order = [part.name for part in tune_order(compile_first)]
    after = [part for part in tune_order(compile_first)[order.index("compile") + 1 :]]
    kept = sum(part.share for part in after) * seconds
    window = left - kept
    if window >= MIN_COMPILE_SECONDS:
        return window, ""
    others = f" ({kept:.0f} s kept for the {' and '.join(p.name.replace('_', ' ') for p in after)})" if after else ""
    return window, (
        f"skipped: {max(window, 0):.0f} s of tune.seconds left for it{others}, under the "
        f"{MIN_COMPILE_SECONDS:.0f} s a compile needs (raise tune.seconds)"
    )
