"""Bits per byte, counted exactly from the validation targets' bytes."""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from buildllm.data.text_bytes import bits_per_byte, scored_bytes, token_byte_lengths
from buildllm.data.windows import Windows

TEXT = "naïve café — 東京 and Zürich; " * 40 + "plain ascii words follow here. " * 40


def tokenizer(vocab: int) -> Tokenizer:
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    t.train_from_iterator([TEXT], trainer)
    return t


@pytest.mark.parametrize("vocab", [300, 400])
def test_each_tokens_bytes_sum_to_the_texts_utf8_bytes(vocab):
    t = tokenizer(vocab)
    lengths = token_byte_lengths(t)
    assert lengths.shape == (t.get_vocab_size(),) and lengths[t.token_to_id("<|endoftext|>")] == 0
    ids = t.encode(TEXT).ids
    assert int(lengths[torch.tensor(ids)].sum()) == len(TEXT.encode("utf-8"))
    # A token that is part of a multi-byte character (a lone byte 0xC3, say) still counts its own bytes,
    # where decoding it alone gives a 3-byte replacement character.
    lone = t.token_to_id("Ã")  # the byte-level symbol of byte 0xC3
    assert lengths[lone] == 1 and len(t.decode([lone]).encode()) == 3


def test_scored_bytes_are_the_windows_targets_and_bits_per_byte_is_exact():
    t = tokenizer(300)
    end = t.token_to_id("<|endoftext|>")
    ids = torch.tensor(t.encode(TEXT).ids + [end] + t.encode(TEXT[:200]).ids, dtype=torch.int32)
    windows = Windows(ids, 16, limit=5)
    lengths = token_byte_lengths(t)
    targets = [ids[i * 16 + 1 : i * 16 + 17] for i in range(5)]
    text = "".join(t.decode([int(x) for x in row if int(x) != end]) for row in targets)
    scored = scored_bytes(windows, lengths)
    # Decoding the scored targets window by window splits characters at window edges: compare all at once.
    whole = t.decode([int(x) for row in targets for x in row if int(x) != end])
    assert scored == len(whole.encode("utf-8")) and len(text) > 0
    loss = 2.0  # nats per token over the 80 scored positions
    assert bits_per_byte(loss, scored / 80) == pytest.approx(loss * 80 / (math.log(2) * scored))
    assert bits_per_byte(None, 3.0) is None and bits_per_byte(2.0, None) is None
