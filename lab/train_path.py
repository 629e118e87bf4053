"""Which of the package's modules does `buildllm train` run code in before its first optimizer step?

    python -m lab.train_path
    python -m lab.train_path --package ../old_checkout/buildllm -- --preset tiny --training-examples 64

The course points a reader at a handful of files; this counts what a real run passes through, from
the command line to the first AdamW step of training, in two parts: before `train()` is called (the
command line, the config) and from `train()` on. A module counts once a function of it runs, so code
run while the command line and the config are built counts too (the parsers of every command, a
knob's declaration): the run executes it. Importing alone (a module's or a class's body) does not.

The run is real and short: 64 training examples, unless the flags give another number. It runs in
a temporary folder, so this project's metrics and checkpoints are left alone:
params.yaml and metrics/ are copied there, data/ and tokenizer/ linked. `--package` traces another
checkout's package (for a before and after); the process imports it in place of the installed one.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


def module_of(filename: str, package: Path) -> str | None:
    path = Path(filename)
    return path.relative_to(package.parent).as_posix() if path.is_relative_to(package) else None


class Tracer:
    """Records, in the order first seen, the package's modules whose functions run; the phase moves
    on when the train command's `train()` starts, and the record ends at the first optimizer step
    called from the trainer."""

    def __init__(self, package: Path):
        self.package = package
        self.phases: dict[str, list[str]] = {"before train()": [], "train() to the first optimizer step": []}
        self.phase = "before train()"
        self.seen: set[str] = set()
        self.stepped = False

    def from_trainer(self, frame) -> bool:
        while frame is not None:
            if module_of(frame.f_code.co_filename, self.package) == "buildllm/train/trainer.py":
                return True
            frame = frame.f_back
        return False

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        module = module_of(code.co_filename, self.package)
        if module is None:
            # An optimizer's step from the trainer (fused AdamW's support probe runs one outside it).
            self.stepped = code.co_name == "step" and "optim" in code.co_filename and self.from_trainer(frame)
            if self.stepped:
                sys.setprofile(None)  # the rest of the run goes untraced, at full speed
            return
        if module == "buildllm/train/loop.py" and code.co_name == "train":
            self.phase = "train() to the first optimizer step"
        # A function's frame, not a module's or a class body's run on import.
        if code.co_flags & inspect.CO_OPTIMIZED and module not in self.seen:
            self.seen.add(module)
            self.phases[self.phase].append(module)


def workspace(project: Path) -> Path:
    """A temporary folder holding what `buildllm train` reads from the project, and nothing it writes."""
    folder = Path(tempfile.mkdtemp(prefix="train_path_"))
    if (project / "params.yaml").is_file():
        shutil.copy(project / "params.yaml", folder / "params.yaml")
    if (project / "metrics").is_dir():
        shutil.copytree(project / "metrics", folder / "metrics")
    for name in ("data", "tokenizer"):
        if (project / name).exists():
            (folder / name).symlink_to((project / name).resolve())
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", metavar="DIR", help="the buildllm folder to trace (default: the installed one)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    parser.add_argument("flags", nargs="*", help="`buildllm train` flags, after --")
    args = parser.parse_args(argv)
    if args.package:
        package = Path(args.package).resolve()
        if not (package / "train" / "trainer.py").is_file():
            parser.exit(2, f"{package} is not a buildllm package folder (no train/trainer.py); give its path\n")
        sys.path.insert(0, str(package.parent))
    import buildllm
    from buildllm.cli import main as buildllm_main

    package = Path(buildllm.__file__).resolve().parent
    project, folder = Path.cwd(), workspace(Path.cwd())
    flags = list(args.flags)
    if "--training-examples" not in flags:
        flags += ["--training-examples", "64"]
    flags += ["--checkpoint-directory", str(folder / "checkpoints")]
    print(json.dumps({"action": "train_path", "package": str(package), "folder": str(folder), "flags": flags}))
    tracer = Tracer(package)
    try:
        os.chdir(folder)
        sys.setprofile(tracer)
        code = buildllm_main(["train", *flags])
    finally:
        sys.setprofile(None)
        os.chdir(project)
        shutil.rmtree(folder, ignore_errors=True)
    if not tracer.stepped:
        print(f"train_path: the run ended (exit {code}) without an optimizer step; see its output above")
        return 1
    if args.json:
        print(json.dumps({"package": str(package), **tracer.phases}))
        return 0
    total = sum(map(len, tracer.phases.values()))
    print(f"{total} modules of {package} ran code before the first optimizer step of `buildllm train`:")
    for phase, modules in tracer.phases.items():
        print(f"  {phase}: {len(modules)}")
        for module in modules:
            print(f"    {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
