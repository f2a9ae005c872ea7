"""The one error base of placer and its kinds.

Every error a user can cause (a bad file, a missing shape, an impossible plan) is a
``PlacerError``: the command line prints its message on one line and exits with code 2.
A message names the object (file:line, op, blob), what was found, and what to try.

A message stays short whatever the input: where it quotes user data (a file's text, a
shape of 200,000 dimensions) the quote is cut with ``excerpt``, and the command line cuts
the whole line to ``MAX_MESSAGE_CHARS`` (``one_line``), keeping its head (the file, line
and field) and its end (the hint).
"""
from __future__ import annotations

import re

# The most characters of an error's text (after "placer: error: ", 15 more): the whole line
# stays under 300, room for a file path, the field and the hint; a longer message is cut in
# its middle, where it quotes the user's data.
MAX_MESSAGE_CHARS = 284
ELLIPSIS = "..."


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


def excerpt(text: str, limit: int = 80) -> str:
    """``text`` cut to at most ``limit`` characters: its start and end, joined by "..."."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = max(0, (limit - len(ELLIPSIS)) * 2 // 3)
    tail = max(0, limit - len(ELLIPSIS) - head)
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def one_line(error: BaseException, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The error's text as one line of at most ``limit`` characters: the message cut in
    its middle so that its head (file:line, op) and the hint after it survive."""
    if isinstance(error, PlacerError):
        message, hint = str(error.message), str(error.hint or "")
    else:
        message, hint = str(error), ""
    message, hint = message.translate(ESCAPED), hint.translate(ESCAPED)
    if len(message) + len(hint) + 3 > limit:  # long folders go first: the file's name and the reason stay
        message, hint = _short_paths(message), _short_paths(hint)
    if not hint:
        return excerpt(message, limit)
    # the hint keeps what the message leaves, and at least half the line
    hint = excerpt(hint, max(limit // 2, limit - 3 - len(message)))
    return f"{excerpt(message, limit - 3 - len(hint))} ({hint})"


_PATH = re.compile(r"/[^\s:'\",()]+")


def _short_paths(text: str, longest: int = 40) -> str:
    """Absolute paths past ``longest`` characters as ``.../folder/file``."""
    def short(m: "re.Match") -> str:
        parts = m.group(0).split("/")
        return m.group(0) if len(m.group(0)) <= longest or len(parts) <= 4 else ".../" + "/".join(parts[-2:])
    return _PATH.sub(short, text)


# Control characters (a newline in an op type read from a damaged file) printed escaped.
ESCAPED = {c: repr(chr(c))[1:-1] for c in [*range(32), 127]}
