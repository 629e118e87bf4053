"""Whether the host waits when it reads a value (float(), .item(), a bool of a tensor): on an
accelerator work is queued. Its own file, so that the fused loss needs nothing else from this package."""

from __future__ import annotations

import torch


def reads_wait_for_a_queue(device: torch.device) -> bool:
    return device.type != "cpu"
