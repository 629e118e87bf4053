"""Which precision a run computes in (fp32, bf16 or fp16), and why.

auto: the device's native precision (device/precision.py: bf16 or fp16 on CUDA, fp32 on the CPU and
MPS, where this course's small models gain little; ask for fp16 to try it), unless `buildllm tune`
measured otherwise on this machine (measured_choice). An explicit precision the device lacks fails
with advice instead of silently falling back."""

from __future__ import annotations

from buildllm.device.device import Device
from buildllm.device.precision import PrecisionDecision, native_precision, precision_decision, refuse_unsupported
from buildllm.plan.tuned import faster, ratio_text, slower

# Where fp32 is the default (the CPU, MPS), bf16 replaces it only if its interval's LOW end clears
# this gain. "Conclusively faster" (low end above 1) flipped from run to run where the two are close:
# on a 2-core Intel Xeon with AMX tune picked bf16 in 8 of 9 runs with medians x0.99-x1.09 and
# intervals about +-0.03 wide (issue 44), so a baseline and its experiment could differ in precision
# with nothing changed. A choice flips only when the low end crosses the bar between runs; with the
# bar 5% above fp32, a machine where bf16 is near parity stays fp32 every time, and only a gain large
# enough to matter (and to outrun the interval's width) moves the run to bf16.
MIN_LOW_PRECISION_GAIN = 1.05


def resolve_precision(
    requested: str,
    device: Device,
    profile_default: str = "auto",
    tune: tuple[dict | None, str] | None = None,
) -> PrecisionDecision:
    """tune: for `auto`, this machine's tune record for the run and why there is none (tuned.lookup);
    None leaves the measurements out."""
    chosen, origin = requested, "requested explicitly"
    if requested == "auto" and profile_default != "auto":
        chosen, origin = profile_default, f"auto: the profile's {device.kind} default"
    if chosen == "auto":
        chosen, origin = native_precision(device)
    if requested == "auto" and tune is not None:
        choice, why = measured_choice(*tune, chosen)
        origin, chosen = (f"{origin}; {why}" if choice == chosen else f"auto: {why}"), choice
    refuse_unsupported(chosen, device)
    return precision_decision(chosen, device, origin)


def measured_choice(record: dict | None, why_not: str, default: str) -> tuple[str, str]:
    """(precision, reason) for `precision: auto`, from the device's default. Where that is fp32 (the
    CPU, MPS), bf16 replaces it only if its paired interval's low end clears MIN_LOW_PRECISION_GAIN
    (and covers 95%) *and* the short run's validation losses agree within the stated tolerance. Where it is
    a low precision (GPUs), it stays unless measured conclusively slower than fp32."""
    if record is None:
        return default, why_not
    figures = record.get("precision", {})
    candidate = "bf16" if default == "fp32" else default
    figure = figures.get(candidate)
    if figure is None:
        return default, f"measured here: {candidate} not measured ({figures.get('skipped', 'no figures')}): {default}"
    speed = f"measured here: {candidate} {ratio_text(figure)} fp32's speed at {record['profile']}"
    if default != "fp32":  # a GPU's low precision stays unless measured conclusively slower
        if slower(figure):
            return "fp32", f"{speed}, conclusively slower: fp32"
        return default, f"{speed}: {default}"
    if not faster(figure):
        return default, f"{speed}, not conclusively faster: keeping {default}"
    if figure["low"] < MIN_LOW_PRECISION_GAIN:
        bar = f"the interval's low end x{figure['low']:.2f} is under the x{MIN_LOW_PRECISION_GAIN:.2f} minimum gain"
        return default, f"{speed}, {bar} that keeps the choice from flipping between runs: keeping {default}"
    check = figures.get("loss_check", {})
    if not check.get("done"):
        return default, f"{speed}, but no loss check ({check.get('skipped', 'not run')}): keeping {default}"
    losses = (
        f"validation loss {check['bf16']:.3f} against fp32's {check['fp32']:.3f} after "
        f"{check['steps']} steps (tolerance {check['tolerance']})"
    )
    if abs(check["bf16"] - check["fp32"]) > check["tolerance"]:
        return default, f"{speed}, but {losses}: keeping {default}"
    return "bf16", f"{speed} and {losses}: bf16"
