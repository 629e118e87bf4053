"""`python -m buildllm` for a test under torchrun, watching this rank's collectives without mocking
them: every torch.distributed.all_reduce still runs (a real gloo one); each call is noted with the
step the run had reached and whether it came from inside Trainer.step. With PROBE_STOP_RANK and
PROBE_STOP_AFTER set, that rank sends itself SIGTERM (as a scheduler would) after that step.
Each rank writes probe_rank<R>.json in the working directory when the run ends."""

from __future__ import annotations

import json
import os
import signal
import sys

import torch.distributed as dist

from buildllm.cli import main
from buildllm.train.trainer import Trainer

rank = int(os.environ["RANK"])
seen = {"step": 0, "inside_step": False, "calls": []}
real_all_reduce, real_step = dist.all_reduce, Trainer.step


def all_reduce(*args, **kwargs):
    seen["calls"].append({"step": seen["step"], "inside_step": seen["inside_step"]})
    return real_all_reduce(*args, **kwargs)


def step(self):
    seen["inside_step"] = True
    try:
        loss = real_step(self)
    finally:
        seen["inside_step"] = False
    seen["step"] = self.step_count
    if str(rank) == os.environ.get("PROBE_STOP_RANK") and self.step_count == int(os.environ["PROBE_STOP_AFTER"]):
        os.kill(os.getpid(), signal.SIGTERM)
    return loss


dist.all_reduce, Trainer.step = all_reduce, step
try:
    code = main(sys.argv[1:])
finally:
    with open(f"probe_rank{rank}.json", "w") as handle:
        json.dump({"steps": seen["step"], "calls": seen["calls"]}, handle)
sys.exit(code)
