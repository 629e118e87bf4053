"""Whether the host waits when it reads a value: on an accelerator work is queued, and reading a
result (float(), .item(), a bool of a tensor) stalls the host until the queue reaches it.

Code that works on bare tensors (the fused loss) asks this instead of comparing kind names; it
is its own file so that the model's code needs nothing else from this package.
"""

from __future__ import annotations

import torch


def reads_wait_for_a_queue(device: torch.device) -> bool:
    return device.type != "cpu"
