"""The data: corpus documents, the BPE tokenizer and token files, and the windows training reads.

Nothing here imports torch at package level: `buildllm corpus` must start quickly."""
