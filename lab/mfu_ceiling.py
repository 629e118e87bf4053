"""How high MFU can go on this machine for a profile's training step, from the step's own parts.

    python -m lab.mfu_ceiling --profile iteration1 --rounds 7

MFU counts only the matmul FLOPs, so a step's MFU is capped by everything else it must compute.
This times, alone and in the step's shapes, the work the model's mathematics cannot skip: every
matmul (forward, input gradient, weight gradient; the output layer in the fused loss's chunks),
attention forward and backward, the MLP's activation (the model's own), the norms, the loss's softmax
and AdamW with clipping. Each runs on its own, with its inputs in place, so each is at least as
fast as inside a step. Adding them one by one gives the MFU a step could reach if nothing else
cost anything: a ceiling for any implementation built from the kernels PyTorch runs on this device.

The real step (Trainer.step) and a 2048^3 matmul (MFU's denominator, as the benchmark measures it)
are timed in the same rounds, interleaved with the parts. Medians over rounds are printed.
Exits 1 if the parts alone take longer than the whole step: then the decomposition is wrong.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from buildllm.model.gpt import activate
from lab.harness import PROFILES, cpu_plan, random_token_trainer
from lab.harness import seconds_per_call as timed


def matmul_work(model, rows: int, chunk: int) -> tuple[Callable[[], None], int]:
    """Every matmul of one step: (work, FLOPs). Weight-shaped operands as the Linear layers use them."""
    calls, flops = [], 0
    for module in model.blocks.modules():
        if not isinstance(module, nn.Linear):
            continue
        w = torch.randn_like(module.weight)
        x = torch.randn(rows, module.in_features)
        g = torch.randn(rows, module.out_features)
        y, dx, dw = torch.empty(rows, module.out_features), torch.empty_like(x), torch.empty_like(w)
        b = torch.randn(module.out_features) if module.bias is not None else None
        calls.append(
            lambda x=x, w=w, b=b, y=y: torch.addmm(b, x, w.t(), out=y) if b is not None else torch.mm(x, w.t(), out=y)
        )
        calls.append(lambda g=g, w=w, dx=dx: torch.mm(g, w, out=dx))
        calls.append(lambda g=g, x=x, dw=dw: torch.mm(g.t(), x, out=dw))
        flops += 6 * rows * module.in_features * module.out_features
    head = model.lm_head.weight
    vocab, width = head.shape
    w, x = torch.randn_like(head), torch.randn(chunk, width)
    g, logits = torch.randn(chunk, vocab), torch.empty(chunk, vocab)
    dx, dw = torch.empty(chunk, width), torch.zeros_like(head)
    for _ in range(rows // chunk):
        calls.append(lambda: torch.mm(x, w.t(), out=logits))
        calls.append(lambda: torch.mm(g, w, out=dx))
        calls.append(lambda: torch.addmm(dw, g.t(), x, out=dw))  # the loss's addmm_, in a form FLOP counters see
    flops += 6 * rows * vocab * width

    def work():
        for call in calls:
            call()

    return work, flops


def attention_work(config, batch: int):
    H, D, T = config.n_head, config.head_dim, config.sequence_length
    qkv = torch.randn(batch, T, 3, H, D).permute(2, 0, 3, 1, 4).requires_grad_()
    grad = torch.randn(batch, H, T, D)

    def work():
        for _ in range(config.n_layer):
            q, k, v = qkv
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return work


def activation_work(config, rows: int):
    hidden = config.mlp_hidden
    up = torch.randn(rows, hidden, requires_grad=True)
    gate = torch.randn(rows, hidden, requires_grad=True)
    grad = torch.randn(rows, hidden)

    def work():
        for _ in range(config.n_layer):
            activate(config.mlp_activation, up, gate).backward(grad)

    return work


def norm_work(model, rows: int):
    norm = model.final_norm
    x = torch.randn(rows, model.config.n_embd, requires_grad=True)
    grad = torch.randn_like(x)
    count = 2 * model.config.n_layer + 1

    def work():
        for _ in range(count):
            norm(x).backward(grad)

    return work


def loss_softmax_work(vocab: int, rows: int, chunk: int):
    """The fused loss's own per-chunk work beside its matmuls: target log-probabilities and softmax,
    then softmax minus one-hot (the logits' gradient), on the CPU's path (via the softmax)."""
    from buildllm.model.fused_loss import target_log_probs

    logits, buffer = torch.randn(chunk, vocab), torch.empty(chunk, vocab)
    target = torch.randint(vocab, (chunk, 1))
    minus_one = torch.full((chunk, 1), -1.0)

    def work():
        for _ in range(rows // chunk):
            _, probs = target_log_probs(logits, buffer, target, via_softmax=True, want_softmax=True)
            probs.scatter_add_(1, target, minus_one)

    return work


def optimizer_work(trainer):
    # Made again each round: Trainer.step leaves no gradients behind (zero_grad(set_to_none=True)),
    # and AdamW skips a parameter without one.
    params = list(trainer.model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3

    def work():
        torch.nn.utils.clip_grad_norm_(params, trainer.config.train.grad_clip or 1.0)
        trainer.optimizer.step()

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="iteration1", choices=sorted(PROFILES))
    parser.add_argument("--architecture", choices=("classic", "modern"), default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5, help="calls per part per round")
    parser.add_argument("--target", type=float, default=0.65, help="an MFU to set against the ceiling")
    args = parser.parse_args()

    from buildllm.device.peak_flops import MatmulProbe
    from buildllm.model.flops import flops_per_token, matmul_parameters

    plan = cpu_plan(
        args.profile, "fp32", args.threads, args.architecture, {"train.compile": "false", "train.recipe": "classic"}
    )
    if plan.config.train.gradient_checkpointing or plan.config.train.grad_accum != 1:
        raise SystemExit(
            "mfu_ceiling: this profile uses gradient checkpointing or accumulation, "
            "which the parts do not model; pick a profile without them"
        )
    config, batch = plan.model, plan.batch_size
    rows = batch * config.sequence_length
    chunk = plan.loss.chunk_rows
    if rows % chunk:
        raise SystemExit(f"mfu_ceiling: {rows} rows are not a whole number of {chunk}-row loss chunks")
    trainer = random_token_trainer(plan, 2 + args.rounds * (args.repeats + 1))
    model = trainer.model
    step_flops = flops_per_token(config, matmul_parameters(model)) * rows

    probe = MatmulProbe(plan.device, "fp32")  # the benchmark's own peak measurement
    matmuls, matmul_flops = matmul_work(model, rows, chunk)
    parts = [
        ("matmuls", matmuls),
        ("attention", attention_work(config, batch)),
        (config.mlp_activation, activation_work(config, rows)),
        ("norms", norm_work(model, rows)),
        ("loss softmax", loss_softmax_work(config.vocab_size, rows, chunk)),
    ]
    times: dict[str, list[float]] = {name: [] for name in ["step", "peak", "AdamW + clipping", *(n for n, _ in parts)]}
    for _ in range(2):
        trainer.step()
    for _ in range(args.rounds):
        times["step"].append(timed(trainer.step, args.repeats))
        times["peak"].append(statistics.median(probe.sample(args.repeats)))
        for name, work in parts:
            times[name].append(timed(work, args.repeats))
        times["AdamW + clipping"].append(timed(optimizer_work(trainer), args.repeats))
    names = [n for n, _ in parts] + ["AdamW + clipping"]
    # Each round's figures against that round's step and peak, then the median over rounds: a load
    # that changes between rounds moves a round's parts, step and peak together.
    rounds = range(args.rounds)
    median = {name: statistics.median(values) for name, values in times.items()}
    step, peak = median["step"], median["peak"]

    def over_rounds(figure) -> float:
        return statistics.median(figure(r) for r in rounds)

    def spent(r: int, upto: int) -> float:
        return sum(times[name][r] for name in names[: upto + 1])

    print(
        f"{args.profile} {config.architecture} fp32, batch {batch} x {config.sequence_length}, "
        f"{args.threads} threads; {args.rounds} rounds x {args.repeats} calls, medians over rounds"
    )
    print(
        f"{probe.size}^3 matmul peak {peak / 1e9:.0f} GFLOP/s; model FLOPs per step {step_flops / 1e9:.2f} G "
        f"(matmul weights {matmul_flops / step_flops:.0%}, attention the rest)"
    )
    print(
        f"whole step: {step * 1e3:.1f} ms, "
        f"MFU {over_rounds(lambda r: step_flops / times['step'][r] / times['peak'][r]):.1%}"
    )
    print("| part | ms per step | share of the step | MFU if the step were these parts alone |")
    print("| --- | --- | --- | --- |")
    for i, name in enumerate(names):
        share = over_rounds(lambda r, name=name: times[name][r] / times["step"][r])
        reach = over_rounds(lambda r, i=i: step_flops / spent(r, i) / times["peak"][r])
        print(f"| + {name} | {median[name] * 1e3:.1f} | {share:.1%} | {reach:.1%} |")
    ceiling = over_rounds(lambda r: step_flops / spent(r, len(names) - 1) / times["peak"][r])
    rest = over_rounds(lambda r: 1 - spent(r, len(names) - 1) / times["step"][r])
    print(f"the rest of the step (copies, fills, biases, residual adds, embedding, data, autograd): {rest:.1%}")
    print(
        f"ceiling {ceiling:.1%} against the target {args.target:.0%}: "
        + (
            "the target is within the ceiling"
            if ceiling >= args.target
            else "the target is above what these parts allow, whatever else is removed"
        )
    )
    if rest < 0:
        print("the parts alone took longer than the whole step: the decomposition is wrong")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
