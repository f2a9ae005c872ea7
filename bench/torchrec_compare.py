"""TorchRec's own sharding planner against placer's, on the MLPerf DLRM terabyte tables.

TorchRec 1.8.0 (``torchrec.distributed.planner.EmbeddingShardingPlanner``, its default
proposers, GreedyPerfPartitioner and NoopPerfModel) plans a meta-device
EmbeddingBagCollection of the 26 Criteo Terabyte tables (128-dim fp32, 89.5 GiB) for
training with FBGEMM's exact row-wise Adagrad at 2048 samples per rank, on:

    1x A100 40 GB              world 1
    8x A100 40 GB (NVSwitch)   world 8, one host
    8x V100 16 GB (NVLink 2)   world 8, one host, HBM 16 GiB
    2 hosts x 8 A100 40 GB     world 16, 8 per host (bench/sharding_machines.py)

Then each of its plans becomes a placer plan (its sharding type, kernel and ranks per
table: table_wise, row_wise, table_row_wise, column_wise, data_parallel; fused = hbm,
fused_uvm = uvm, fused_uvm_caching = uvm_caching) and placer's cost model scores it beside
placer's own plan on the same GPUs (``plan_sharding`` with that degree) and placer's free
choice of degree. Reported per configuration: TorchRec's planning time and own estimate
(its NoopPerfModel rating: the busiest rank's summed shard perf, fwd/bwd compute and comms,
embeddings only), placer's step for TorchRec's plan and for its own, and the same
busiest-rank figure under placer's estimator; where TorchRec's estimate and placer's
differ by more than 2x, the terms (fwd compute, fwd comms, bwd compute, bwd comms) that do.

Install (the ``bench`` extra has the other dependencies; torchrec's metadata asks for the
CUDA build of fbgemm-gpu, so it goes in without its dependencies):

    pip install -e '.[bench]' && pip install --no-deps torchrec==1.8.0
    python bench/torchrec_compare.py
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from sharding_machines import machine as bench_machine  # noqa: E402

from placer.examples import dlrm  # noqa: E402
from placer.hardware.machine import compose_machine  # noqa: E402
from placer.sharding.plan import plan_sharding  # noqa: E402
from placer.sharding.cost import ShardEstimator, ShardSettings  # noqa: E402
from placer.sharding.net import DlrmTrainNet, train_view  # noqa: E402
from placer.sharding.search import Choice, Search  # noqa: E402
from placer.sharding.types import (COLUMN_WISE, DATA_PARALLEL, HBM, ROW_WISE, TABLE_WISE, UVM,  # noqa: E402
                                             UVM_CACHING)
from placer.hardware.profiles import load_device_profile  # noqa: E402
from placer.units import fmt_time  # noqa: E402

PER_RANK_BATCH = 2048
KERNELS = {"fused": HBM, "dense": HBM, "fused_uvm": UVM, "fused_uvm_caching": UVM_CACHING}
TERMS = ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms")
GiB = 2 ** 30


@dataclass
class Config:
    name: str
    machine: str                # bench/sharding_machines.py name, or "1x-a100"
    world: int
    local: int
    hbm_gib: float


CONFIGS = [Config("1x A100 40 GB", "1x-a100", 1, 1, 40), Config("8x A100 40 GB", "8x-a100", 8, 8, 40),
           Config("8x V100 16 GB", "8x-v100", 8, 8, 16), Config("2 hosts x 8 A100 40 GB", "2x8-a100", 16, 8, 40)]


def placer_machine(name: str):
    if name == "1x-a100":
        host = load_device_profile("host-ci-2core", "cpu")
        return compose_machine(host, load_device_profile("a100-40gb-sxm4", "gpu")), "--gpu-profile a100-40gb-sxm4"
    return bench_machine(name)


# ------------------------------------------------------------------ TorchRec's planner

def torchrec_plan(cfg: Config):
    """(best plan: list of TorchRec ShardingOptions, planning seconds)."""
    import logging

    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=128, num_embeddings=rows, feature_names=[f"f{i}"])
              for i, rows in enumerate(dlrm.CRITEO_1TB_ROWS)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    topology = Topology(world_size=cfg.world, compute_device="cuda", hbm_cap=int(cfg.hbm_gib * GiB),
                        local_world_size=cfg.local)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                          "learning_rate": 0.01})
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=PER_RANK_BATCH)
    start = time.perf_counter()
    planner.plan(ebc, [sharder])
    return planner._best_plan, time.perf_counter() - start


def torchrec_rank_terms(options) -> tuple[float, int, dict[str, float]]:
    """TorchRec's rating (ms -> s) of its plan, the busiest rank and that rank's terms."""
    ranks: dict[int, dict[str, float]] = {}
    for so in options:
        for shard in so.shards:
            terms = ranks.setdefault(shard.rank, {t: 0.0 for t in TERMS + ("total",)})
            for t in TERMS:
                terms[t] += getattr(shard.perf, t) / 1e3
            terms["total"] += shard.perf.total / 1e3
    rank = max(ranks, key=lambda r: ranks[r]["total"])
    return ranks[rank]["total"], rank, ranks[rank]


# ------------------------------------------------------------------ into placer's plan

def as_choices(search: Search, options, local: int) -> list[Choice]:
    """TorchRec's options as choices of placer's layouts (table ti is placer's table i)."""
    by_table = {int(so.name[1:]): so for so in options}
    choices = []
    for t in range(len(search.layouts)):
        so = by_table[t]
        kernel = KERNELS[so.compute_kernel]
        ranks = sorted(s.rank for s in so.shards)
        st = so.sharding_type
        if st == COLUMN_WISE and len(ranks) == 1:
            st = TABLE_WISE
        wanted = {"table_wise": (TABLE_WISE, 1, None), "column_wise": (COLUMN_WISE, len(ranks), None),
                  "row_wise": (ROW_WISE, 0, tuple(range(search.est.k))),
                  "table_row_wise": (ROW_WISE, 0, tuple(range(ranks[0] // local * local, ranks[0] // local * local + local))),
                  "data_parallel": (DATA_PARALLEL, 0, tuple(range(search.est.k)))}[st]
        match = None
        for i, lay in enumerate(search.layouts[t]):
            if lay.sharding_type == wanted[0] and lay.kernel == (HBM if st == "data_parallel" else kernel) \
                    and lay.shards == wanted[1] and (wanted[2] is None or lay.group == wanted[2]):
                match = Choice(i, tuple(ranks) if lay.shards else ())
                break
        if match is None:
            raise SystemExit(f"table t{t}: TorchRec's {so.sharding_type}/{so.compute_kernel} on {ranks} has no "
                             "placer layout")
        choices.append(match)
    return choices


def placer_rank_terms(search: Search, choices: list[Choice], rank: int) -> dict[str, float]:
    """The same rank's summed shard perf under placer's estimator."""
    terms = {t: 0.0 for t in TERMS}
    for t, c in enumerate(choices):
        lay = search.layouts[t][c.layout]
        on = rank in (c.positions if lay.shards else lay.group)
        if not on:
            continue
        perf = lay.perf[rank]
        for name, value in zip(TERMS, (perf.fwd_compute_s, perf.fwd_comms_s, perf.bwd_compute_s, perf.bwd_comms_s)):
            terms[name] += value
    return terms


def launch_seconds(view, device: int) -> dict[str, float]:
    """Per phase of a table's ops (forward, backward = gradient + update), the seconds of
    kernel launches placer's cost model charges (its cupy kernels' launch counts times the
    profile's launch overhead): the fixed part of placer's lookup prices."""
    from placer.ops import registry
    typed, prof = view.typed, view.model.profile(device)
    table = view.tables[0]
    out = {"fwd_compute": 0.0, "bwd_compute": 0.0}
    for i in table.ops:
        op = typed.net.ops[i]
        n = registry.get(op.type).launch_count(list(typed.op_inputs[i]), op.args)
        out["fwd_compute" if i in table.lookups else "bwd_compute"] += n * prof.launch_overhead_s
    return out


def compare(cfg: Config, time_limit: float) -> list[str]:
    options, planning_s = torchrec_plan(cfg)
    estimate, rank, tr_terms = torchrec_rank_terms(options)
    machine, how = placer_machine(cfg.machine)
    source = DlrmTrainNet(dlrm.criteo_1tb())
    G = PER_RANK_BATCH * cfg.world
    settings = ShardSettings(gpu_mem_bytes=cfg.hbm_gib * GiB)
    ranks = tuple(machine.gpus[:cfg.world])
    view = train_view(source.typed_at_batch(PER_RANK_BATCH), machine)
    search = Search(ShardEstimator(view, machine, ranks, G, settings))
    choices = as_choices(search, options, cfg.local)
    theirs = search.score(choices)
    ours = plan_sharding(source, machine, global_batch=G, settings=settings, degrees=[cfg.world], time_limit_s=time_limit,
                         budget_s=25.0)
    free = plan_sharding(source, machine, global_batch=G, settings=settings, time_limit_s=time_limit, budget_s=25.0)
    pl_terms = placer_rank_terms(search, choices, rank)
    kinds = {}
    for so in options:
        key = f"{so.sharding_type}/{so.compute_kernel}"
        kinds[key] = kinds.get(key, 0) + 1
    lines = [f"## {cfg.name} ({how}; global batch {G})",
             f"TorchRec: planned in {planning_s:.2f} s; layouts {kinds}; own estimate (busiest rank {rank}, "
             f"embeddings only) {fmt_time(estimate)}",
             f"placer's cost model: TorchRec's plan {fmt_time(theirs)} per step; placer's plan on the same "
             f"{cfg.world} GPUs {fmt_time(ours.plan.total_s)} ({_gap(ours.plan)}, planned in {ours.seconds:.1f} s); "
             f"placer's choice of degree: {len(free.plan.ranks)} GPUs, {fmt_time(free.plan.total_s)} per step of {G}",
             f"placer no worse than TorchRec's plan: {ours.plan.total_s <= theirs * (1 + 1e-12) if math.isfinite(theirs) else 'its plan does not fit'}"]
    ours_sum = sum(pl_terms.values())
    lines.append(f"busiest rank {rank}, embeddings only: TorchRec {fmt_time(estimate)} vs placer's estimator "
                 f"{fmt_time(ours_sum)} (x{ours_sum / estimate:.2f})")
    launches = launch_seconds(view, ranks[rank])
    gpu_tables = sum(1 for t, c in enumerate(choices) if rank in (c.positions if search.layouts[t][c.layout].shards
                                                                  else search.layouts[t][c.layout].group))
    for t in TERMS:
        a, b = tr_terms[t], pl_terms[t]
        ratio = b / a if a > 0 else math.inf if b > 0 else 1.0
        differs = (ratio > 2 or ratio < 0.5) and max(a, b) > 0
        why = ""
        if differs and t in launches:
            fixed = launches[t] * gpu_tables
            why = (f"; of placer's, {fmt_time(fixed)} are kernel launches ({gpu_tables} tables x "
                   f"{fmt_time(launches[t])}: placer's cupy kernels, one set per table, where FBGEMM runs "
                   f"every table in one fused kernel)")
        elif differs and cfg.world == 1:
            why = "; TorchRec charges the output distribution on a single rank too; placer has nothing to exchange"
        elif differs:
            alpha, beta = search.est.a2a
            why = (f"; TorchRec prices collectives at its constants, 600 GB/s within a host and 12.5 GB/s "
                   f"across; placer from the machine's links: all-to-all at {1 / beta / 1e9:.3g} GB/s of a "
                   f"rank's buffer + {fmt_time(alpha)} latency, row-wise reduce-scatter / all-gather over NCCL's "
                   f"ring")
        lines.append(f"  {t:<12} TorchRec {fmt_time(a):>9}   placer {fmt_time(b):>9}   x{ratio:.2f}"
                     + ("  <-- differs by more than 2x" + why if differs else ""))
    return lines


def _gap(plan) -> str:
    return "optimal" if plan.optimal else (f"gap {plan.gap:.1%}" if plan.gap is not None else "no bound")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(c.machine for c in CONFIGS),
                    help="which of: " + ", ".join(c.machine for c in CONFIGS))
    ap.add_argument("--time-limit", type=float, default=8.0)
    args = ap.parse_args()
    try:
        import torchrec  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"TorchRec is not installed ({e}): pip install -e '.[bench]' && "
                         "pip install --no-deps torchrec==1.8.0")
    wanted = args.configs.split(",")
    for cfg in CONFIGS:
        if cfg.machine in wanted:
            print("\n".join(compare(cfg, args.time_limit)))
            print()


if __name__ == "__main__":
    main()
