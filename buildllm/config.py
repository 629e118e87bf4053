"""The one config: params.yaml (or defaults) plus CLI flags -> one validated, typed, frozen object.

Nothing else in the package reads params.yaml. Every knob is declared once here, with its type,
default and allowed values; a bad value raises ConfigError naming the key, the value and what is
allowed. The code reads the Config object and nothing else.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from buildllm.errors import ConfigError

PRESETS = ("tiny", "student", "small")
ARCHITECTURES = ("classic", "modern")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
CORPUS_SOURCES = ("wiki_vital", "shakespeare", "files")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps|xla)$")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps, xla"
TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def knob(default: Any, *, choices: tuple | None = None, minimum: float | None = None,
         maximum: float | None = None, doc: str = "") -> Any:
    """A config field with its checks attached, so the declaration is the validation."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default),
                     metadata={"choices": choices, "minimum": minimum, "maximum": maximum, "doc": doc})
    return field(default=default,
                 metadata={"choices": choices, "minimum": minimum, "maximum": maximum, "doc": doc})


@dataclass(frozen=True)
class CorpusConfig:
    source: str = knob("wiki_vital", choices=CORPUS_SOURCES)
    # Globs of plain-text files, used when source is `files`.
    files: list = knob([])
    # Names the corpus's output folders; defaults to the source.
    name: Optional[str] = None
    # Above 0: training needs validation documents to report a validation loss.
    validation_percent: float = knob(5.0, minimum=0.1, maximum=50.0)


@dataclass(frozen=True)
class TokenizeConfig:
    # None: the vocabulary size the profile names.
    vocab_size: Optional[int] = knob(None, minimum=257)
    min_frequency: int = knob(2, minimum=1)
    encode_chunk: int = knob(1000, minimum=1)


@dataclass(frozen=True)
class ModelConfig:
    """Overrides of the profile's model shape; None keeps the profile's value."""

    architecture: Optional[str] = knob(None, choices=ARCHITECTURES)
    n_layer: Optional[int] = knob(None, minimum=1)
    n_head: Optional[int] = knob(None, minimum=1)
    n_embd: Optional[int] = knob(None, minimum=1)
    sequence_length: Optional[int] = knob(None, minimum=2)
    dropout: Optional[float] = knob(None, minimum=0.0, maximum=1.0)


@dataclass(frozen=True)
class TrainConfig:
    # None: the profile's default for the resolved device.
    batch_size: Optional[int] = knob(None, minimum=1)
    grad_accum: int = knob(1, minimum=1)
    epochs: int = knob(1, minimum=1)
    # None: every example in the token file.
    training_examples: Optional[int] = knob(500, minimum=1)
    validation_examples: Optional[int] = knob(100, minimum=1)
    learning_rate: Optional[float] = knob(None, minimum=0.0)
    min_learning_rate_ratio: float = knob(0.1, minimum=0.0, maximum=1.0)
    # None: 5% of the planned optimizer steps.
    warmup_steps: Optional[int] = knob(None, minimum=0)
    weight_decay: float = knob(0.1, minimum=0.0)
    grad_clip: float = knob(1.0, minimum=0.0)
    log_interval: int = knob(10, minimum=1)
    # 0: only at the end of training.
    eval_interval: int = knob(50, minimum=0)
    checkpoint_interval: int = knob(100, minimum=0)
    keep_checkpoints: int = knob(2, minimum=1)
    checkpoint_directory: str = "checkpoints/run"
    workers: Optional[int] = knob(None, minimum=0)
    threads: Optional[int] = knob(None, minimum=1)
    compile: bool = False
    gradient_checkpointing: bool = False
    # None: the files the tokenize stage writes for this corpus and vocabulary.
    train_tokens: Optional[str] = None
    validation_tokens: Optional[str] = None
    tokenizer: Optional[str] = None
    resume: bool = False
    force: bool = False


