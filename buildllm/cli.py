"""The `buildllm` command line: the same code the DVC stages run, driven by the course's flags.

Flags override params.yaml (read from the working directory, or --params); both become one
validated Config. The run flags are generated from the Config's own field declarations, so a knob
is declared once. Commands are imported only when run: `buildllm corpus` never imports torch.
"""

from __future__ import annotations

import argparse

from buildllm.config import Config, knobs, load_config
from buildllm.disk import as_user_error
from buildllm.errors import guarded
from buildllm.knob import base_type
from buildllm.torch_env import before_torch


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_params(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--params", default="params.yaml", metavar="PATH", help=help_text)


def add_run_flags(parser: argparse.ArgumentParser, command: str, skip: tuple[str, ...] = ()) -> None:
    """The course's flags that `command` uses: one per Config knob that declares a flag and names the
    command; `skip` leaves some out for a command that gives them another meaning."""
    add_params(parser, "params file (default: ./params.yaml if present)")
    for key, f, hint in knobs():
        meta, kind = f.metadata, base_type(hint)
        flag = "--" + key.rsplit(".", 1)[-1].replace("_", "-")
        if not meta["flag"] or flag in skip or command not in meta["commands"]:
            continue
        dest = "cfg:" + key
        help_text = f"{meta['help']} ({key})" if meta.get("help") else key
        if kind is bool:  # a switch only ever turns a knob on; params.yaml turns it off
            parser.add_argument(flag, dest=dest, action="store_const", const=True, default=None, help=help_text)
            continue
        # Allowed values show in the metavar; the Config checks them, so the error reads as any config error.
        choices = meta.get("choices")
        shown = "{" + ",".join(map(str, choices)) + "}" if choices else "N" if kind is int else "VALUE"
        metavar = meta["metavar"] or shown
        # A knob whose choices include "true" keeps its bare switch: --compile means --compile true.
        switch = dict(nargs="?", const="true") if choices and "true" in choices else {}
        parser.add_argument(flag, dest=dest, type=kind, default=None, metavar=metavar, help=help_text, **switch)


def config_from_args(args: argparse.Namespace, extra: dict | None = None) -> Config:
    overrides = {name[4:]: value for name, value in vars(args).items() if name.startswith("cfg:") and value is not None}
    overrides.update(extra or {})
    return before_torch(load_config(args.params, overrides))


def run(args) -> None:
    """Each command's code, imported when it runs with a plain import that a reader (and static tools)
    can follow."""
    match args.command:
        case "env":
            from buildllm.device.hardware import print_environment
            from buildllm.plan.device import resolve_device

            print_environment(resolve_device(args.device), args.json)
        case "generate":
            config = config_from_args(args)  # before torch is imported
            from buildllm.train.generate import command

            command(args, config)
        case "compare":
            from buildllm.report.render import run_compare

            run_compare(args.names, args.out, args.allow_different, args.vary, args.paired, args.rounds)
        case "report":
            from buildllm.report.run_card import report

            report(load_config(args.params), args.experiment, args.out)
        case "benchmark":
            # One value of --threads or --workers is a setting; several make a sweep.
            given = {"train.threads": args.threads or [], "train.workers": args.workers or []}
            config = config_from_args(args, {key: values[0] for key, values in given.items() if len(values) == 1})
            swept = [values if len(values) > 1 else None for values in given.values()]
            if args.find_batch_size:
                from buildllm.measure.batch_finder import find_batch_size

                find_batch_size(config)
            elif args.presets or args.architectures or any(swept):
                from buildllm.measure.sweep import sweep

                sweep(config, args.presets, args.architectures, *swept)
            else:
                from buildllm.measure.benchmark import benchmark

                benchmark(config)
        case _:  # the commands that take the validated Config alone
            config = config_from_args(args)
            match "dry-run" if getattr(args, "dry_run", False) else args.command:
                case "dry-run":
                    from buildllm.predict.dry_run import dry_run as command
                case "corpus":
                    from buildllm.data.corpus import build_corpus as command
                case "tokenize":
                    from buildllm.data.tokenize_command import tokenize_command as command
                case "estimate":
                    from buildllm.predict.estimate import estimate as command
                case "preflight":
                    from buildllm.predict.preflight import preflight as command
                case "fits":
                    from buildllm.predict.fits import fits as command
                case "train":
                    from buildllm.train.loop import train as command
                case "tune":
                    from buildllm.measure.tune import tune as command
            command(config)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="buildllm", description=__doc__.splitlines()[0])
    parser.set_defaults(handler=run)  # verify's and remote's own handlers override it
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("env", help="what this machine offers: devices, precision support, cores, memory")
    p.add_argument("--device", default="auto", help="also resolve this device (default auto)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")

    for name, help_text in {
        "dry-run": "resolve device, precision and profile; count parameters; estimate memory",
        "corpus": "write the corpus's train and validation documents to data/",
        "tokenize": "train the BPE tokenizer and encode train and validation tokens",
        "estimate": "project the full run's time and storage from metrics/benchmark.json",
        "preflight": "stop and check before a full run: device, precision, benchmark, estimate, disk, power, "
        "cooling, checkpoint directory",
        "fits": "the largest batch each profile and precision fits in 8 to 141 GiB, from the memory model",
    }.items():
        p = sub.add_parser(name, help=help_text)
        add_run_flags(p, name)

    p = sub.add_parser("train", help="train a profile on the token tensors, with checkpoints and resume")
    add_run_flags(p, "train")
    p.add_argument("--dry-run", action="store_true", help="plan and estimate only; train nothing")

    p = sub.add_parser("benchmark", help="measure training speed, memory and MFU with the train code path")
    add_run_flags(p, "benchmark", skip=("--threads", "--workers"))
    p.add_argument("--threads", type=int, nargs="+", metavar="N", help="torch threads; several values make a sweep")
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        metavar="N",
        help="data-loader workers; several values make a sweep (with its data-wait share)",
    )
    p.add_argument("--presets", nargs="+", metavar="PRESET", help="sweep these presets (tiny student small ...)")
    p.add_argument("--architectures", nargs="+", choices=("classic", "modern"), help="sweep these architectures")
    p.add_argument(
        "--find-batch-size",
        action="store_true",
        help="find the largest batch size that fits (doubling, then bisecting)",
    )

    p = sub.add_parser(
        "tune",
        help="measure this machine's auto decisions (precision, threads, the fused loss's "
        "chunk, torch.compile) within --seconds; the plan reads metrics/tune.json",
    )
    add_run_flags(p, "tune", skip=("--precision", "--compile", "--threads"))

    p = sub.add_parser("generate", help="print text from a trained checkpoint")
    add_run_flags(p, "generate")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100, metavar="N")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="below 1: safer text; above 1: wilder")
    p.add_argument("--top-k", type=int, default=50, metavar="K", help="sample among the k likeliest tokens (0: all)")
    p.add_argument("--greedy", action="store_true", help="always the likeliest token (temperature ignored)")
    p.add_argument("--no-kv-cache", dest="kv_cache", action="store_false", help="recompute the whole context")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer JSON, if not the one recorded in the checkpoint")

    p = sub.add_parser("compare", help="compare DVC experiments (device, precision) in a report, controls first")
    p.add_argument(
        "names",
        nargs="*",
        help="experiments, commits, branches or metrics folders from another machine "
        "(default: the workspace and every experiment of the current baseline); "
        "the first is the speed-up reference",
    )
    p.add_argument(
        "--out",
        default="reports/device_comparison",
        metavar="PATH",
        help="report path without suffix: writes .md, .csv, .png and .html (default %(default)s)",
    )
    p.add_argument(
        "--allow-different",
        action="store_true",
        help="show speed-ups even when controls differ (the differences stay in the report)",
    )
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY",
        help="a param that is meant to differ, like train.threads (repeatable)",
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="re-measure the experiments' benchmarks here, interleaved in fresh processes, and report "
        "the median speed-up with its 95%% interval (survives a busy machine)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="--paired: rounds of one run per experiment (default 6, the fewest for a 95%% interval)",
    )

    p = sub.add_parser(
        "report",
        help="the run card: one self-contained HTML page and its PNG (machine, plan, memory, "
        "step time, estimate against the run, loss, a text sample)",
    )
    add_params(p, "params file (default ./params.yaml)")
    p.add_argument(
        "--experiment",
        metavar="NAME",
        help="an experiment, commit, branch or metrics folder, read from "
        "its commit (default: the workspace, with a fresh sample)",
    )
    p.add_argument(
        "--out",
        metavar="PATH",
        help="path without suffix: writes .html and .png (default plots/run_card "
        "for the workspace, reports/run_card_NAME for an experiment)",
    )
    add_verify(sub)
    add_remote(sub)
    return parser


