"""BuildLLM: train small GPT models from scratch and measure what device, precision and batch size do."""

__version__ = "0.1.0"
