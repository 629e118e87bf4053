"""Makes this Python look like the lent GPU machine's: the top-level modules named in
$BUILDLLM_BLOCKED_IMPORTS (comma-separated) cannot be imported, as if not installed.

Python imports `sitecustomize` at startup from the first folder on sys.path that has one; putting
this folder on PYTHONPATH installs the blocker in every process started with that environment
(pytest, `python -m buildllm`, the truth scripts), which a venv with --system-site-packages cannot
do: it would still see every package of the base interpreter. tests/standin.py decides the names.
"""

import os
import sys

_BLOCKED = frozenset(filter(None, os.environ.get("BUILDLLM_BLOCKED_IMPORTS", "").split(",")))


class _NotInstalled:
    """A meta-path finder ahead of all others: a blocked name fails as a missing package does."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed on the GPU machine)", name=name)
        return None


if _BLOCKED:
    sys.meta_path.insert(0, _NotInstalled())
