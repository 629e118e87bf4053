"""Bits per byte: the validation loss in a unit that does not move with the tokenizer (docs/metrics.md
says why and how).

Exact, not an average ratio: each scored target counts its own bytes. A byte-level BPE token's string
holds one symbol per byte, so its length is its byte count, partial UTF-8 characters included. The
end-of-text token stands for no text (0 bytes) while its loss still counts: knowing where a document
ends is part of the text's information.
"""

from __future__ import annotations

import math

import torch
from tokenizers import Tokenizer, pre_tokenizers

from buildllm.data.windows import Windows


def token_byte_lengths(tokenizer: Tokenizer) -> torch.Tensor:
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    lengths = []
    for token_id in range(tokenizer.get_vocab_size()):
        piece = tokenizer.id_to_token(token_id)
        if piece is None or piece in special:
            lengths.append(0)
        elif set(piece) <= alphabet:  # byte-level symbols: one per byte
            lengths.append(len(piece))
        else:  # a tokenizer that is not byte-level: its text's UTF-8 length
            lengths.append(len(tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")))
    return torch.tensor(lengths, dtype=torch.int64)


def scored_bytes(windows: Windows, lengths: torch.Tensor) -> int:
    """UTF-8 bytes of the targets the validation pass scores: tokens 1 .. n*L of the windows' tensor."""
    targets = windows.tokens[1 : len(windows) * windows.sequence_length + 1].to(torch.int64)
    return int(lengths[targets].sum())


def bits_per_byte(nats_per_token: float | None, bytes_per_token: float | None) -> float | None:
    """The mean per-token loss (nats) over positions that hold bytes_per_token bytes on average, in
    bits per byte; None when either is unknown."""
    if nats_per_token is None or not bytes_per_token or not math.isfinite(nats_per_token):
        return None
    return nats_per_token / math.log(2) / bytes_per_token


def validation_bytes(tokenizer: Tokenizer | None, windows: Windows) -> dict:
    """The scored validation positions' tokens and bytes, for a run's facts; {} without a tokenizer
    (a run may go without one: then no bits per byte are reported)."""
    if tokenizer is None:
        return {}
    tokens = len(windows) * windows.sequence_length
    scored = scored_bytes(windows, token_byte_lengths(tokenizer))
    return {
        "validation_tokens_scored": tokens,
        "validation_bytes_scored": scored,
        "validation_bytes_per_token": scored / tokens,
    }
