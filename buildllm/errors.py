"""Errors a user can fix. The CLI prints them as one line and exits non-zero, without a traceback."""


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
