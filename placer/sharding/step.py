"""One training step of a sharded, data-parallel plan: its length, critical path and stats.

The step of k ranks over global batch G, given the summed ``Load`` of the tables'
layouts (``sharding.cost``) and the dense part of a replica (``sharding.net.DenseModel``),
each collective priced by ``placer.hardware.collectives`` over the group (all-to-all: affine in the
largest per-rank buffer, ``alpha + beta S``):

    A_in  = alltoall(max_r idx_r)                          indices to the shards' ranks
    A_of  = alltoall(max_r send_r) + row-wise reduce-scatters       pooled outputs
    A_ob  = alltoall(max_r send_r) + row-wise and data-parallel all-gathers   their gradients
    S     = max(A_in + max_r ef_r + A_of,  cpu_f + max_r H2D_r)     the dense part starts
    T_ab  = S + max(F_before, o_e) + A_ob                  the gradient exchange ends
    C_end = max(T_ab + D_after, S + K_after)               the last gradient all-reduce ends
    end_r = max(max(S + DF_r + DB_r, T_ab) + eb_r, C_end) + DO_r
    cpu   = S + max_r(DF_r + o_e,r + D2H_r) + cpu_b             (S >= cpu_f: the host waits)
    step  = max(max_r end_r, cpu)

DF, DB, DO: the replica's dense forward, backward and optimizer seconds on rank r; o_e
when (into the backward) the pooled outputs' gradients are made. One comms stream runs
the collectives in the order they are ready (NCCL serialises a communicator's
collectives): each dense gradient's all-reduce (``allreduce`` over the group) when the
backward pass has made it, the gradient exchange when o_e is reached; F_before is the
stream's finish time of the all-reduces ready before the exchange, D_after the length of
those after it and K_after their own FIFO finish. All-reduces overlap the backward pass
and the embedding update; the optimizer of a replica waits for them (makespan, not sum).
The host's lookups run beside the GPUs' (its pooled outputs reach each rank over that
rank's PCIe link, lanes shared by GPUs behind one switch counted), and its backward after
the gradients come back.

Every term is a sum of loads and maxima of sums, so the step is a max-plus function of
the loads: the MILP (``sharding.search``) writes it exactly with one variable per max.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from placer.sharding.cost import Load, ShardEstimator
from placer.sharding.types import PathStep, RankStats, StepTime


@dataclass(frozen=True)
class CommsQueue:
    """The comms stream's fixed part: gradient all-reduces around the gradient exchange,
    as offsets from the start of the dense part (module docstring)."""

    exchange_ready_s: float     # o_e (slowest rank)
    before_finish_s: float      # F_before
    after_s: float              # D_after
    after_finish_s: float       # K_after (-inf: none)
    allreduce_s: float          # all of them together
    after_ready_s: float = 0.0  # the release that sets K_after ...
    after_tail_s: float = 0.0   # ... and the all-reduces from it to the end
    after_tail_count: int = 0


class StepModel:
    """The step of a plan over an estimator's group (module docstring)."""

    def __init__(self, est: ShardEstimator):
        self.est = est
        R = list(est.ranks)
        dense = est.view.dense
        self.DF, self.DB, self.DO = dense.forward_s[R], dense.backward_s[R], dense.optimizer_s[R]
        self.exchange_at = dense.exchange_ready_s[R]
        self.queue = self._queue(dense, R)
        self.h2d_lat, self.h2d_coef = self._host_link(est, "h2d")
        self.d2h_lat, self.d2h_coef = self._host_link(est, "d2h")

    def _queue(self, dense, R) -> CommsQueue:
        k = len(R)
        o_e = float(np.max(self.DF + self.exchange_at))
        items = []
        for _, nbytes, ready in dense.gradients:
            dur = self.est.collectives.time("allreduce", nbytes, R).time_s if k > 1 else 0.0
            items.append((float(np.max(self.DF + ready[R])), dur))
        before = [it for it in items if it[0] < o_e]
        after = sorted(it for it in items if it[0] >= o_e)
        finish = -math.inf
        for ready, dur in sorted(before):
            finish = max(finish, ready) + dur
        k_after, at, tail_at, count = -math.inf, 0.0, 0.0, 0
        tail = 0.0
        for j, (ready, dur) in enumerate(reversed(after)):
            tail += dur
            if ready + tail > k_after:
                k_after, at, tail_at, count = ready + tail, ready, tail, j + 1
        return CommsQueue(o_e, finish, sum(d for _, d in after), k_after, sum(d for _, d in items), at, tail_at, count)

    def _host_link(self, est: ShardEstimator, direction: str) -> tuple[np.ndarray, np.ndarray]:
        """Per rank: latency and seconds per byte of the host <-> rank copies when every rank
        copies the same bytes at once (a lane that n ranks share carries n copies)."""
        m = est.machine
        pairs = [(est.host, r) if direction == "h2d" else (r, est.host) for r in est.ranks]
        lanes: dict[str, int] = {}
        for a, b in pairs:
            for hop in m.link(a, b).hops:
                lanes[hop.lane] = lanes.get(hop.lane, 0) + 1
        lat = np.array([sum(h.curve.latency_s for h in m.link(a, b).hops) for a, b in pairs])
        coef = np.array([sum(lanes[h.lane] / h.curve.bytes_per_s for h in m.link(a, b).hops) for a, b in pairs])
        return lat, coef

    # -- the step ------------------------------------------------------------------------------

    def collectives(self, load: Load) -> tuple[float, float, float]:
        """(A_in, A_of, A_ob) of a load."""
        alpha, beta = self.est.a2a
        send = float(load.send.max()) if len(load.send) else 0.0
        a_in = load.a2a_in * alpha + beta * float(load.idx.max())
        a_of = load.a2a_out * alpha + beta * send + load.of_s
        a_ob = load.a2a_out * alpha + beta * send + load.ob_s
        return a_in, a_of, a_ob

    def host_copies(self, load: Load) -> tuple[np.ndarray, np.ndarray]:
        """(H2D_r, D2H_r): the host tables' pooled outputs to each rank and gradients back."""
        if load.host_w <= 0:
            z = np.zeros(len(self.DF))
            return z, z
        nbytes = self.est.b * load.host_w
        return self.h2d_lat + nbytes * self.h2d_coef, self.d2h_lat + nbytes * self.d2h_coef

    def time(self, load: Load) -> float:
        """``evaluate(load).total_s`` without the phases and path (the search's inner loop)."""
        q = self.queue
        alpha, beta = self.est.a2a
        send = float(load.send.max())
        a_in = load.a2a_in * alpha + beta * float(load.idx.max())
        a_ob = load.a2a_out * alpha + beta * send + load.ob_s
        S = a_in + float(load.ef.max()) + load.a2a_out * alpha + beta * send + load.of_s
        host = load.host_w > 0 or load.cpu_f > 0 or load.cpu_b > 0
        if host:
            h2d, d2h = self.host_copies(load)
            S = max(S, load.cpu_f + float(h2d.max()))
        t_ab = S + max(q.before_finish_s, q.exchange_ready_s) + a_ob
        c_end = max(t_ab + q.after_s, S + q.after_finish_s)
        total = float((np.maximum(np.maximum(S + self.DF + self.DB, t_ab) + load.eb, c_end) + self.DO).max())
        if host:
            total = max(total, float((S + self.DF + self.exchange_at + d2h).max()) + load.cpu_b)
        return total

    def evaluate(self, load: Load, path: bool = True) -> StepTime:
        names = self.est.machine.names
        R = self.est.ranks
        q = self.queue
        a_in, a_of, a_ob = self.collectives(load)
        h2d, d2h = self.host_copies(load)
        r_ef = int(np.argmax(load.ef))
        gpu_ready = a_in + float(load.ef[r_ef]) + a_of
        has_host = load.host_w > 0 or load.cpu_f > 0 or load.cpu_b > 0
        r_h2d = int(np.argmax(h2d))
        host_ready = load.cpu_f + float(h2d[r_h2d]) if has_host else -math.inf
        S = max(gpu_ready, host_ready)
        t_ab = S + max(q.before_finish_s, q.exchange_ready_s) + a_ob
        c_end = max(t_ab + q.after_s, S + q.after_finish_s)
        dense_done = S + self.DF + self.DB
        u = np.maximum(dense_done, t_ab)
        emb_done = u + load.eb
        ends = np.maximum(emb_done, c_end) + self.DO
        r_end = int(np.argmax(ends))
        cpu = -math.inf
        if has_host:
            back = S + self.DF + self.exchange_at + d2h
            r_d2h = int(np.argmax(back))
            cpu = float(back[r_d2h]) + load.cpu_b    # S >= cpu_f: after the host's own lookups
        total = max(float(ends[r_end]), cpu)
        phases = {"index_alltoall_s": a_in, "lookups_forward_s": float(load.ef.max()), "output_exchange_s": a_of,
                  "host_lookups_s": load.cpu_f, "host_copies_s": float(h2d.max() + d2h.max()),
                  "dense_forward_s": float(self.DF.max()), "dense_backward_s": float(self.DB.max()),
                  "gradient_exchange_s": a_ob, "lookups_backward_s": float(load.eb.max()),
                  "host_backward_s": load.cpu_b, "allreduce_s": q.allreduce_s,
                  "optimizer_s": float(self.DO.max()), "dense_start_s": S}
        steps: tuple[PathStep, ...] = ()
        if path:
            steps = self._path(load, names, R, a_in, a_of, a_ob, h2d, d2h, r_ef, r_h2d, gpu_ready, host_ready, S,
                               t_ab, c_end, dense_done, u, emb_done, r_end, cpu, total)
        return StepTime(total, phases, steps)

    def _path(self, load, names, R, a_in, a_of, a_ob, h2d, d2h, r_ef, r_h2d, gpu_ready, host_ready, S, t_ab,
              c_end, dense_done, u, emb_done, r_end, cpu, total) -> tuple[PathStep, ...]:
        """The stretches whose lengths make the step, first to last."""
        out: list[PathStep] = []

        def add(phase, device, start, seconds):
            if seconds > 0:
                out.append(PathStep(phase, device, start, seconds))
        if host_ready >= gpu_ready:
            add("host lookups", names[self.est.host], 0.0, load.cpu_f)
            add("host -> GPU pooled outputs", names[R[r_h2d]], load.cpu_f, float(h2d[r_h2d]))
        else:
            add("index all-to-all", "all ranks", 0.0, a_in)
            add("lookups forward", names[R[r_ef]], a_in, float(load.ef[r_ef]))
            add("pooled-output exchange", "all ranks", a_in + float(load.ef[r_ef]), a_of)
        if cpu >= total and cpu > -math.inf:
            back = S + self.DF + self.exchange_at + d2h
            r = int(np.argmax(back))
            add("dense forward + backward to the embedding gradients", names[R[r]], S,
                float(self.DF[r] + self.exchange_at[r]))
            add("GPU -> host gradients", names[R[r]], S + float(self.DF[r] + self.exchange_at[r]), float(d2h[r]))
            add("host backward + update", names[self.est.host], cpu - load.cpu_b, load.cpu_b)
            return tuple(out)
        r = r_end
        tail_start = float(max(emb_done[r], c_end))
        if emb_done[r] >= c_end:
            if dense_done[r] >= t_ab:
                add("dense forward + backward", names[R[r]], S, float(self.DF[r] + self.DB[r]))
            else:
                self._exchange(add, S, t_ab, a_ob)
            add("lookups backward + update", names[R[r]], float(u[r]), float(load.eb[r]))
        elif c_end > t_ab + self.queue.after_s:   # an all-reduce ready late, and those queued behind it
            q = self.queue
            add("dense forward + backward until a gradient is ready", "slowest rank", S, q.after_ready_s)
            add(f"all-reduce of the last {q.after_tail_count} gradient(s)", "all ranks", S + q.after_ready_s,
                q.after_tail_s)
        else:
            self._exchange(add, S, t_ab, a_ob)
            add("gradient all-reduces queued after the exchange", "all ranks", t_ab, c_end - t_ab)
        add("dense optimizer", names[R[r]], tail_start, float(self.DO[r]))
        return tuple(out)

    def _exchange(self, add, S, t_ab, a_ob) -> None:
        q = self.queue
        if not self.est.tables:
            add("dense forward", "slowest rank", S, max(q.before_finish_s, q.exchange_ready_s))
            return
        if q.before_finish_s > q.exchange_ready_s:
            add("dense backward with the all-reduces before the exchange", "all ranks", S, q.before_finish_s)
        else:
            add("dense forward + backward to the embedding gradients", "slowest rank", S, q.exchange_ready_s)
        add("gradient exchange", "all ranks", t_ab - a_ob, a_ob)

    # -- per rank ----------------------------------------------------------------------------------

    def stats(self, load: Load, step: StepTime) -> list[RankStats]:
        """Per rank: memory, compute (dense + lookups), comms; the host last if it works."""
        names = self.est.machine.names
        a_in, a_of, a_ob = self.collectives(load)
        h2d, d2h = self.host_copies(load)
        comms = a_in + a_of + a_ob + self.queue.allreduce_s
        out = []
        for p, r in enumerate(self.est.ranks):
            lookups = float(load.ef[p] + load.eb[p])
            out.append(RankStats(names[r], self.est.dense_bytes + float(load.hbm[p]), float(self.est.capacity[p]),
                                 float(self.DF[p] + self.DB[p] + self.DO[p]) + lookups,
                                 comms + float(h2d[p] + d2h[p]), lookups))
        if load.host_w > 0 or load.ddr > 0:
            out.append(RankStats(names[self.est.host], load.ddr, self.est.host_capacity, load.cpu_f + load.cpu_b,
                                 float(h2d.max() + d2h.max()), load.cpu_f + load.cpu_b))
        return out


def imbalance(stats: list[RankStats]) -> float:
    """max / mean - 1 of the ranks' (GPUs') compute + comms: 0 when balanced."""
    totals = [s.total_s for s in stats if not s.device.endswith("cpu")]
    mean = sum(totals) / len(totals) if totals else 0.0
    return max(totals) / mean - 1.0 if mean > 0 else 0.0
