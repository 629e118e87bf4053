"""Ctrl-C or SIGTERM during training: stop after the current step, so the checkpoint saved is a
whole step's state."""

from __future__ import annotations

import signal
import sys
import threading


class StopRequest:
    """Ctrl-C or SIGTERM asks the loop to stop after the current step, so the checkpoint it saves is
    a whole step's state."""

    def __init__(self):
        self.requested, self._previous, self.signals = False, {}, []

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        # Only a second Ctrl-C stops at once: torchrun follows a terminal's Ctrl-C with its own SIGTERM.
        if self.requested and signum == signal.SIGINT and self.signals.count(signal.SIGINT):
            raise KeyboardInterrupt
        if not self.requested:
            print("\nstopping after this step to save a checkpoint (Ctrl-C again stops at once)", file=sys.stderr)
        self.requested = True
        self.signals.append(signum)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
