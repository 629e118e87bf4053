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


def guarded(work, read_os_error=None) -> int:
    """Run `work`; a user error becomes one line on stderr and its exit code (the CLI and scripts share
    this). `read_os_error` (disk.as_user_error, which the command line and the stages pass: this module
    cannot import it) makes the same of a file-system fault that no write turned into one (a read-only
    folder, a full disk, a file where a folder must be); any other error keeps its traceback: a bug."""
    try:
        return work() or 0
    except UserError as exc:
        return _said(exc)
    except OSError as exc:
        if read_os_error is None or (fault := read_os_error(exc)) is None:
            raise
        return _said(fault)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _said(error: UserError) -> int:
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank fails alike; say it once
        print(f"error: {error}", file=sys.stderr)
    return error.exit_code
