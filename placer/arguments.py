"""Converters for argparse ``type=``: sizes, fractions, seconds and counts on the command line.

Each converter turns the text of one option into its value or raises
``argparse.ArgumentTypeError`` saying what was expected; argparse then names the option
itself (``placer shard: error: argument --host-mem: expected a size like 16GiB, 40GB or
17179869184, found '12XB'``) and exits with code 2, before any file is read. One
converter serves every option of its kind, so ``--gpu-mem`` and ``--host-mem`` read and
refuse sizes alike, and no message can name the wrong option.

Sizes follow ``placer.units``: ``GiB`` is 2^30 bytes, ``GB`` 10^9 (the unit as written).
"""
from __future__ import annotations

import argparse
import math
import re

_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)\s*([KMGT]?)(i?)B?\s*", re.I)


def _refuse(expected: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"expected {expected}, found {text!r:.60}")


def size(text: str) -> float:
    """``16GiB`` / ``40GB`` / ``1.5e10`` / ``0`` -> bytes (0 or more, finite)."""
    m = _SIZE.fullmatch(text)
    if not m or not math.isfinite(float(m.group(1))):
        raise _refuse("a size like 16GiB, 40GB or 17179869184", text)
    base = 1024 if m.group(3) else 1000
    value = float(m.group(1)) * base ** " KMGT".index((m.group(2) or " ").upper())
    if not math.isfinite(value):
        raise _refuse("a size like 16GiB, 40GB or 17179869184", text)
    return value


def reserve(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1: a part of a whole kept back, at least 0 and below 1."""
    forms = "a percentage from 0% to below 100% (10%) or a fraction from 0 to below 1 (0.1)"
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%")) / (100 if percent else 1)
    except ValueError:
        raise _refuse(forms, text) from None
    if not 0 <= value < 1:  # NaN fails too
        read = "a percentage" if percent else "a fraction (no % sign)"
        raise argparse.ArgumentTypeError(f"expected {forms}, found {text!r:.60}, read as {read}")
    return value


def _number(expected: str, accepts, doc: str):
    """A converter for floats that ``accepts`` (NaN fails every comparison, so it is refused
    by each), refused as ``expected``."""
    def convert(text: str) -> float:
        value = _float(text, expected)
        if not (math.isfinite(value) and accepts(value)):
            raise _refuse(expected, text)
        return value
    convert.__doc__, convert.__name__ = doc, expected
    return convert


share = _number("a number between 0 and 1", lambda v: 0 <= v <= 1,
                "A share between 0 and 1 inclusive (a hit rate, a cached ratio).")
seconds = _number("a number of seconds >= 0", lambda v: v >= 0, "A finite number of seconds, 0 or more.")
positive = _number("a positive number", lambda v: v > 0, "A finite number above 0 (a learning rate, an epsilon).")
finite = _number("a finite number", lambda v: True, "Any finite number.")
non_negative = _number("a number >= 0", lambda v: v >= 0, "A finite number, 0 or more (a weight decay).")
momentum = _number("a momentum from 0 to below 1 (0.9)", lambda v: 0 <= v < 1,
                   "A momentum (or an Adam beta): from 0 to below 1.")


def loss_scale(text: str) -> float | str:
    """``dynamic`` or a finite number above 0 (``--loss-scale``)."""
    if text.strip().lower() == "dynamic":
        return "dynamic"
    value = _float(text, "'dynamic' or a positive number (1024)")
    if not (math.isfinite(value) and value > 0):
        raise _refuse("'dynamic' or a positive number (1024)", text)
    return value


def count(minimum: int = 0, maximum: int | None = None):
    """A converter for integers of at least ``minimum`` (``count(1)``: 1, 2, ...), and at
    most ``maximum`` where one is given."""
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _refuse(expected, text) from None
        if value < minimum or (maximum is not None and value > maximum):
            raise _refuse(expected, text)
        return value
    convert.__name__ = expected.removeprefix("an ")
    return convert


# The most BLAS threads --threads takes: OpenBLAS builds allow up to a few hundred, the
# largest hosts have a few hundred cores; a count past this is a typing slip.
MAX_THREADS = 4096


def _float(text: str, expected: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _refuse(expected, text) from None


__all__ = ["size", "reserve", "momentum", "share", "seconds", "positive", "finite", "non_negative", "count",
           "loss_scale"]
