"""The bundled DLRM Criteo-1TB net planned on three GPUs: which tables stay on the CPU.

26 tables of dimension 128 (float32); the four largest hold 39.88M, 38.53M, 39.98M and
39.66M rows, ~20 GB each, 96 GB in all. A V100 (16 GB) or an A100 (40 GB) cannot hold
them: those tables must stay on the CPU while the MLPs run on the GPU (the A100 takes one
of the four beside the small tables); an H200 (141 GB) holds everything.
"""
from __future__ import annotations

import contextlib
import io
import re

import pytest
from test_plan_cli import assert_consistent, strict_json

from placer import cli, examples

NET = examples.path("dlrm_criteo_1tb")
INIT = NET.with_name("dlrm_criteo_1tb_init.pbtxt")
DIM = 128
LARGEST = {39884406, 38532951, 39979771, 39664984}   # MLPerf Criteo-1TB cardinalities
MLP_TYPES = {"FC", "Relu", "Sigmoid"}


def plan(*extra) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plan", str(NET), "--init-net", str(INIT), "--json", *map(str, extra)])
    assert rc == 0, err.getvalue()
    return strict_json(out.getvalue())


@pytest.fixture(scope="module")
def plans() -> dict:
    return {gpu: plan("--gpu-profile", gpu)
            for gpu in ("v100-16gb-pcie3", "a100-40gb-pcie4", "h200-141gb-pcie5")}


