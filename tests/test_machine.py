"""Machines: devices and links from shipped profiles, composed from options, and bad files."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from placer.errors import ProfileError
from placer.hardware.machine import (HOST, add_machine_arguments, compose_machine, load_machine, machine_from_args,
                            shipped_machine_names)
from placer.hardware.profiles import add_profile_arguments, load_device_profile


def test_shipped_machines_load_with_sourced_links():
    assert {"2x-t4-pcie3", "4x-v100-sxm2-nvlink", "8x-a100-40gb-nvswitch", "8x-h100-80gb-nvswitch",
            "8x-h200-141gb-nvswitch"} <= set(shipped_machine_names())
    for name in shipped_machine_names():
        m = load_machine(name)
        assert m.devices[HOST].kind == "cpu" and len(m.gpus) >= 2
        assert set(m.links) == {(a, b) for a in range(m.k) for b in range(m.k) if a != b}
        assert all(link.source for link in m.links.values())
        assert m.sources.get("topology")


def test_dgx1_like_mesh_has_two_link_one_link_and_staged_pairs():
    m = load_machine("4x-v100-sxm2-nvlink")
    nbytes = 64e6
    two, one, none = m.copy_time(nbytes, 1, 3), m.copy_time(nbytes, 1, 2), m.copy_time(nbytes, 1, 4)
    assert two == pytest.approx(1e-5 + nbytes / 40e9)
    assert one == pytest.approx(1e-5 + nbytes / 20e9)
    # staged: the source's D2H then the destination's H2D, each at PCIe 3 (12 GB/s)
    assert none == pytest.approx(2 * (1e-5 + nbytes / 12e9))
    assert m.link(1, 4).kind == "staged" and [h.lane for h in m.link(1, 4).hops] == \
        ["pcie[switch0]:d2h", "pcie[switch1]:h2d"]
    # GPUs behind one switch share its lanes
    assert m.link(HOST, 1).hops[0].lane == m.link(HOST, 2).hops[0].lane != m.link(HOST, 3).hops[0].lane


def test_link_classes_group_equal_links_and_keep_hops():
    m = load_machine("8x-a100-40gb-nvswitch")
    tables = m.link_classes()
    peer = {tables.link_class[a, b] for a in range(1, 9) for b in range(1, 9) if a != b}
    assert len(peer) == 1                       # NVSwitch: every pair alike
    secs = tables.class_seconds(np.array([0.0, 1e9]))
    c = next(iter(peer))
    assert secs[c, 1] == pytest.approx(1e-5 + 1e9 / 240e9) and secs[c, 0] == 0.0
    assert tables.routes[(1, 2)][0][1] == c


def test_composed_machine_and_single_gpu_options():
    p = argparse.ArgumentParser()
    add_profile_arguments(p)
    add_machine_arguments(p)
    one = machine_from_args(p.parse_args(["--gpu-profile", "t4-pcie3"]))
    assert one.names == ("cpu", "cuda:0") and one.index("gpu") == 1
    four = machine_from_args(p.parse_args(["--gpu-profile", "v100-16gb-pcie3", "--gpus", "4",
                                           "--gpu-link", "nvlink2", "--gpu-link-count", "2"]))
    assert four.k == 5 and four.copy_time(20e9, 2, 3) == pytest.approx(1e-5 + 0.5)
    with pytest.raises(ProfileError, match="ambiguous"):
        four.index("gpu")
    with pytest.raises(ProfileError, match="no device 'cuda:9'"):
        four.index("cuda:9")
    host = load_device_profile("host-ci-2core", "cpu")
    assert compose_machine(host, load_device_profile("t4-pcie3", "gpu"), gpus=0).k == 1


def test_bad_machine_files_are_one_line_errors(tmp_path):
    base = {"schema_version": 1, "kind": "machine", "name": "m", "host": "host-ci-2core",
            "gpus": [{"profile": "t4-pcie3", "count": 2}]}
    cases = [({**base, "kind": "device"}, "not a machine profile"),
             ({**base, "peer_links": [{"gpus": [0, 5], "kind": "nvlink2"}]}, "GPUs 0..1"),
             ({**base, "peer_links": [{"gpus": [0, 1], "kind": "warp"}]}, r"peer_links\[0\]\.kind.*found .warp."),
             ({**base, "gpus": [{"profile": "t4-pcie3", "count": 0}]}, "positive integer"),
             ({**base, "host": "t4-pcie3"}, "no 'cpu' device"),
             ({**base, "schema_version": 9}, "schema_version")]
    for data, message in cases:
        path = tmp_path / "m.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ProfileError, match=message):
            load_machine(path)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not a JSON machine profile"):
        load_machine(tmp_path / "junk.json")
