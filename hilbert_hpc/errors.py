"""Exceptions that carry a user-facing message (bad input, impossible configuration)."""

from __future__ import annotations


class UserError(Exception):
    """An error caused by the user's input; reported as one line, exit code 2.

    ``param`` names the offending parameter (for example ``cases[1].patterns``)
    so that the message always points at what to change.
    """

    exit_code = 2

    def __init__(self, message: str, param: str | None = None) -> None:
        self.param = param
        self.message = message
        super().__init__(f"{param}: {message}" if param else message)


class ConfigError(UserError, ValueError):
    """An invalid combination of problem parameters (patterns, grid, shapes)."""


class JobFileError(UserError):
    """A job file that cannot be read or does not follow the job format."""