@dataclass(frozen=True)
class BenchmarkConfig:
    warmup_steps: int = knob(3, minimum=1)
    measured_steps: int = knob(20, minimum=2)
    intervals: int = knob(4, minimum=1)
    # The batch-size finder: a size such as "4GiB" (None: free host memory, or the GPU's memory).
    memory_budget: Optional[str] = None
    safety_margin: float = knob(0.1, minimum=0.0, maximum=0.9)
    max_batch_size: int = knob(1024, minimum=1)


@dataclass(frozen=True)
class EstimateConfig:
    # Seconds added once for process start, data loading and model build.
    startup_seconds: Optional[float] = knob(None, minimum=0.0)


@dataclass(frozen=True)
class Config:
    device: str = "auto"
    precision: str = knob("auto", choices=PRECISIONS)
    iteration: int = knob(1, choices=(1, 2, 3))
    # A preset replaces the iteration's profile.
    preset: Optional[str] = knob(None, choices=PRESETS)
    seed: int = knob(1337, minimum=0)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)


def load_config(path: str | Path | None = "params.yaml", overrides: Mapping[str, Any] | None = None) -> Config:
    """Read params.yaml (absent file: defaults), apply dotted overrides, validate everything."""
    data: dict = {}
    if path is not None and Path(path).exists():
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML ({str(exc).splitlines()[0]}); fix the file") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of keys to values, not {type(data).__name__}")
    elif path is not None and str(path) != "params.yaml":
        raise ConfigError(f"params file {path} does not exist; pass an existing file to --params")
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return _build(Config, data, prefix="")


def config_to_dict(config: Config) -> dict:
    return asdict(config)


def with_overrides(config: Config, overrides: Mapping[str, Any]) -> Config:
    """A new validated Config with dotted keys replaced (used by sweeps over presets or threads)."""
    data = config_to_dict(config)
    for dotted, value in overrides.items():
        _set_dotted(data, dotted, value)
    return _build(Config, data, prefix="")


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {part} is not a section")
    node[leaf] = value


def _build(cls: type, data: Mapping, prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'params'} must be a section (a mapping), got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(f"unknown key {prefix}{unknown[0]} in {where}; allowed keys: {', '.join(known)}")
    values = {}
    for name, f in known.items():
        key = prefix + name
        if name not in data:
            continue
        if is_dataclass(hints[name]):
            values[name] = _build(hints[name], data[name] or {}, prefix=key + ".")
        else:
            values[name] = _check(key, data[name], hints[name], f.metadata)
    config = cls(**values)
    if cls is Config and not DEVICE_PATTERN.match(config.device):
        raise ConfigError(f"device={config.device!r} is not a device; allowed: {DEVICE_CHOICES}")
    return config


def _check(key: str, value: Any, hint: Any, meta: Mapping) -> Any:
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} must not be empty; give {TYPE_NAMES.get(base, base)}")
    value = _coerce(key, value, base)
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed values: {', '.join(map(str, choices))}")
    low, high = meta.get("minimum"), meta.get("maximum")
    if low is not None and value < low:
        raise ConfigError(f"{key}={value!r} is too small; it must be at least {low}")
    if high is not None and value > high:
        raise ConfigError(f"{key}={value!r} is too large; it must be at most {high}")
    return value


def _coerce(key: str, value: Any, base: Any) -> Any:
    def wrong() -> ConfigError:
        return ConfigError(f"{key}={value!r} has the wrong type; it must be {TYPE_NAMES.get(base, base)}")

    if base is bool:
        if isinstance(value, bool):
            return value
        raise wrong()
    if base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong()
    if base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            try:
                return float(value)
            except ValueError:
                raise wrong() from None
        raise wrong()
    if base is str:
        if isinstance(value, str):
            return value
        raise wrong()
    if base is list:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise ConfigError(f"{key}={value!r} must be a list of strings")
    raise TypeError(f"config field {key} has an unsupported type {base}")  # a bug here, not user input


def defaults_dict() -> dict:
    """The defaults as params.yaml would hold them (tests check params.yaml against this)."""
    return config_to_dict(Config())


__all__ = ["Config", "CorpusConfig", "TokenizeConfig", "ModelConfig", "TrainConfig", "BenchmarkConfig",
           "EstimateConfig", "load_config", "with_overrides", "config_to_dict", "defaults_dict", "replace"]
