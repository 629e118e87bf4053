"""Which attention the model runs (RunPlan.attention): torch's scaled_dot_product_attention, whose
dispatch picks a kernel for the device, or attention written out (model/gpt.py, explicit_attention).
The two compute the same function; which is faster depends on the machine, the shape and the precision,
so `buildllm tune` measures both (measure/tune_kernels.py) and the plan reads the figures.

Forward + backward at iteration 1's shape (16 x 4 heads x 128 tokens x 32), 2 threads, against the
dispatch (flash attention on the CPU):
- 2-core AMD EPYC: fp32 x0.61 (the dispatch faster); bf16 x3.18, the dispatch's bf16 taking 2.5x its
  own fp32 time. tiny, student and small in bf16: x4.22, x3.38, x1.80; in fp32 x0.60-0.65.
- 2-core Intel Xeon with AMX: bf16 x0.59 (tune's record of 2026-12-04).
No rule of the device kind or the precision alone holds on both, so nothing changes without figures:
the dispatch, unless tune measured the written-out form faster by a margin (plan/tuned.py, clears)
in this run's precision, at this shape and batch, on this machine. Tune measures it first, in each
precision it compares, so that its precision part times each side with the attention it would run.
"""

from __future__ import annotations

from dataclasses import dataclass

from buildllm.plan.tuned import MIN_LOW_GAIN, clears, ratio_text

SDPA, EXPLICIT = "sdpa", "explicit"


@dataclass(frozen=True)
class AttentionDecision:
    kernel: str  # SDPA | EXPLICIT
    reason: str

    @property
    def explicit(self) -> bool:
        return self.kernel == EXPLICIT


def decide_attention(record: dict | None, why_not: str, precision: str) -> AttentionDecision:
    """record: this machine's tune record for the run's profile, shape and batch (None: why_not says why)."""
    dispatch = "scaled_dot_product_attention, torch's dispatch"
    if record is None:
        return AttentionDecision(SDPA, f"{SDPA} ({dispatch}): {why_not}")
    # Since 2026-12-05 tune measures attention in every precision it compares (measure/tune_order.py);
    # a record from before holds the run's precision's figures alone, as `attention`.
    figures = record.get("attention_by_precision", {}).get(precision) or record.get("attention") or {}
    measured_in = figures.get("precision", "fp32")
    if measured_in != precision:
        why = f"tune measured attention in {measured_in}, this run computes in {precision}"
        return AttentionDecision(SDPA, f"{SDPA} ({dispatch}): {why}")
    written_out = figures.get(EXPLICIT)
    if written_out is None:
        why = figures.get("skipped", "the written-out form was not measured")
        return AttentionDecision(SDPA, f"{SDPA} ({dispatch}): {why}")
    said = f"the written-out form {ratio_text(written_out)} the dispatch's speed, measured here in {precision}"
    if clears(written_out):
        return AttentionDecision(EXPLICIT, f"{EXPLICIT}: {said}")
    bar = f"under x{MIN_LOW_GAIN:.2f} at its interval's low end"
    return AttentionDecision(SDPA, f"{SDPA} ({dispatch}): {said}, {bar}")
