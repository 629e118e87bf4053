"""This machine's tune figures (metrics/tune.json, written by `buildllm tune`) and the rules that
turn them into decisions.

The file is keyed by machine id, then profile, then device: a record measured on another machine,
for another profile or another model shape or batch, applies to nothing here. The plan reads a
matching record through `lookup` and decides with the rules below (precision, threads, torch.compile,
the fused loss's chunk); `buildllm tune` prints what those same rules make of its fresh figures.
Without a matching record every rule keeps its stated default and says so: NOT_MEASURED.

Torch-free and low in the layers (beside paths.py): the plan imports it, it imports nothing above.
"""

from __future__ import annotations

import json
from pathlib import Path

from buildllm.atomic import atomic_write_text
from buildllm.paths import METRICS

PATH = METRICS / "tune.json"
FORMAT = 1
NOT_MEASURED = "not measured on this machine: run `buildllm tune`"


def read_all(path: Path = PATH) -> dict:
    """Every record in the file, {machine id: {profile: {device: record}}}; {} when there is none
    (an unreadable file counts as none: tune rewrites it)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("machines"), dict):
        return {}
    return data["machines"]


def write_record(record: dict, path: Path = PATH) -> Path:
    """Add (or replace) one record under its machine id, profile and device, keeping the others;
    written atomically."""
    machines = read_all(path)
    machines.setdefault(record["machine_id"], {}).setdefault(record["profile"], {})[record["device"]] = record
    atomic_write_text(path, json.dumps({"format": FORMAT, "machines": machines}, indent=2, sort_keys=True) + "\n")
    return Path(path)


def shape_label(model, gradient_checkpointing: bool = False) -> str:
    """The model shape (a GPTConfig) a record was measured at, as one comparable label."""
    return (
        f"{model.architecture} {model.n_layer}x{model.n_head}x{model.n_embd}, {model.sequence_length} tokens, "
        f"vocab {model.vocab_size}" + (", checkpointing" if gradient_checkpointing else "")
    )


def lookup(
    machine_id: str, profile: str, device: str, batch_size: int, shape: str, path: Path = PATH
) -> tuple[dict | None, str]:
    """(record, "") for this machine, profile, device, batch and shape; else (None, why not)."""
    entry = read_all(path).get(machine_id, {}).get(profile, {}).get(device)
    if entry is None:
        return None, NOT_MEASURED
    if entry.get("batch_size") != batch_size or entry.get("shape") != shape:
        return None, (
            f"not measured on this machine for this run's shape (tuned: batch {entry.get('batch_size')}, "
            f"{entry.get('shape')}): run `buildllm tune` with this run's settings"
        )
    return entry, ""


def ratio_text(figure: dict) -> str:
    """x1.38 (interval 1.30-1.45, 12 pairs)."""
    return f"x{figure['ratio']:.2f} (interval {figure['low']:.2f}-{figure['high']:.2f}, {figure['pairs']} pairs)"


def faster(figure: dict) -> bool:
    """Conclusively faster: the median ratio's interval lies above 1 and covers at least 95% (6 pairs
    or more; with fewer, even min to max covers less)."""
    return figure["low"] > 1.0 and figure.get("coverage", 0.0) >= 0.95


def slower(figure: dict) -> bool:
    return figure["high"] < 1.0 and figure.get("coverage", 0.0) >= 0.95


def precision_choice(record: dict | None, why_not: str, default: str) -> tuple[str, str]:
    """(precision, reason) for `precision: auto`, from the device's default. Where that is fp32 (the
    CPU, MPS), bf16 replaces it only if measured conclusively faster (its whole paired interval
    above 1) *and* the short run's validation losses agree within the stated tolerance. Where it is
    a low precision (GPUs), it stays unless measured conclusively slower than fp32."""
    if record is None:
        return default, why_not
    figures = record.get("precision", {})
    where = f"at {record['profile']}"
    if default == "fp32":
        bf16 = figures.get("bf16")
        if bf16 is None:
            return default, f"measured here: bf16 not measured ({figures.get('skipped', 'no figures')}): {default}"
        speed = f"measured here: bf16 {ratio_text(bf16)} fp32's speed {where}"
        if not faster(bf16):
            return default, f"{speed}, not conclusively faster: keeping {default}"
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
    low = figures.get(default)
    if low is None:
        return default, f"measured here: {default} not measured ({figures.get('skipped', 'no figures')}): {default}"
    speed = f"measured here: {default} {ratio_text(low)} fp32's speed {where}"
    if slower(low):
        return "fp32", f"{speed}, conclusively slower: fp32"
    return default, f"{speed}: {default}"


def threads_choice(record: dict | None, why_not: str, default: int) -> tuple[int, str]:
    """(threads, reason) for `threads: null`: a count measured conclusively faster than torch's
    default (the fastest such), else the default."""
    if record is None:
        return default, f"{default}: torch's default for this machine; {why_not}"
    figures = record.get("threads")
    if not figures or "skipped" in figures or figures.get("default") != default:
        skipped = (figures or {}).get("skipped", "measured with another default")
        return default, f"{default}: torch's default for this machine; measured here: threads not compared ({skipped})"
    others = {int(n): f for n, f in figures.get("candidates", {}).items()}
    if not others:
        return default, f"{default}: torch's default; measured here: no other thread count to compare"
    quicker = {n: f for n, f in others.items() if faster(f)}
    said = "; ".join(f"{n} threads {ratio_text(f)}" for n, f in sorted(others.items()))
    if quicker:
        best = max(quicker, key=lambda n: quicker[n]["ratio"])
        return best, f"{best}: measured here against torch's default {default}: {said}"
    return default, f"{default}: torch's default, kept; measured here against it: {said}"


def compile_figures(record: dict | None, why_not: str) -> tuple[dict | None, str]:
    """(figures of torch.compile measured here, "") or (None, why there are none)."""
    if record is None:
        return None, why_not
    figures = record.get("compile", {})
    if "speedup" not in figures:
        return None, f"measured here: torch.compile {figures.get('skipped', 'not measured')}"
    return figures, ""


def chunk_choice(record: dict | None, why_not: str, default_rows: int) -> tuple[int | None, str]:
    """(rows, reason) for the fused loss's rows per chunk: the fastest count measured conclusively
    faster than the default, else the default; (None, why) without figures for this default, so
    the plan's own rule (the default) stands."""
    if record is None:
        return None, why_not
    figures = record.get("loss_chunk")
    if not figures or "skipped" in figures or figures.get("default_rows") != default_rows:
        why = (figures or {}).get("skipped", "measured against another default")
        return None, f"measured here: not compared ({why})"
    others = {int(rows): f for rows, f in figures["candidates"].items()}
    said = "; ".join(f"{rows} rows {ratio_text(f)}" for rows, f in sorted(others.items()))
    quicker = {rows: f for rows, f in others.items() if faster(f)}
    if quicker:
        best = max(quicker, key=lambda rows: quicker[rows]["ratio"])
        return best, f"{best} rows: measured here against the default {default_rows}: {said}"
    return default_rows, f"{default_rows} rows (the default), kept; measured here against it: {said}"
