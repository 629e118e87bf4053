"""`buildllm wheelhouse`: a folder of wheels that installs DVC on a machine without network
(`python -m pip install --no-index --find-links wheelhouse dvc`; what goes in: docs/gpu.md).

antlr4-python3-runtime, which DVC needs through hydra, has only a source archive on PyPI: it is
built into a wheel here (pure Python, so one wheel serves every target). The folder is written
beside its place and renamed into it when complete.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from buildllm.errors import UserError
from buildllm.metrics import json_line

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
ANTLR = "antlr4-python3-runtime==4.9.3"  # hydra-core 1.3 pins antlr4 4.9.*
# The lent GPU machine's Python packages that DVC also needs or may need (gpu-machine.md).
GPU_MACHINE_HAS = (
    "torch triton tokenizers numpy pandas pyyaml psutil tqdm matplotlib pytest pytest-xdist requests rich jinja2 "
    "networkx sympy filelock fsspec aiohttp pygments"
).split()


def pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args])
    if done.returncode != 0:
        raise UserError(
            f"`pip {args[0]}` failed (exit code {done.returncode}, its output is above); check the network "
            "to PyPI and the target's --python-version and --platform"
        )


def command(args) -> None:
    requirement = args.requirement or f"dvc=={metadata.version('dvc')}"
    python_version, platforms, has = args.python_version, args.platforms or list(PLATFORMS), args.has
    if not re.fullmatch(r"3\.\d+", python_version):
        raise UserError(f"--python-version {python_version!r}: write the target's as 3.12 (major.minor)")
    out_path = Path(args.out).resolve()
    building = out_path.with_name(out_path.name + ".partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    json_line(
        wheelhouse=str(out_path),
        requirement=requirement,
        python=python_version,
        platforms=platforms,
        left_out=sorted(has),
    )
    folder = str(building)
    pip("wheel", "-q", "--no-deps", "-w", folder, ANTLR)
    platform_flags = [flag for p in [*platforms, "any"] for flag in ("--platform", p)]
    target = ["--python-version", python_version, "--implementation", "cp", *platform_flags]
    pip("download", "-q", "--only-binary=:all:", *target, "--find-links", folder, "-d", folder, requirement)
    by_name: dict = {}
    for wheel in sorted(building.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        by_name.setdefault(name, []).append((version, wheel))
    skip = {canonicalize_name(n) for n in has} - {"dvc"}
    # What the target has, and all but the newest version of a name (two stop `pip install --no-index`).
    dropped = [wheel for name, found in by_name.items() for _, wheel in (found if name in skip else sorted(found)[:-1])]
    for wheel in dropped:
        wheel.unlink()
    for other in building.iterdir():
        if other.suffix != ".whl":
            other.unlink() if other.is_file() else shutil.rmtree(other)
    shutil.rmtree(out_path, ignore_errors=True)
    building.rename(out_path)
    kept = list(out_path.glob("*.whl"))
    count, size = len(kept), sum(w.stat().st_size for w in kept)
    print(
        f"wheelhouse {out_path}: {count} wheels, {size / 2**20:.1f} MiB ({len(dropped)} left out: the target has "
        f"them, or an older version of a name kept once)"
    )


def add_arguments(parser) -> None:
    parser.add_argument("--out", default="wheelhouse", metavar="DIR", help="the folder to write (default %(default)s)")
    parser.add_argument(
        "--python-version",
        default="3.12",
        metavar="X.Y",
        help="the target's Python (default %(default)s, the lent GPU machine's)",
    )
    parser.add_argument(
        "--platform",
        dest="platforms",
        action="append",
        metavar="TAG",
        help=f"a wheel platform tag of the target, repeatable (default: {' '.join(PLATFORMS)})",
    )
    parser.add_argument(
        "--has",
        nargs="*",
        default=GPU_MACHINE_HAS,
        metavar="NAME",
        help="packages the target already has, left out "
        f"(default, the lent GPU machine's: {' '.join(GPU_MACHINE_HAS)})",
    )
    parser.add_argument(
        "--requirement",
        metavar="SPEC",
        help="what to carry (default: the DVC installed here, a dependency of buildllm, so both sides agree)",
    )
