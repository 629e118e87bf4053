"""Makes this Python look like the lent GPU machine's: the top-level modules named in
$BUILDLLM_BLOCKED_IMPORTS and the distributions named in $BUILDLLM_BLOCKED_DISTRIBUTIONS
(comma-separated) are not there, as if never installed.

Python imports `sitecustomize` at startup from the first folder on sys.path that has one, after the
site-packages' .pth files; putting this folder on PYTHONPATH hides them in every process started with
that environment (pytest, `python -m buildllm`, the truth scripts), which a venv made with
--system-site-packages cannot do: it would still see every package of the base interpreter.
Every finder is wrapped so that for a hidden name it finds nothing: an import fails with the usual
ModuleNotFoundError, importlib.util.find_spec answers None (torch asks it of optional packages),
and importlib.metadata does not list the distribution (no pytest plugin, no version).
tests/standin.py decides the names.
"""

import os
import re
import sys

_MODULES = frozenset(filter(None, os.environ.get("BUILDLLM_BLOCKED_IMPORTS", "").split(",")))
_DISTRIBUTIONS = frozenset(filter(None, os.environ.get("BUILDLLM_BLOCKED_DISTRIBUTIONS", "").split(",")))


def _key(name):
    return re.sub(r"[-_.]+", "-", name or "").lower()


class _Hiding:
    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _MODULES or not hasattr(self._finder, "find_spec"):
            return None
        return self._finder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        found = getattr(self._finder, "find_distributions", None)
        for dist in found(*args, **kwargs) if found else ():
            if _key(dist.metadata["Name"]) not in _DISTRIBUTIONS:
                yield dist

    def __getattr__(self, name):
        return getattr(self._finder, name)


if _MODULES or _DISTRIBUTIONS:
    sys.meta_path[:] = [_Hiding(finder) for finder in sys.meta_path]
