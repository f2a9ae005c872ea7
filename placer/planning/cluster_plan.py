"""Planning over a cluster: ``planner.plan``'s stages with per-host CPU memory limits and the
hosts-first partitioner (``placer.partition.hosts``), and each host's share of the plan."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from placer.costs.model import annotate
from placer.errors import PlacerError, ProfileError
from placer.hardware.cluster import ClusterMachine, load_cluster
from placer.partition import baselines, partition
from placer.partition.check import check_plan
from placer.planning.planner import PlanOptions, PlanResult, memory_limits, overlapped, refuse_collectives, step_arrays
from placer.shapes import require_complete
from placer.training.placement import state_copy_bytes


def cluster_memory_limits(cluster: ClusterMachine, options) -> tuple[np.ndarray, np.ndarray]:
    """(capacity, usable) bytes per device: GPUs as on one machine (``planner.memory_limits``);
    each host's CPU memory from its profile (or ``options.host_mem_bytes``), all of it
    usable: parameters kept in several hosts' CPU memory are what a cluster plan is for."""
    capacity, usable = memory_limits(cluster, options)
    for d, dev in enumerate(cluster.devices):
        if not dev.is_gpu:
            limit = options.host_mem_bytes if options.host_mem_bytes is not None else dev.profile.memory_capacity_bytes
            capacity[d] = usable[d] = float(limit)
    return capacity, usable


def plan_cluster(typed, cluster: ClusterMachine, options=None):
    """``planner.plan`` over a cluster: the same stages, per-host CPU memory limits, and
    the hosts-first partitioner (``partition.hosts``) for the default method."""
    options = options or PlanOptions()
    net = require_complete(typed).net
    if not net.ops:
        raise PlacerError(f"{net.path or net.name or 'the net'}: the net has no ops; there is nothing to place")
    refuse_collectives(net)
    # 1. price every op on every device of every host
    costs = annotate(typed, cluster, unknown_op_cost_s=options.unknown_op_cost_s, precision=options.precision)
    # 2. the cost graph, with per-host CPU memory limits
    capacity, usable = cluster_memory_limits(cluster, options)
    arrays, graph_args, step, state_reads = step_arrays(typed, costs, cluster, options, usable)
    # 3. hosts first, then devices (other methods: flat over every device)
    if options.method == "auto":
        options = replace(options, method="hosts")      # what re-solves (stability) use too
    chosen = partition(arrays, options.method, time_limit=options.time_limit_s)
    if options.method == "hosts":
        chosen.notes.append(f"network {cluster.network_to_local_ratio():.3g}x slower than the fastest link "
                            f"within a host (1 MiB copies)")
    check_plan(arrays, chosen)
    # 4. baselines and the overlapped schedule
    base = baselines.baselines(arrays, None)
    state_copy_bytes(state_reads, arrays.t_names, chosen, *base.values())
    return PlanResult(typed, costs, arrays, chosen, base, cluster, capacity, usable,
                      makespan=overlapped(arrays, chosen, base), options=options, graph_args=graph_args,
                      step=step, state_reads=state_reads)


def host_summary(cluster: ClusterMachine, memory_bytes, placement) -> list[dict]:
    """Per host: its devices' memory use and how many ops it runs."""
    memory_bytes = np.asarray(memory_bytes, float)
    placement = np.asarray(placement, np.int64)
    out = []
    for h, host in enumerate(cluster.hosts):
        devs = cluster.devices_of(h)
        out.append({"host": host, "ops": int(np.isin(placement, devs).sum()),
                    "memory_bytes": float(memory_bytes[devs].sum()),
                    "cpu_memory_bytes": float(memory_bytes[devs[0]]),
                    "gpu_memory_bytes": float(memory_bytes[devs[1:]].sum())})
    return out


def cluster_plan_from_args(args, typed, options):
    """``placer plan --cluster``: the cluster, checked against the single-machine options,
    planned; prints nothing (the plan command prints the plan and each host's share)."""
    if getattr(args, "machine", None) or getattr(args, "gpus", None) is not None \
            or getattr(args, "gpu_profile", None) or getattr(args, "cpu_profile", None):
        raise ProfileError("--cluster already names every host's machine; drop --machine / --gpus / "
                           "--gpu-profile / --cpu-profile")
    if getattr(args, "init_out", None):
        raise ProfileError("--init-out: with --cluster, -o OUTDIR holds every worker's nets and init nets")
    return plan_cluster(typed, load_cluster(args.cluster), options)
