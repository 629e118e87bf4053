"""The `buildllm` command line: the same code the DVC stages run, driven by the course's flags.

Flags override params.yaml (read from the working directory, or --params); both become one
validated Config. A user error prints one line and exits non-zero, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from buildllm.config import Config, load_config
from buildllm.errors import UserError

# (flag, dotted config key, type); type bool makes a switch that only ever turns a knob on.
RUN_FLAGS: list[tuple[str, str, type]] = [
    ("--iteration", "iteration", int),
    ("--preset", "preset", str),
    ("--device", "device", str),
    ("--precision", "precision", str),
    ("--seed", "seed", int),
    ("--architecture", "model.architecture", str),
    ("--sequence-length", "model.sequence_length", int),
    ("--batch-size", "train.batch_size", int),
    ("--grad-accum", "train.grad_accum", int),
    ("--epochs", "train.epochs", int),
    ("--training-examples", "train.training_examples", int),
    ("--validation-examples", "train.validation_examples", int),
    ("--learning-rate", "train.learning_rate", float),
    ("--warmup-steps", "train.warmup_steps", int),
    ("--log-interval", "train.log_interval", int),
    ("--eval-interval", "train.eval_interval", int),
    ("--checkpoint-interval", "train.checkpoint_interval", int),
    ("--keep-checkpoints", "train.keep_checkpoints", int),
    ("--checkpoint-directory", "train.checkpoint_directory", str),
    ("--workers", "train.workers", int),
    ("--threads", "train.threads", int),
    ("--train-tokens", "train.train_tokens", str),
    ("--validation-tokens", "train.validation_tokens", str),
    ("--tokenizer", "train.tokenizer", str),
    ("--compile", "train.compile", bool),
    ("--gradient-checkpointing", "train.gradient_checkpointing", bool),
    ("--resume", "train.resume", bool),
    ("--force", "train.force", bool),
]


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_run_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The course's flags; `skip` leaves some out for a command that gives them another meaning."""
    parser.add_argument("--params", default="params.yaml", help="params file (default: ./params.yaml if present)")
    for flag, key, kind in RUN_FLAGS:
        if flag in skip:
            continue
        dest = "cfg:" + key
        if kind is bool:
            parser.add_argument(flag, dest=dest, action="store_const", const=True, default=None)
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=None, help=f"overrides {key}")


def config_from_args(args: argparse.Namespace, extra: dict | None = None) -> Config:
    overrides = {name[4:]: value for name, value in vars(args).items()
                 if name.startswith("cfg:") and value is not None}
    overrides.update(extra or {})
    return load_config(args.params, overrides)


def cmd_env(args) -> None:
    from buildllm.env import print_environment

    print_environment(args.device, as_json=args.json)


def cmd_dry_run(args) -> None:
    from buildllm.dry_run import dry_run

    dry_run(config_from_args(args))


def cmd_corpus(args) -> None:
    from buildllm.corpus import build_corpus

    build_corpus(config_from_args(args))


def cmd_tokenize(args) -> None:
    from buildllm.tokenization import tokenize_corpus

    tokenize_corpus(config_from_args(args))


def cmd_train(args) -> None:
    config = config_from_args(args)
    if args.dry_run:
        from buildllm.dry_run import dry_run

        dry_run(config)
        return
    from buildllm.training import train

    train(config)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="buildllm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("env", help="what this machine offers: devices, precision support, cores, memory")
    p.add_argument("--device", default="auto", help="also resolve this device (default auto)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    p.set_defaults(handler=cmd_env)

    commands: list[tuple[str, str, Callable]] = [
        ("dry-run", "resolve device, precision and profile; count parameters; estimate memory", cmd_dry_run),
        ("corpus", "write the corpus's train and validation documents to data/", cmd_corpus),
        ("tokenize", "train the BPE tokenizer and encode train and validation tokens", cmd_tokenize),
        ("train", "train a profile on the token tensors, with checkpoints and resume", cmd_train),
    ]
    for name, help_text, handler in commands:
        p = sub.add_parser(name, help=help_text)
        add_run_flags(p)
        if name == "train":
            p.add_argument("--dry-run", action="store_true", help="plan and estimate only; train nothing")
        p.set_defaults(handler=handler)
    # These commands define their own flags beside their code.
    from buildllm import benchmark, compare, estimate, generate

    for module in (benchmark, estimate, generate, compare):
        module.register_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except UserError as exc:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike; say it once
            print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
