"""The fault catalogue (docs/faults.md) against the tests it names: a guarantee whose proof was renamed
or removed would otherwise stay in the docs, proved by nothing."""

from __future__ import annotations

import ast
import re

from conftest import ROOT

CATALOGUE = ROOT / "docs" / "faults.md"
PROOF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def defined_tests(path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


def test_every_test_the_docs_name_exists():
    named = [(doc, *match) for doc in sorted((ROOT / "docs").glob("*.md")) for match in PROOF.findall(doc.read_text())]
    assert len(named) >= 20, "the catalogue names its proofs as `tests/FILE.py::test_name`"
    missing = [
        f"{doc.name}: {file}::{test}"
        for doc, file, test in named
        if not (ROOT / file).is_file() or test not in defined_tests(ROOT / file)
    ]
    assert not missing, missing


def test_every_fault_in_the_catalogue_has_a_proof():
    rows = [line for line in CATALOGUE.read_text().splitlines() if line.startswith("| ") and " --- " not in line]
    faults = [row for row in rows if not row.startswith("| fault |")]
    assert faults and all(PROOF.search(row.rsplit("|", 2)[-2]) for row in faults), [
        row[:80] for row in faults if not PROOF.search(row.rsplit("|", 2)[-2])
    ]
