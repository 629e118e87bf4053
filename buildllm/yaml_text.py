"""A YAML file a person wrote (params.yaml, a --params file, a -S value): read as UTF-8 text, and a
mistake in it said in one line with its place, instead of PyYAML's several-line message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from buildllm.errors import ConfigError


def read_yaml(path: str | Path) -> Any:
    """A YAML file a person wrote; a mistake in it is one line naming the file, the line and the column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} on line {line}); save it as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {yaml_problem(exc, text)}; fix it there") from None


def yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """Where and what, from PyYAML's several-line message: "line 3, column 10 (`   epochs: 2`): mapping
    values are not allowed here"."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return problem
    lines = text.splitlines()
    shown = f" (`{lines[mark.line].rstrip()}`)" if mark.line < len(lines) and lines[mark.line].strip() else ""
    context = getattr(exc, "context", None)
    opened = getattr(exc, "context_mark", None)
    since = f", {context} opened on line {opened.line + 1}" if context and opened and opened.line != mark.line else ""
    return f"line {mark.line + 1}, column {mark.column + 1}{shown}: {problem}{since}"
