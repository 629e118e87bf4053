"""The package's shape, checked: modules import downward only (no cycle), each stays one readable
idea (under 400 lines), and the light commands do not pay for torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "buildllm"


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        # A package's __init__ is not an edge back into the package's own modules.
        graph[name] = {m for m in found if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_among_modules():
    graph = import_graph()
    assert "buildllm.cli" in graph and graph["buildllm.cli"]  # the walker reads real imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_the_command_line():
    """cli.py is the top: a module that imports it back turns the layers upside down."""
    importers = sorted(
        name for name, deps in import_graph().items() if "buildllm.cli" in deps and name != "buildllm.__main__"
    )
    assert importers == [], importers


def test_modules_stay_under_400_lines():
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) >= 400
    }
    assert not long, long


def test_ruff_reads_every_module_of_the_package_and_the_tests():
    """CI's `ruff check` and `ruff format --check` hold only for the files ruff reads; an exclude
    pattern such as "data" also matches buildllm/data/ and tests/data/, which went unchecked."""
    listed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    read = {Path(line.strip()).resolve() for line in listed.splitlines() if line.strip().endswith(".py")}
    ours = {p.resolve() for folder in (PACKAGE, ROOT / "tests") for p in folder.rglob("*.py")}
    assert sorted(map(str, ours - read)) == []


def test_the_corpus_command_does_not_import_torch_or_pandas():
    code = (
        "import sys, buildllm.cli, buildllm.data.corpus; buildllm.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'pandas', 'tokenizers') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
