"""Cluster plans run on a local Ray instance (2 CPUs) that stands in for two hosts, each a
CPU and two emulated GPUs: outputs equal the single-process run of the same placed net, a
data-parallel step trains to the whole-batch parameters, and a worker that dies or raises
ends the run with one error naming it and its op, writing nothing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cluster_cases import assert_equal_up_to_summation_order, dp_linear, sgd_reference, tiny_cluster
from test_cluster import _forced_split, pipeline_plan
from placer.cli import main
from placer.commands.plan import _profiles
from placer.formats import load_net
from placer.rewrite.manifest import read_manifest, write_placed_dir, write_plan_dir
from placer.planning.view import plan_json
from placer.report.trace import validate_trace
from placer.runtime.ray.driver import ClusterRunError, run_on_ray
from placer.commands.run_ray import one_process_inputs
from placer.runtime.executor import Executor

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module: 2 CPUs, both simulated hosts' resources."""
    ray.init(num_cpus=2, resources={"placer_host_h0": 100, "placer_host_h1": 100}, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_parallel(tmp_path_factory, local_ray):
    """dlrm_small placed over every device of both hosts (pins), written as a plan dir."""
    typed, c, result = _forced_split()
    out = tmp_path_factory.mktemp("mp") / "plan"
    write_plan_dir(out, result, plan_json(result, _profiles(c)))
    return out


def one_process_run(outdir: Path, inputs: dict) -> dict:
    m = read_manifest(outdir)
    net = load_net(outdir / m["one_process_net"])
    return Executor(net, emulate_gpus=m["one_process_gpus"]).run(inputs, iterations=1, warmup=0)


def assert_as_one_process(got, want, outdir: Path) -> None:
    """Ray's workers start with their own BLAS thread count, so their sums run in another
    order than this process's: equal to the bound of float32 sums in any order."""
    net = load_net(outdir / read_manifest(outdir)["one_process_net"])
    assert_equal_up_to_summation_order(got, want, net)


def test_model_parallel_outputs_equal_the_single_process_run(model_parallel, tmp_path, capsys):
    """placer run OUTDIR --ray: the same seed gives the same inputs as a single run; outputs,
    per-worker records (devices as the cluster names them) and one merged trace."""
    m = read_manifest(model_parallel)
    assert len(m["messages"]) >= 6 and {d for w in m["workers"] for d in w["devices"]} == {
        "h0/cpu", "h0/cuda:0", "h0/cuda:1", "h1/cpu", "h1/cuda:0", "h1/cuda:1"}
    out, rec, trace = tmp_path / "out.npz", tmp_path / "run.json", tmp_path / "trace.json"
    assert main(["run", str(model_parallel), "--ray", "--emulate-gpu", "--random-inputs", "5", "--iterations", "2",
                 "--outputs", str(out), "--record", str(rec), "--trace", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "worker h0:" in text and "worker h1:" in text and "Ray overhead" in text
    inputs = one_process_inputs(model_parallel, m, None, 5)
    want = one_process_run(model_parallel, inputs)
    with np.load(out) as got:
        assert set(got.files) == set(want) == {"prob_click"}
        assert_as_one_process(got["prob_click"], want["prob_click"], model_parallel)
    record = json.loads(rec.read_text())
    h1 = record["workers"]["h1"]
    assert set(h1["devices"]) == {"h1/cpu", "h1/cuda:0", "h1/cuda:1"} and h1["iterations"] == 2
    received = sum(n for o in h1["ops"] if o["type"] == "ReceiveTensor" for src, dst, n in o["links"]
                   if src.startswith("h0/"))
    assert received == sum(msg["nbytes"] for msg in m["messages"] if msg["dst"].startswith("h1/"))
    assert len(record["iteration_s"]) == 2 and record["predicted"]["serial_s"] > 0
    events = json.loads(trace.read_text())
    assert validate_trace(events) == []
    assert {e["args"]["name"] for e in events["traceEvents"] if e["name"] == "process_name"} == {
        "measured: worker h0", "measured: worker h1"}


def test_pipeline_that_does_not_fit_one_host_runs_and_equals_one_process(local_ray, tmp_path):
    typed, result = pipeline_plan()
    out = tmp_path / "pipe"
    write_plan_dir(out, result, plan_json(result, _profiles(result.machine)))
    inputs = one_process_inputs(out, read_manifest(out), None, 0)
    run = run_on_ray(out, inputs=inputs, iterations=1, warmup=0, emulate=True)
    assert_as_one_process(run.outputs["relu7"], one_process_run(out, inputs)["relu7"], out)


@pytest.mark.parametrize("devices", [("h0/cuda:0", "h1/cuda:0"), ("h0/cpu", "h1/cpu")],
                         ids=["nccl-on-gpus", "gloo-on-cpus"])
def test_data_parallel_training_over_two_hosts_reaches_the_whole_batch_parameters(local_ray, tmp_path, devices):
    predict, init, inputs, w0, types = dp_linear(devices)
    write_placed_dir(tmp_path / "dp", predict, init, tiny_cluster(1), types, list(inputs))
    run = run_on_ray(tmp_path / "dp", inputs=inputs, iterations=3, warmup=1, emulate=True, want_state=True)
    w_h0, w_h1 = run.state["h0"]["r0/W"], run.state["h1"]["r1/W"]
    # Exact by construction, not by luck: both replicas receive the same all-reduced bits (a
    # sum of two terms is the same in either order) and apply the same elementwise update.
    np.testing.assert_array_equal(w_h0, w_h1)
    np.testing.assert_allclose(w_h0, sgd_reference(inputs, w0, steps=3), rtol=1e-5, atol=1e-6)
    assert not np.allclose(w_h0, sgd_reference(inputs, w0, steps=4), rtol=1e-5, atol=1e-6)   # warm-up dropped


def test_a_worker_that_dies_mid_run_is_named_with_its_op_and_nothing_is_written(model_parallel):
    inputs = one_process_inputs(model_parallel, read_manifest(model_parallel), None, 0)
    with pytest.raises(ClusterRunError) as err:
        run_on_ray(model_parallel, inputs=inputs, iterations=2, warmup=0, emulate=True,
                   fault={"host": "h1", "op": 2, "mode": "exit"})
    text = err.value.message
    assert "worker h1" in text and "h1/cpu, h1/cuda:0, h1/cuda:1" in text and "died while running op #2" in text


def test_max_restarts_runs_again_after_a_death(model_parallel, capsys):
    inputs = one_process_inputs(model_parallel, read_manifest(model_parallel), None, 0)
    run = run_on_ray(model_parallel, inputs=inputs, iterations=1, warmup=0, emulate=True, max_restarts=1,
                     fault={"host": "h1", "op": 2, "mode": "exit", "attempt": 0})
    assert run.restarts == 1
    err = capsys.readouterr().err
    assert "worker h1" in err and "died while running op #2" in err and "restarting every worker (1 of 1)" in err
    assert_as_one_process(run.outputs["prob_click"], one_process_run(model_parallel, inputs)["prob_click"],
                          model_parallel)


def test_a_worker_that_raises_is_one_cli_error_and_no_output_file(model_parallel, tmp_path, capsys):
    """An index beyond a table read on h1/cpu: SparseLengthsSum fails on worker h1."""
    m = read_manifest(model_parallel)
    inputs = one_process_inputs(model_parallel, m, None, 0)
    assert any(msg["blob"] == "emb:::sls1_i" and msg["dst"] == "h1/cpu" for msg in m["messages"])
    inputs["emb:::sls1_i"][:] = 10 ** 9          # table 1 is pinned to h1/cpu
    bad = tmp_path / "bad.npz"
    np.savez(bad, **inputs)
    out = tmp_path / "out.npz"
    assert main(["run", str(model_parallel), "--ray", "--emulate-gpu", "--inputs", str(bad), "--warmup", "0",
                 "--outputs", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if line.startswith("placer: error")]) == 1
    line = next(line for line in err if line.startswith("placer: error"))
    assert "worker h1" in line and "SparseLengthsSum" in line and "h1/cpu" in line
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_a_ray_run_feeds_one_npz_and_refuses_several(model_parallel, tmp_path, capsys):
    """--inputs takes several files for training steps; a --ray run feeds one batch."""
    inputs = one_process_inputs(model_parallel, read_manifest(model_parallel), None, 0)
    files = [tmp_path / "a.npz", tmp_path / "b.npz"]
    for f in files:
        np.savez(f, **inputs)
    assert main(["run", str(model_parallel), "--ray", "--emulate-gpu", "--inputs", *map(str, files)]) == 2
    err = capsys.readouterr().err
    assert "--inputs: 2 .npz files; a --ray run feeds one batch every iteration" in err


def test_data_parallel_model_layout_over_two_hosts_trains_like_one_device(local_ray, tmp_path):
    """data_parallel_model's layout of a LeNet SGD train net over the cluster's four GPUs
    (NCCLAllreduce of every gradient, parameters broadcast by the init net), put on the
    two hosts (on_hosts) and split: two steps on Ray give every replica the parameters of
    two steps of the one-device net on the whole batch."""
    from test_data_parallel_run import N, one_device, shard, state_blobs
    from placer.hardware.cluster import load_cluster
    from placer.formats.caffe2 import net_from_netdef
    from placer.rewrite.manifest import placed_types
    from placer.rewrite.workers import on_hosts
    from placer.shapes import infer
    from placer.training.data_parallel import data_parallel
    from placer.types import TensorType
    nets, feed = one_device("lenet", "sgd")
    dp = data_parallel(nets.train, nets.init, N, "gpu", use_nccl=True)
    dp_feed = {f"gpu_{k}/{n}": v for k in range(N) for n, v in shard("lenet", feed, k).items()}
    c = load_cluster("local-2hosts")
    predict, init = on_hosts(dp.train, dp.init, c, list(dp_feed))
    typed = infer(net_from_netdef(predict, init), {b: TensorType(v.shape, str(v.dtype)) for b, v in dp_feed.items()})
    types = placed_types(predict, init, typed.blobs, list(dp_feed))
    write_placed_dir(tmp_path / "dp", predict, init, c, types, list(dp_feed))
    m = read_manifest(tmp_path / "dp")
    assert m["collectives"] == len(nets.params) and any(x["phase"] == "init" for x in m["messages"])
    run = run_on_ray(tmp_path / "dp", inputs=dp_feed, iterations=2, warmup=0, emulate=True, want_state=True)

    state = state_blobs(nets)
    nets.train.external_output[:] = state
    one = Executor(net_from_netdef(nets.train, nets.init))
    for _ in range(2):                          # two steps, the state carried by hand
        want = one.run(feed, iterations=1, warmup=0)
        one.params.update({b: want[b] for b in state})
    for k in range(N):
        host = "h0" if k < 2 else "h1"
        for b in state:
            np.testing.assert_allclose(run.state[host][f"gpu_{k}/{b}"], want[b], rtol=2e-5, atol=2e-6,
                                       err_msg=f"gpu_{k}/{b}")


def test_workers_asking_for_gpus_ray_does_not_have_are_refused_before_starting(model_parallel):
    from placer.errors import PlacerError
    inputs = one_process_inputs(model_parallel, read_manifest(model_parallel), None, 0)
    with pytest.raises(PlacerError, match=r"need 4 GPUs \(h0 2, h1 2\); the Ray cluster has 0"):
        run_on_ray(model_parallel, inputs=inputs, emulate=False)
