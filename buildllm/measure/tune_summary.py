"""What `buildllm tune` prints of its record (measure/tune.py): each figure, each part with its
precision, the decisions the next plan will take, and what was skipped."""

from __future__ import annotations

from buildllm.device.load import load_line
from buildllm.measure.tune_kernels import BACKENDS
from buildllm.plan import tuned


def summary(record: dict) -> str:
    lines = [
        f"tune {record['profile']} on {record['device']} ({record['processor']}, machine {record['machine_id']}): "
        f"{record['seconds_taken']:.0f} s of {record['budget_seconds']:.0f} s, {load_line(record)}"
    ]
    for name, figure in record["precision"].items():
        if isinstance(figure, dict) and "ratio" in figure:
            lines.append(f"  precision: {name} {tuned.ratio_text(figure)} fp32's speed")
    check = record["precision"]["loss_check"]
    if "fp32" in check:
        losses = ", ".join(f"{p} {check[p]:.3f}" for p in record["precision"] if p in check and p != "loss_check")
        lines.append(
            f"  validation loss after {check['steps']} steps: fp32 {check['fp32']:.3f}, {losses} "
            f"(tolerance {check['tolerance']}, {check['tokens']} tokens)"
        )
    for n, figure in record.get("threads", {}).get("candidates", {}).items():
        lines.append(f"  threads: {n} {tuned.ratio_text(figure)} the speed of {record['threads']['default']}")
    chunk = record["loss_chunk"]
    for rows, figure in chunk.get("candidates", {}).items():
        lines.append(f"  loss chunk: {rows} rows {tuned.ratio_text(figure)} the speed of {chunk['default_rows']}")
    if chunk.get("plain"):
        lines.append(f"  loss chunk: plain unfused loss {tuned.ratio_text(chunk['plain'])} the speed of the default")
    for precision, figures in record["attention_by_precision"].items():
        for kernel in [*BACKENDS, "explicit"]:
            if kernel in figures:
                said = "explicit matmul-softmax" if kernel == "explicit" else f"{kernel} kernel"
                lines.append(
                    f"  attention in {precision}: {said} {tuned.ratio_text(figures[kernel])} the dispatch's speed"
                )
    lines += [
        f"  part {p['part']} in {p['precision']}: " + ("measured" if p["measured"] else f"not measured: {p['skipped']}")
        for p in record["parts"]
    ]
    if "speedup" in record["compile"]:
        c = record["compile"]
        lines.append(f"  torch.compile: x{c['speedup']:.2f} ({c['pairs']} pairs) after {c['compile_seconds']:.0f} s")
    lines += [f"  decision {name}: {reason}" for name, reason in record["decisions"].items()]
    lines += [f"  skipped to stay within tune.seconds: {what}" for what in record["skipped"]]
    return "\n".join(lines)