def tables(doc: dict) -> dict:
    """SparseLengthsSum op index -> rows of the table it reads (from the tensor table)."""
    params = {t["name"]: t for t in doc["tensors"] if t["producer"] == -2}
    out = {}
    for t in params.values():
        for c in t["consumers"]:
            if doc["ops"][c]["type"] == "SparseLengthsSum":
                assert t["bytes"] % (4 * DIM) == 0
                out[c] = int(t["bytes"] // (4 * DIM))
    return out


def test_the_net_is_the_criteo_1tb_dlrm(plans):
    doc = plans["v100-16gb-pcie3"]
    rows = tables(doc)
    assert len(rows) == 26 and max(rows.values()) <= 40_000_000
    assert LARGEST <= set(rows.values())
    total = sum(t["bytes"] for t in doc["tensors"] if t["producer"] == -2)
    assert 95e9 < total < 98e9


@pytest.mark.parametrize("gpu", ["v100-16gb-pcie3", "a100-40gb-pcie4"])
def test_tables_that_do_not_fit_stay_on_the_cpu(plans, gpu):
    doc = plans[gpu]
    ops, rows = doc["ops"], tables(doc)
    mem = doc["gpu_memory"]
    assert mem["used_bytes"] <= mem["usable_bytes"]
    assert mem["usable_bytes"] == pytest.approx(0.9 * mem["capacity_bytes"])
    on_cpu = {i: n for i, n in rows.items() if ops[i]["device"] == "cpu"}
    # on the V100 all four ~20 GB tables stay on the CPU; the A100 (38.7 GB usable) takes
    # one of them beside the 22 small tables (15.3 GB), and no more
    assert len(set(on_cpu.values()) & LARGEST) == (4 if gpu.startswith("v100") else 3)
    for i, n in on_cpu.items():
        assert mem["used_bytes"] + n * DIM * 4 > mem["usable_bytes"]   # it would not fit
        assert "do not fit in GPU memory" in ops[i]["reason"]
    on_gpu = [n for i, n in rows.items() if ops[i]["device"] == "gpu"]
    assert sum(on_gpu) * DIM * 4 <= mem["param_bytes"] <= mem["usable_bytes"]
    assert len(on_gpu) >= 20            # the small tables do go to the GPU
    mlp = [o for o in ops if o["type"] in MLP_TYPES]
    assert len(mlp) == 3 * 2 + 5 * 2 - 1 + 1    # bottom 3 FC+Relu, top 5 FC + 4 Relu, Sigmoid
    # the FCs and Relus run on the GPU; the final Sigmoid, over a (batch, 1) output, launches
    # five kernels there (~25 us) against ~8 us on the host, and may go either way
    dense = [o for o in mlp if o["type"] != "Sigmoid"]
    assert all(o["device"] == "gpu" for o in dense), [(o["index"], o["device"]) for o in dense]
    for name in ("all_gpu", "greedy"):
        b = doc["baselines"][name]
        assert not b["feasible"] and b["gpu_memory_bytes"] > 95e9
        assert "89.6 GiB" in b["why_infeasible"] and "usable" in b["why_infeasible"]  # 96.2e9 B
    assert doc["baselines"]["all_cpu"]["feasible"]
    assert doc["baselines"]["all_cpu"]["total_s"] > 10 * doc["total_s"]
    assert doc["optimal"] and doc["gap"] == 0.0 and doc["method"] == "mincut"
    assert_consistent(doc)
    # a table on the CPU hands its pooled rows to the GPU: one H2D copy each
    copied = {c["tensor"] for c in doc["copies"] if c["direction"] == "h2d"}
    for i, n in rows.items():
        if ops[i]["device"] == "cpu":
            assert set(ops[i]["outputs"]) <= copied


def test_the_larger_gpu_keeps_more_tables(plans):
    cpu_tables = {gpu: sorted(n for i, n in tables(doc).items() if doc["ops"][i]["device"] == "cpu")
                  for gpu, doc in plans.items()}
    assert set(cpu_tables["a100-40gb-pcie4"]) <= set(cpu_tables["v100-16gb-pcie3"])
    assert len(cpu_tables["a100-40gb-pcie4"]) < len(cpu_tables["v100-16gb-pcie3"])
    assert cpu_tables["h200-141gb-pcie5"] == []
    assert plans["a100-40gb-pcie4"]["total_s"] < plans["v100-16gb-pcie3"]["total_s"]


def test_on_the_h200_everything_fits(plans):
    doc = plans["h200-141gb-pcie5"]
    # every table and every layer on the GPU; only the final Sigmoid may run on the host,
    # where its (batch, 1) input costs less than its five kernel launches (see above)
    assert all(o["device"] == "gpu" for o in doc["ops"] if o["type"] != "Sigmoid")
    assert doc["baselines"]["all_gpu"]["feasible"] and doc["baselines"]["greedy"]["feasible"]
    assert doc["total_s"] <= doc["baselines"]["all_gpu"]["total_s"] * (1 + 1e-9)
    assert doc["total_s"] == pytest.approx(doc["baselines"]["all_gpu"]["total_s"], rel=0.02)
    assert 95e9 < doc["gpu_memory"]["used_bytes"] <= doc["gpu_memory"]["usable_bytes"]
    # ~40x: each of the 26 lookups launches 11 kernels on the GPU (its index checks, the
    # gather, the segment ids, the scatter-add), ~55 us of launch overhead apiece
    assert doc["baselines"]["all_cpu"]["total_s"] > 30 * doc["total_s"]
    assert_consistent(doc)


def test_makespan_plan_is_never_worse_than_the_mincut_plan(plans):
    span = plan("--gpu-profile", "v100-16gb-pcie3", "--method", "makespan")
    mincut = plans["v100-16gb-pcie3"]
    assert span["objective"] == "makespan"
    assert span["gpu_memory"]["used_bytes"] <= span["gpu_memory"]["usable_bytes"]
    got, ref = (d["schedules"]["makespan"]["makespan_s"] for d in (span, mincut))
    assert got <= ref * (1 + 1e-9)
    assert_consistent(span)


def test_without_the_milp_the_plan_says_optimality_is_not_proven(plans):
    doc = plan("--gpu-profile", "v100-16gb-pcie3", "--time-limit", "0")
    assert doc["optimal"] is False and doc["gap"] is None
    assert "optimality not proven" in doc["optimality"] and "time limit 0" in doc["optimality"]
    assert doc["total_s"] >= plans["v100-16gb-pcie3"]["total_s"] * (1 - 1e-9)   # never below the optimum
    assert doc["gpu_memory"]["used_bytes"] <= doc["gpu_memory"]["usable_bytes"]
    assert_consistent(doc)


def test_other_methods_on_the_v100(plans):
    """The MILP alone finds the same optimum; greedy ignores memory, so it says it does not fit."""
    milp = plan("--gpu-profile", "v100-16gb-pcie3", "--method", "milp")
    assert milp["optimal"] and milp["total_s"] == pytest.approx(plans["v100-16gb-pcie3"]["total_s"], rel=1e-9)
    assert milp["gpu_memory"]["used_bytes"] <= milp["gpu_memory"]["usable_bytes"]
    assert_consistent(milp)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plan", str(NET), "--init-net", str(INIT), "--gpu-profile", "v100-16gb-pcie3",
                       "--method", "greedy"])
    assert rc == 2 and out.getvalue() == ""
    assert len(err.getvalue().strip().splitlines()) == 1
    # 96.2e9 B of tables against 90% of the V100's 16 GiB
    assert "greedy placement needs 89.6 GiB of GPU memory; 14.4 GiB usable (16 GiB less the 10% reserve)" \
        in err.getvalue()


def test_a_huge_table_pinned_to_a_small_gpu_is_infeasible():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["plan", str(NET), "--init-net", str(INIT), "--pin", "emb:::sls0_z=gpu", "--gpu-mem", "1GiB"])
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and out.getvalue() == "" and len(lines) == 1
    # 39,884,406 rows x 128 x 4 B = 19,476 MiB for the table; 921.6 MiB usable
    m = re.search(r"need ([0-9.]+) MiB of GPU memory, ([0-9.]+) MiB over the ([0-9.]+) MiB usable: "
                  r"(#6 SparseLengthsSum)", lines[0])
    assert m, lines[0]
    need, over, usable = map(float, m.groups()[:3])
    assert need >= 39884406 * 128 * 4 / 2**20 and usable == pytest.approx(0.9 * 1024, abs=0.1)
    assert over == pytest.approx(need - usable, abs=0.2)
