"""The output layer and cross-entropy fused, a chunk of rows at a time, never the full logits.

The plain computation, F.cross_entropy(F.linear(x, W).float(), targets), materialises the (tokens x
vocabulary) logits and then several same-sized tensors: log-softmax saved for backward, its
gradient, the logits' gradient. At iteration 1 each is 2048 x 4096 fp32 = 32 MiB, and the passes
over them are memory-bound: about a tenth of a CPU step. Here each chunk of rows computes its
logits, its loss and, when gradients are wanted, its gradients at once (softmax minus one-hot is
the logits' gradient), while the chunk is still in cache; backward only scales the saved
gradients. The matmuls are the same three the plain graph runs (logits, dx = g W, dW = g^T x).

Same mathematics: mean cross-entropy over all rows, logits in the compute dtype (bf16 under
autocast, like the plain Linear), softmax in fp32 (like the plain `.float()`), gradients cast back
to the compute dtype for the two gradient matmuls, as autograd does for the plain graph.
tests/test_fused_loss.py checks loss and gradients against the plain computation.
"""

from __future__ import annotations

import torch

# Rows per chunk: chunk logits of at most this many bytes (fp32). Measured at iteration 1 (2048 rows,
# vocabulary 4096, 2 threads; scripts/fused_loss_chunks.py): 512-row chunks (8 MiB) were fastest.
CHUNK_BYTES = 8 * 2**20


def chunk_rows(vocab_size: int, rows: int) -> int:
    return max(1, min(rows, CHUNK_BYTES // (4 * vocab_size)))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the plain Linear would compute in: autocast's where it is on, else the input's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, dtype, want_x_grad, want_w_grad):
        rows = x.shape[0]
        step = chunk_rows(weight.shape[0], rows)
        xc, wc = x.to(dtype), weight.to(dtype)
        grad_x = torch.empty_like(xc) if want_x_grad else None
        grad_w = None
        total = None
        with torch.autocast(x.device.type, enabled=False):
            for start in range(0, rows, step):
                end = min(start + step, rows)
                logits = (xc[start:end] @ wc.t()).float()
                target = targets[start:end].unsqueeze(1)
                lse = torch.logsumexp(logits, dim=1, keepdim=True)
                part = (lse - logits.gather(1, target)).sum()
                total = part if total is None else total + part
                if not (want_x_grad or want_w_grad):
                    continue
                # d(mean loss)/d(logits) = (softmax - one_hot) / rows, computed in place over the chunk.
                grad = logits.sub_(lse).exp_()
                grad.scatter_add_(1, target, torch.full_like(target, -1, dtype=grad.dtype))
                grad = grad.mul_(1.0 / rows).to(dtype)
                if want_x_grad:
                    torch.mm(grad, wc, out=grad_x[start:end])
                if want_w_grad:
                    # Accumulated in fp32 across chunks, as the plain graph's fp32 weight gradient is.
                    part_w = (grad.t() @ xc[start:end]).float()
                    grad_w = part_w if grad_w is None else grad_w.add_(part_w)
        ctx.save_for_backward(grad_x, grad_w)
        ctx.dtypes = (x.dtype, weight.dtype)
        return total / rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        dx = grad_x.mul_(grad_loss).to(x_dtype) if grad_x is not None else None
        dw = grad_w.mul_(grad_loss).to(w_dtype) if grad_w is not None else None
        return dx, dw, None, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean cross_entropy(x @ weight.T, targets) for x (rows, d), weight (vocab, d), targets (rows,)."""
    grad = torch.is_grad_enabled()
    return _LinearCrossEntropy.apply(x, weight, targets, compute_dtype(x), grad and x.requires_grad,
                                     grad and weight.requires_grad)


def plain_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The unfused computation it replaces (what tests compare against)."""
    logits = torch.nn.functional.linear(x, weight)
    return torch.nn.functional.cross_entropy(logits.float(), targets)
