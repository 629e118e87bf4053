"""DVC's promise holds only if each stage lists what its result depends on. These tests derive each
stage's real dependencies from its entry script's imports (every `import`, also inside functions)
and fail when dvc.yaml misses one, so a stale cached metric cannot come from a forgotten dep."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from buildllm.config import Config, knobs

ROOT = Path(__file__).resolve().parents[2]
# A foreach stage (tokenize: one per vocabulary) is checked through its template.
STAGES = {name: s.get("do", s) for name, s in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items()}
SECTIONS = {f.split(".")[0] for f, _, _ in knobs() if "." in f}
TOP_KEYS = {key for key, _, _ in knobs() if "." not in key}
# Modules that declare or pass the config on without reading a knob's value.
NOT_READERS = {"buildllm/config.py", "buildllm/cli.py"}
# Keys a stage sets itself before anything reads them, so their params value cannot change its
# result: tune measures every precision (buildllm/measure/tune.py `fixed`), and an experiment over
# precision should not measure this machine again.
SET_BY_STAGE = {"tune": {"precision"}}


def module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return {name for name in found if name.split(".")[0] == "buildllm"}


def closure(script: Path) -> set[Path]:
    """Every buildllm file the script may run: its imports, theirs, and each package's __init__."""
    seen: set[Path] = set()
    todo = [script]
    while todo:
        path = todo.pop()
        for name in imported_modules(path):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                found = module_file(".".join(parts[:i]))
                if found and found not in seen:
                    seen.add(found)
                    todo.append(found)
    return seen


def stage_script(stage: dict) -> Path:
    match = re.fullmatch(r"python (stages/\w+\.py)( \$\{item\})?", stage["cmd"])
    assert match, f"stage command {stage['cmd']!r} is not `python stages/NAME.py`"
    return ROOT / match.group(1)


def covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(ROOT).as_posix()
    return any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps)


def code_deps(deps: list[str]) -> list[str]:
    return [d for d in deps if d.startswith("buildllm")]


def needless(dep: str, modules: set[Path]) -> bool:
    """A code dep that reruns the stage for code it never runs: a module outside its closure, or a folder
    holding one. (A folder dep is for package data, like the profiles' YAML files.)"""
    path = ROOT / dep
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return any(f not in modules for f in files)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stage_depends_on_exactly_the_code_it_imports(name):
    stage = STAGES[name]
    script = stage_script(stage)
    deps = stage.get("deps", [])
    assert covered(script, deps), f"{name}: its own script is not in its deps"
    modules = closure(script)
    assert not any(p.name == "cli.py" for p in modules), f"{name}: a stage script must not reach buildllm/cli.py"
    wanted = sorted(p.relative_to(ROOT).as_posix() for p in modules)
    missing = [m for m in wanted if not covered(ROOT / m, deps)]
    extra = [d for d in code_deps(deps) if needless(d, modules)]
    assert not missing and not extra, (
        f"dvc.yaml stage {name}: missing {missing}, not imported {extra}; its code deps are exactly: {wanted}"
    )


def test_closure_follows_imports_inside_functions(tmp_path):
    """The walker must see a lazy import, or a dependency reached only through one would go missing."""
    script = tmp_path / "stage.py"
    script.write_text("def run():\n    from buildllm.measure.batch_finder import find_batch_size\n")
    names = {p.relative_to(ROOT).as_posix() for p in closure(script)}
    assert "buildllm/measure/batch_finder.py" in names
    assert "buildllm/measure/__init__.py" in names


def is_config(node: ast.AST) -> bool:
    """`config` or `<anything>.config`: the names the package gives the Config object."""
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config"
    )


def read_keys(paths: set[Path]) -> set[str]:
    """Config keys the code may read, found generously: `config.section.key` is that key, and so is
    `alias.key` after `alias = config.section`; a section used any other way (passed on) counts as
    the whole section, except as the first argument of `replace(...)`, which rewrites keys."""
    keys = set()
    for path in paths:
        if path.relative_to(ROOT).as_posix() in NOT_READERS:
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                pairs = [(node.targets[0], node.value)]
                if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(node.targets[0].elts, node.value.elts))
                for target, value in pairs:
                    if (
                        isinstance(target, ast.Name)
                        and isinstance(value, ast.Attribute)
                        and value.attr in SECTIONS
                        and is_config(value.value)
                    ):
                        aliases[target.id] = value.attr
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in aliases:
                keys.add(f"{aliases[node.value.id]}.{node.attr}")
            if not is_config(node.value):
                continue
            if node.attr in TOP_KEYS:
                keys.add(node.attr)
            elif node.attr in SECTIONS:
                parent = parents.get(node)
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    keys.add(f"{node.attr}.{parent.attr}")
                elif isinstance(parent, ast.Assign) and any(node in ast.walk(v) for v in [parent.value]):
                    continue  # an alias: its reads were counted above
                elif isinstance(parent, ast.Tuple) and isinstance(parents.get(parent), ast.Assign):
                    continue
                elif (
                    isinstance(parent, ast.Call)
                    and parent.args
                    and parent.args[0] is node
                    and getattr(parent.func, "id", "") == "replace"
                ):
                    continue
                else:
                    keys.add(node.attr)
    return keys


def params_cover(key: str, params: list) -> bool:
    names = [p if isinstance(p, str) else next(iter(p)) for p in params]
    return any(key == n or key.startswith(n + ".") for n in names)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_config_key_a_stage_reads_is_a_param(name):
    stage = STAGES[name]
    keys = read_keys(closure(stage_script(stage)))
    defaults = {key for key, _, _ in knobs()} | SECTIONS
    keys &= defaults  # attribute names that are not config keys (a tensor's .device, say) drop out
    keys -= SET_BY_STAGE.get(name, set())
    missing = sorted(k for k in keys if not params_cover(k, stage.get("params", [])))
    assert not missing, f"dvc.yaml stage {name} reads these config keys but does not list them in params: {missing}"


def test_every_param_a_stage_lists_is_a_config_key():
    keys = {key for key, _, _ in knobs()} | SECTIONS
    for name, stage in STAGES.items():
        for param in stage.get("params", []):
            assert param in keys, f"stage {name} lists param {param!r}, which is no config key"


def test_params_yaml_holds_exactly_the_defaults():
    from buildllm.config import defaults_dict

    assert yaml.safe_load((ROOT / "params.yaml").read_text()) == defaults_dict()
    assert Config() == Config()
