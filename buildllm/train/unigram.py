"""The unigram level: the validation loss of the best model that ignores context.

It predicts every token with its frequency in the training examples (add-one smoothed, so no
validation token has zero probability). Its cross-entropy on the validation targets is the bar a
language model must go well below to show it uses context at all; ln(vocab_size), a uniform guess,
is a much lower bar.
"""

from __future__ import annotations

import torch

from buildllm.data.windows import Windows


def unigram_loss(train: Windows, validation: Windows, vocab_size: int) -> float:
    """Nats per token of the training unigram distribution on the validation windows' targets."""
    used = train.tokens[: len(train) * train.sequence_length + 1]
    counts = torch.bincount(used.to(torch.int64), minlength=vocab_size).double() + 1.0
    log_p = (counts / counts.sum()).log()
    # Window i's targets are tokens i*L+1 .. i*L+L: together, tokens 1 .. n*L.
    targets = validation.tokens[1 : len(validation) * validation.sequence_length + 1].to(torch.int64)
    return float(-log_p[targets].mean())
