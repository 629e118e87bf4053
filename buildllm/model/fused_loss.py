"""The output layer and cross-entropy fused, a chunk of rows at a time, never the full logits.

The plain computation, F.cross_entropy(F.linear(x, W).float(), targets), materialises the (tokens x
vocabulary) logits and then several same-sized tensors: log-softmax saved for backward, its
gradient, the logits' gradient. At iteration 1 each is 2048 x 4096 fp32 = 32 MiB, and the passes
over them are memory-bound: about a tenth of a CPU step. Here each chunk of rows (the plan's
decision, buildllm/plan/loss_chunk.py) computes its logits, its loss and its gradients at once
(softmax minus one-hot is the logits' gradient) while the chunk is still in cache; backward only
scales the saved gradients. The matmuls are the same three the plain graph runs, in the same
dtypes (logits in the compute dtype, softmax in fp32); tests/model/test_fused_loss.py checks loss
and gradients against the plain computation.
"""

from __future__ import annotations

import torch

from buildllm.device.queue import reads_wait_for_a_queue


def chunk_bytes_per_row(vocab_size: int, precision_bytes: int) -> int:
    """Bytes of the buffers one chunk row takes (what the chunk size is weighed by): fp32 logits and
    (log-)probabilities, and under autocast (precision_bytes < 4) the low-precision logits and gradient."""
    return vocab_size * (2 * 4 + (2 * precision_bytes if precision_bytes != 4 else 0))


def target_log_probs(logits, out, target, via_softmax: bool, want_softmax: bool):
    """Each row's log-probability of its target and, when wanted, the rows' softmax (written in `out`)."""
    if via_softmax:  # the gradient needs the softmax, the loss only its log at each row's target
        probs = torch._softmax(logits, 1, False, out=out)
        picked = probs.gather(1, target).log_()
        if not bool(torch.isfinite(picked).all()):
            # A target's probability underflowed to 0 (its logit ~100 below the row's largest):
            # log-softmax keeps that loss exact and finite.
            picked = torch.log_softmax(logits, 1).gather(1, target)
        return picked, probs
    # One log-softmax kernel per chunk (max, exp-sum and subtraction while the rows are in cache).
    log_probs = torch._log_softmax(logits, 1, False, out=out)
    picked = log_probs.gather(1, target)
    return picked, (log_probs.exp_() if want_softmax else None)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_rows, dtype, want_x_grad, want_w_grad):
        rows = x.shape[0]
        step = max(1, min(rows, chunk_rows))
        xc, wc = x.to(dtype), weight.to(dtype)
        grad_x = torch.empty_like(xc) if want_x_grad else None
        grad_w, total = None, None
        training = want_x_grad or want_w_grad
        # One softmax kernel per chunk instead of log-softmax + exp (x1.4 for these kernels at 512 rows
        # of 4096, 2 threads), at the cost of a check per chunk for a target probability that
        # underflowed; where reading a value stalls a queue (GPUs) that check would stall it once per
        # chunk, so log-softmax + exp run there, and under torch.compile (reading a value breaks the graph).
        via_softmax = training and not reads_wait_for_a_queue(x.device) and not torch.compiler.is_compiling()
        minus_one = torch.full((step, 1), -1.0, device=x.device)
        # The chunk tensors are allocated once per call and every chunk writes into them (out=). With a
        # fresh 16 MiB block per chunk, glibc's resident memory grew by chunks (small tensors are carved
        # out of the freed blocks, so the next chunk's no longer fits): tiny b128, eight chunks, measured
        # 138 MiB with every tensor returned on free (MALLOC_MMAP_THRESHOLD_=131072), 232-287 MiB
        # without; 164 MiB with the buffers reused. The arithmetic is unchanged.
        vocab = weight.shape[0]
        logits = torch.empty(step, vocab, dtype=torch.float32, device=x.device)
        probs_buffer = torch.empty_like(logits)
        low = dtype != torch.float32
        logits_low = torch.empty(step, vocab, dtype=dtype, device=x.device) if low else None
        grad_low = torch.empty_like(logits_low) if low and training else None
        with torch.autocast(x.device.type, enabled=False):
            for start in range(0, rows, step):
                end = min(start + step, rows)
                n = end - start
                target = targets[start:end].unsqueeze(1)
                if not low:
                    torch.mm(xc[start:end], wc.t(), out=logits[:n])
                else:  # logits in the compute dtype, then fp32, as the plain .float() does
                    torch.mm(xc[start:end], wc.t(), out=logits_low[:n])
                    logits[:n].copy_(logits_low[:n])
                picked, probs = target_log_probs(logits[:n], probs_buffer[:n], target, via_softmax, training)
                part = picked.sum()
                total = part if total is None else total + part
                if not training:
                    continue
                # d(summed loss)/d(logits) = softmax - one_hot, in place over the chunk; the 1/rows of the
                # mean is applied once, in backward, to the two small gradients instead of every chunk.
                grad = probs.scatter_add_(1, target, minus_one[:n])
                if grad_low is not None:
                    grad = grad_low[:n].copy_(grad)
                if want_x_grad:
                    torch.mm(grad, wc, out=grad_x[start:end])
                if want_w_grad:
                    if grad_w is None:
                        grad_w = (grad.t() @ xc[start:end]).float()
                    elif dtype == torch.float32:
                        grad_w.addmm_(grad.t(), xc[start:end])
                    else:  # accumulated in fp32 across chunks, as the plain graph's fp32 weight gradient is
                        grad_w.add_(grad.t() @ xc[start:end])
        ctx.save_for_backward(grad_x, grad_w)
        ctx.dtypes, ctx.rows = (x.dtype, weight.dtype), rows
        return -total / rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        scale = grad_loss / ctx.rows
        # Cast first (the input is fp32 even under autocast), then scale: no extra low-precision rounding.
        dx = grad_x.to(x_dtype).mul_(scale) if grad_x is not None else None
        dw = grad_w.to(w_dtype).mul_(scale) if grad_w is not None else None
        return dx, dw, None, None, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int) -> torch.Tensor:
    """mean cross_entropy(x @ weight.T, targets) for x (rows, d), weight (vocab, d), targets (rows,),
    `chunk_rows` rows at a time (the plan's decision, buildllm/plan/loss_chunk.py)."""
    # The dtype the plain Linear would compute in: autocast's where it is on, else the input's.
    kind, grad = x.device.type, torch.is_grad_enabled()
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    return _LinearCrossEntropy.apply(
        x, weight, targets, chunk_rows, dtype, grad and x.requires_grad, grad and weight.requires_grad
    )


def plain_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = torch.nn.functional.linear(x, weight)
    return torch.nn.functional.cross_entropy(logits.float(), targets)
