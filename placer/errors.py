"""The one error base of placer and its kinds.

Every error a user can cause (a bad file, a missing shape, an impossible plan) is a
``PlacerError``: the command line prints its message on one line and exits with code 2.
A message names the object (file:line, op, blob), what was found, and what to try.
"""
from __future__ import annotations


class PlacerError(Exception):
    """Base of every user-facing error. ``hint`` says what to try."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class NetParseError(PlacerError):
    """A file that cannot be read as a net: syntax, wrong kind of file, broken structure."""

    def __init__(self, path: str, message: str, line: int | None = None,
                 column: int | None = None, hint: str | None = None):
        where = str(path)
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        super().__init__(f"{where}: {message}", hint)
        self.path, self.line, self.column = str(path), line, column


class ArgumentError(PlacerError):
    """An operator argument that is missing or has the wrong kind of value."""


class ShapeError(PlacerError):
    """A blob whose shape is unknown, or shapes that do not fit an op."""


class InputError(PlacerError):
    """Inputs fed to a run that do not match what the net expects."""


class KernelMissingError(PlacerError):
    """An op type that has no kernel on the device it is asked to run on."""


class DeviceError(PlacerError):
    """A device that is missing (no GPU, no cupy) or a blob on the wrong device."""


class ProfileError(PlacerError):
    """A device profile that is missing, of the wrong version, or malformed."""


class InfeasiblePlanError(PlacerError):
    """No placement satisfies the constraints (memory, pins)."""
