"""`buildllm compare`: build the comparison, write the report, say the verdict. Kept apart from
compare.py (which builds) because render.py (which writes) imports it: compare.py never imports render."""

from __future__ import annotations

import json
from pathlib import Path

from buildllm.errors import UserError
from buildllm.report.compare import compare
from buildllm.report.render import write_report


def run_compare(names: list, out: str, allow_different: bool, vary: list | None, paired: bool, rounds: int | None):
    if rounds is not None and not paired:
        raise UserError(f"--rounds {rounds} applies to --paired only; add --paired to re-measure the benchmarks here")
    rounds = 6 if rounds is None else rounds

    print(
        json.dumps(
            {
                "action": "compare",
                "experiments": names or "workspace and the current baseline's experiments",
                "out": out,
                "vary": vary or [],
                "allow_different": allow_different,
                "paired_rounds": rounds if paired else None,
            }
        ),
        flush=True,
    )
    comparison = compare(names, allow_different, vary, rounds=rounds if paired else None)
    for name, why in comparison.excluded:
        print(f"excluded {name}: {why}")
    paths = write_report(comparison, Path(out))
    print(comparison.verdict)
    print("report written: " + ", ".join(str(p) for p in paths))
