"""Errors a user can fix. The CLI prints them as one line and exits non-zero, without a traceback."""

import os
import sys


class UserError(Exception):
    """Bad input or a request this machine cannot serve: say what, why, and what to do."""

    exit_code = 2


class ConfigError(UserError):
    """A value in params.yaml or on the command line is not allowed."""


class DeviceUnavailable(UserError):
    """An explicitly requested device or precision that this machine lacks."""


class TrainingFailed(UserError):
    """Training stopped (out of memory, non-finite loss); the last good checkpoint is kept."""

    exit_code = 3


def guarded(work) -> int:
    """Run `work`; a user error becomes one line on stderr and its exit code (the CLI and scripts share this)."""
    try:
        return work() or 0
    except UserError as exc:
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike; say it once
            print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
