"""How sure a plan is: does the placement stay when op costs move within their measured spread?

A measured op time is a median of samples that scatter run to run (the profile keeps the
interquartile range of each entry, and of each fit's points). When two devices are close
for an op, or a copy nearly pays for itself, that scatter can flip the best placement.
``check`` re-solves the plan ``draws`` times with every op's time on every device
multiplied by its own random factor, and counts, per op, the draws in which it lands on
another device than in the plan:

- factor ``exp(sigma * z)``, ``z`` standard normal clipped to +-3, ``sigma = spread /
  1.349``: log-normal noise whose interquartile range is the measured one (IQR / median
  = 1.349 sigma for a normal variable, to first order);
- ``spread`` per op and device from ``op_spreads``: the entry's own for a measured op,
  its fit's points' for a fitted one, 0 for datasheet rooflines and unknown ops (never
  measured, so no measured noise to move them by); copy times stay as priced;
- draws are seeded (``seed``, one generator), so a report can be reproduced; at most
  ``draws`` re-solves, and none started once ``budget_s`` has passed (at least one runs),
  which bounds the cost on big nets where one solve takes seconds.

The result reads as one line ("placement stable under measured noise: 3 of 120 ops flip
in 2 of 8 draws") and one flag per op, which ``add_to_plan_json`` writes into the plan
document: ``doc["stability"]`` (the summary) and ``op["stability"]`` = ``{"flips": k,
"draws": n, "moves_to": device or null}`` (``moves_to``: where it went most often).

Nothing here assumes two devices: op times are an (ops x devices) matrix and a placement
is one device index per op; ``_op_times`` / ``_with_op_times`` are the two places that
know how the partitioners' arrays hold them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from placer.costs.model import op_signature

IQR_PER_SIGMA = 1.349   # interquartile range of a standard normal variable
Z_CLIP = 3.0
DEFAULT_DRAWS = 8
DEFAULT_BUDGET_S = 2.0   # seconds of re-solves at most (one draw always runs)


@dataclass
class Stability:
    """Per-op flip counts over ``draws`` re-solves (module docstring)."""

    draws: int
    flips: np.ndarray               # per op: draws in which it left its planned device
    moves_to: list                  # per op: the device it moved to most often, or None
    flipped_draws: int              # draws in which at least one op moved
    seconds: float
    devices: Sequence[str] = ()
    requested: int = 0              # draws asked for (0: the check was off)

    @property
    def flipping_ops(self) -> int:
        return int((self.flips > 0).sum())

    def summary(self) -> str:
        n = len(self.flips)
        if self.draws == 0 and self.requested:
            return ("placement stability not checked: no op cost has a measured spread "
                    "(kernel-model, datasheet or roofline estimates only)")
        if self.draws == 0:
            return "placement stability not checked"
        if self.flipping_ops == 0:
            return f"placement stable under measured noise: no op of {n} flips in {self.draws} draws"
        return (f"placement stable under measured noise: {self.flipping_ops} of {n} ops flip in "
                f"{self.flipped_draws} of {self.draws} draws")

    def op_flag(self, i: int) -> dict:
        return {"flips": int(self.flips[i]), "draws": self.draws, "moves_to": self.moves_to[i]}


def op_spreads(typed_net, model, devices: Sequence) -> np.ndarray:
    """(ops x devices) run-to-run spreads (IQR / median) of the model's op times; devices
    that share a profile share a column, and ops that share a signature (``costs.
    op_signature``: the layers of a deep net) a row, each computed once."""
    net = typed_net.net
    devices = list(devices)
    first: dict = {}
    for d, device in enumerate(devices):
        first.setdefault(id(model.profile(device)), d)
    distinct = list(first.values())
    rows: list[list[float]] = []     # spreads on the distinct devices, per distinct signature
    seen: dict[tuple, int] = {}
    row_of = np.empty(len(net.ops), np.int64)
    for op, feats in zip(net.ops, typed_net.features):
        inputs = tuple(typed_net.op_inputs[op.index]) if op.index < len(typed_net.op_inputs) else \
            tuple(typed_net.blobs.get(b) for b in op.inputs)
        outs = tuple(typed_net.op_outputs[op.index]) if op.index < len(typed_net.op_outputs) else ()
        key = op_signature(op, inputs, outs, feats)
        r = seen.get(key) if key is not None else None
        if r is None:
            r = len(rows)
            rows.append([model.op_spread(op.type, list(inputs), op.args, feats, devices[d]) for d in distinct])
            if key is not None:
                seen[key] = r
        row_of[op.index] = r
    table = np.array(rows, float).reshape(len(rows), len(distinct))
    column = {d: j for j, d in enumerate(distinct)}
    pick = [column[first[id(model.profile(device))]] for device in devices]
    return table[:, pick][row_of] if len(rows) else np.zeros((len(net.ops), len(devices)))


def check(arrays, solve: Callable, placement: np.ndarray, spreads: np.ndarray,
          draws: int = DEFAULT_DRAWS, seed: int = 0, budget_s: float = DEFAULT_BUDGET_S,
          devices: Sequence[str] | None = None) -> Stability:
    """Re-solve with perturbed op times (module docstring); ``solve(arrays)`` returns one
    device index per op, ``placement`` is the plan's; ``devices`` names them (default:
    the arrays' own device names)."""
    placement = np.asarray(placement, dtype=np.int64)
    times = _op_times(arrays)
    devices = tuple(arrays.devices if devices is None else devices)
    if spreads.shape != times.shape:
        raise ValueError(f"spreads have shape {spreads.shape}, op times {times.shape}")
    sigma = np.log1p(np.maximum(spreads, 0.0)) / IQR_PER_SIGMA
    rng = np.random.default_rng(seed)
    moved = np.zeros((len(placement), len(devices)), dtype=np.int64)
    flipped_draws, done, start = 0, 0, time.perf_counter()
    for _ in range(draws if sigma.any() else 0):
        if done and time.perf_counter() - start > budget_s:
            break
        z = np.clip(rng.standard_normal(times.shape), -Z_CLIP, Z_CLIP)
        got = np.asarray(solve(_with_op_times(arrays, times * np.exp(sigma * z))), dtype=np.int64)
        differs = got != placement
        moved[np.flatnonzero(differs), got[differs]] += 1
        flipped_draws += bool(differs.any())
        done += 1
    flips = moved.sum(axis=1)
    moves_to = [devices[int(moved[i].argmax())] if flips[i] else None for i in range(len(flips))]
    return Stability(draws=done, flips=flips, moves_to=moves_to, flipped_draws=flipped_draws,
                     seconds=time.perf_counter() - start, devices=tuple(devices), requested=draws)


def add_to_plan_json(doc: dict, stability: Stability) -> None:
    """``doc["stability"]``: the summary; each op's ``stability``: its flag."""
    doc["stability"] = {"draws": stability.draws, "flipping_ops": stability.flipping_ops,
                        "flipped_draws": stability.flipped_draws, "summary": stability.summary(),
                        "seconds": round(stability.seconds, 3)}
    for op in doc.get("ops", []):
        op["stability"] = stability.op_flag(op["index"])


def _op_times(arrays) -> np.ndarray:
    """The partitioners' op times as an (ops x devices) matrix."""
    return np.asarray(arrays.op_s, float)


def _with_op_times(arrays, times: np.ndarray):
    """A copy of ``arrays`` with other op times (everything else shared)."""
    return replace(arrays, op_s=np.ascontiguousarray(times))