def add_verify(sub) -> None:
    """The checks (buildllm/verify/): torch-free modules, each bringing its own flags and its command."""
    from buildllm.verify import estimate, memory, mfu, speed

    p = sub.add_parser("verify", help="check the product's estimates against measurements here (exit 1 on a miss)")
    checks = p.add_subparsers(dest="check", required=True, parser_class=Parser)
    for check, module, help_text in (
        ("memory", memory, "the memory estimate against the measured peak, on fitted and held-out shapes"),
        ("estimate", estimate, "benchmark, estimate and a real training run: did the run's time fall inside the range"),
        ("mfu", mfu, "the same benchmark in fresh processes: MFU recomputable from each file and steady across runs"),
        ("speed", speed, "the product's training step against a bare one, interleaved: its overhead within 3%%"),
    ):
        c = checks.add_parser(check, help=help_text, description=module.__doc__.split("\n\n")[0])
        add_params(c, "params file (default: ./params.yaml if present)")
        c.add_argument("--out", metavar="PATH", help=f"the record (default metrics/verify_{check}.json)")
        module.add_arguments(c)
        c.set_defaults(handler=module.command)


def main(argv: list[str] | None = None) -> int:
    from buildllm.remote.import_journal import recover  # a killed import-runs, rolled back first

    if code := guarded(recover):
        return code
    args = build_parser().parse_args(argv)
    return guarded(lambda: args.handler(args), as_user_error)


def add_remote(sub) -> None:
    """Runs made on another machine and brought home (buildllm/remote/): torch-free modules, each
    bringing its own flags and its command."""
    from buildllm.remote import carry, import_runs, pack_run, wheelhouse

    for name, module, help_text in (
        ("pack-run", pack_run, "on a machine without git: run stages with dvc repro, add the run to a runs archive"),
        ("import-runs", import_runs, "make each run of a runs archive (pack-run) a DVC experiment here"),
        ("wheelhouse", wheelhouse, "prepare the wheels that install DVC on a machine without network"),
        ("carry", carry, "for a GPU machine with git: a bare clone and a folder DVC remote of the data"),
    ):
        p = sub.add_parser(name, help=help_text)
        module.add_arguments(p)
        p.set_defaults(handler=module.command)
