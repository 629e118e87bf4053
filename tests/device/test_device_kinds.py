"""Device kinds are asked of the Device (buildllm/device/), never compared by name elsewhere, and
no CUDA synchronisation waits on whichever GPU happens to be current."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "buildllm"
DEVICE_PACKAGE = PACKAGE / "device"
# Resolution itself turns a requested name ("cpu", "cuda:1") into a Device: the one place outside the package.
RESOLUTION = PACKAGE / "plan" / "device.py"
KINDS = {"cpu", "cuda", "mps", "xla"}


def _kind_literals(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [
        item.value
        for item in items
        if isinstance(item, ast.Constant)
        and isinstance(item.value, str)
        and (item.value in KINDS or item.value.startswith("cuda:"))
    ]


def kind_comparisons(source: str) -> list[int]:
    """Lines that compare with a device kind's name: `kind == "cuda"`, `"cuda" in name`,
    `kind in ("mps", "xla")`, `name.startswith("cuda")`, `case "cpu":`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_kind_literals(x) for x in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and any(_kind_literals(a) for a in node.args)
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and _kind_literals(node.value):
            lines.append(node.value.lineno)
    return lines


def unindexed_cuda_synchronize(source: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and not node.args
        and not node.keywords
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "synchronize"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "cuda"
    ]


def test_the_checks_see_each_form_and_pass_what_is_not_a_kind():
    flagged = """
if kind == "cuda": pass
if device.type != "cpu": pass
if "cuda" in name: pass
if kind in ("mps", "xla"): pass
if device == "cuda:1": pass
if name.startswith("cuda"): pass
match kind:
    case "mps": pass
"""
    assert kind_comparisons(flagged) == [2, 3, 4, 5, 6, 7, 9]
    fine = 'backend = "nccl" if world.backend == "nccl" else "gloo"\nx = {"cpu": 1}[defaults]\ny = tensor.to("cpu")\n'
    assert kind_comparisons(fine) == []
    assert unindexed_cuda_synchronize("torch.cuda.synchronize()\ntorch.cuda.synchronize(index)\n") == [1]


def test_no_code_outside_the_device_package_compares_device_kinds():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if DEVICE_PACKAGE not in path.parents and path != RESOLUTION
        for line in kind_comparisons(path.read_text())
    ]
    assert not found, f"ask the Device (buildllm/device/device.py) instead of comparing kind names: {found}"


def test_every_cuda_synchronize_names_its_device():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in unindexed_cuda_synchronize(path.read_text())
    ]
    assert not found, f"torch.cuda.synchronize() waits on the current GPU, not the run's: {found}"
