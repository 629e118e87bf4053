"""How a knob is declared (knob()) and checked (build(): a mapping, params.yaml plus overrides, into
the frozen dataclasses). The knobs themselves are declared in buildllm/config.py.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import field, fields, is_dataclass
from typing import Any

from buildllm.errors import ConfigError
from buildllm.units import parse_size

TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
# Which commands offer a knob's flag by default: those that run or plan a model.
MODEL_COMMANDS = ("dry-run", "train", "benchmark", "estimate", "preflight", "fits", "tune")


def knob(
    default: Any,
    *,
    choices: tuple | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    help: str = "",
    flag: bool = False,
    metavar: str | None = None,
    control: bool = False,
    resume: bool = False,
    commands: tuple[str, ...] = MODEL_COMMANDS,
    size: bool = False,
) -> Any:
    """A config field with everything said about it once: its checks (the declaration is the
    validation), whether it has a command-line flag (named after the field: batch_size is
    --batch-size) and its help (the CLI is generated from these), whether a report always shows it
    as a key control, whether a resume must find it unchanged, which commands offer its flag, and
    whether it is a byte count written as a person writes one (size: "4GiB", kept as written)."""
    meta = {name: value for name, value in locals().items() if name != "default"}  # every keyword is metadata
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def leaf_knobs(cls: type, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf knob of `cls` as (dotted key, dataclass field, type hint), in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out += leaf_knobs(hints[f.name], prefix + f.name + ".")
        else:
            out.append((prefix + f.name, f, hints[f.name]))
    return out


def base_type(hint: Any) -> Any:
    """int for Optional[int]: the type a value must have when it is given."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and args else hint


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part} is not a section")
    node[leaf] = value


def build(cls: type, data: Mapping, prefix: str = "") -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'params'} must be a section (a mapping), got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    if unknown := sorted(set(data) - set(known)):
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(f"unknown key {prefix}{unknown[0]} in {where}; allowed keys: {', '.join(known)}")
    values = {}
    for name, value in data.items():
        key = prefix + name
        if is_dataclass(hints[name]):
            values[name] = build(hints[name], value or {}, prefix=key + ".")
        else:
            values[name] = check(key, value, hints[name], known[name].metadata)
    return cls(**values)


def check(key: str, value: Any, hint: Any, meta: Mapping) -> Any:
    base = base_type(hint)
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise ConfigError(f"{key} must not be empty; give {TYPE_NAMES.get(base, base)}")
    if typing.get_origin(base) is list:  # a list of numbers (tokenize.vocabularies): each item checked alone
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{key}={value!r} must be a non-empty list")
        return [check(f"{key}[{i}]", item, typing.get_args(base)[0], meta) for i, item in enumerate(value)]
    if meta.get("size"):
        return check_size(key, value)
    choices = meta.get("choices")
    if base is str and choices and isinstance(value, bool) and str(value).lower() in choices:
        value = str(value).lower()  # YAML's true/false for a knob whose choices spell them
    if not (base is str and choices):  # a value among a string knob's choices is a string
        value = coerce(key, value, base)
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, choices))}")
    low, high = meta.get("minimum"), meta.get("maximum")
    if low is not None and value < low:
        raise ConfigError(f"{key}={value!r} is too small; it must be at least {low}")
    if high is not None and value > high:
        raise ConfigError(f"{key}={value!r} is too large; it must be at most {high}")
    return value


def check_size(key: str, value: Any) -> str:
    """A byte count, checked where it is given (a flag or params.yaml), whichever command reads it."""
    bytes_ = None if isinstance(value, bool) else parse_size(value)
    if bytes_ is None:
        raise ConfigError(f"{key}={value!r} is not a size; write e.g. 4GiB, 512MiB or 8000000000")
    if bytes_ < 1:
        raise ConfigError(f"{key}={value!r} is no memory at all; give a positive size, e.g. 4GiB")
    return str(value)


def coerce(key: str, value: Any, base: Any) -> Any:
    wrong = ConfigError(f"{key}={value!r} has the wrong type; it must be {TYPE_NAMES.get(base, base)}")
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise wrong
        try:
            number = float(value)  # YAML 1.1 reads "3e-4" as a string
        except ValueError:
            raise wrong from None
        if not math.isfinite(number):  # nan passes every minimum/maximum comparison
            raise ConfigError(f"{key}={value!r} is not a finite number; give a finite number")
        return number
    if base is list:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key}={value!r} must be a list of strings")
    # bool is a subclass of int, and YAML's true must not pass for 1.
    if isinstance(value, base) and (base is bool or not isinstance(value, bool)):
        return value
    raise wrong
