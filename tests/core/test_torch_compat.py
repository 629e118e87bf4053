"""docs/torch-compat.md lists every torch API buildllm calls, with the evidence that 2.11 has it: the
list stays complete (a new call fails here until it is listed and checked) and every listed name
resolves in the installed torch."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "torch-compat.md"
ALIASES = {"F": "torch.nn.functional", "nn": "torch.nn", "dist": "torch.distributed"}


def listed() -> set[str]:
    """Dotted names in the API column's backticks; `a.{b, c}` is a.b and a.c, call arguments dropped."""
    names = set()
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        for code in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            code = re.sub(r"\([^)]*\)", "", code).strip()
            match = re.fullmatch(r"([\w.]+)\.\{([^}]*)\}(.*)", code)
            if match:
                names |= {f"{match[1]}.{part.strip()}{match[3]}" for part in match[2].split(",")}
            elif code.startswith("torch"):
                names.add(code)
    return {n for n in names if re.fullmatch(r"torch(\.\w+)+", n)}


def used() -> set[str]:
    chains = set()
    for path in (ROOT / "buildllm").rglob("*.py"):
        text = path.read_text()
        chains |= set(re.findall(r"\btorch(?:\.[A-Za-z_]\w*)+", text))
        for alias, full in ALIASES.items():
            chains |= {full + rest for rest in re.findall(rf"(?<![\w.]){alias}((?:\.[A-Za-z_]\w*)+)", text)}
    return chains


def test_every_torch_api_buildllm_calls_is_listed():
    names = listed()
    # torch.nn.functional is covered by its listed functions: a chain is listed, or is the prefix of a listed name.
    missing = sorted(c for c in used() if c not in names and not any(n.startswith(c + ".") for n in names))
    assert not missing, f"add these to docs/torch-compat.md with the release that added them: {missing}"


@pytest.mark.parametrize("name", sorted(listed()))
def test_every_listed_api_resolves_in_the_installed_torch(name):
    obj, parts = torch, name.split(".")
    for depth, part in enumerate(parts[1:], start=2):
        # torch.optim deletes its submodules' names (torch.optim.adamw), which stay importable.
        obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(".".join(parts[:depth]))
