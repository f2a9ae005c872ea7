"""Plans of the bundled Detectron-style detection nets on a T4 and a V100: the answers the
README's "Detection nets" section gives, recomputed with the command a user types.

    python bench/detection_plans.py [--cpu-profile epyc-7742-2s] [--markdown]

For Faster R-CNN R-50-C4 and the same net with its Mask R-CNN head (both at 1x3x800x800,
``placer/examples/faster_rcnn.py``, random weights: only shapes matter to a plan), each GPU
profile and each host profile, this runs

    placer plan NET --init-net INIT --input data=1,3,800,800 --gpu-profile G --cpu-profile C --json

(im_info follows from data) and prints the plan against all-CPU and against all-on-GPU
(every op Caffe2 has a GPU kernel for on the GPU, the rest on the CPU), where the plan
leaves which op types, its copies, and the same plan with ``--allow-gpu-only-in-placer``
(placer's own GPU kernels for the ops Caffe2 runs on the CPU only) and with
``--detections 20`` (a typical image rather than the 100-detection bound).

Planning only: nothing runs a net, so the figures do not depend on this host's load.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from placer.cli import main  # noqa: E402
from placer.examples import faster_rcnn  # noqa: E402

GPUS = ("t4-pcie3", "v100-16gb-pcie3")
HOSTS = ("epyc-7742-2s", "host-ci-2core")


def plan_doc(files: dict, gpu: str, cpu: str, *extra: str) -> dict:
    out = io.StringIO()
    argv = ["plan", str(files["predict"]), "--init-net", str(files["init"]), "--input", "data=1,3,800,800",
            "--gpu-profile", gpu, "--cpu-profile", cpu, "--json", "--stability-draws", "0", *extra]
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"placer {' '.join(argv)} exited {code}")
    return json.loads(out.getvalue())


def summary(doc: dict) -> dict:
    ops = doc["ops"]
    on_cpu = Counter(o["type"] for o in ops if o["device"] == "cpu")
    b = doc["baselines"]
    return {"plan_s": doc["total_s"], "copy_s": doc["copy_s"], "all_cpu_s": b["all_cpu"]["total_s"],
            "all_gpu_s": b["all_gpu"]["total_s"], "copies": len(doc["copies"]),
            "copy_bytes": sum(c["bytes"] for c in doc["copies"]), "on_cpu": dict(on_cpu),
            "optimality": doc["optimality"]}


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the README table")
    opts = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        nets = {"Faster R-CNN R-50-C4": faster_rcnn.write_planning_net(Path(tmp) / "frcnn"),
                "Mask R-CNN R-50-C4": faster_rcnn.write_planning_net(
                    Path(tmp) / "mrcnn", faster_rcnn.r50_c4_800(mask=True))}
        for name, files in nets.items():
            for cpu in HOSTS:
                for gpu in GPUS:
                    base = summary(plan_doc(files, gpu, cpu))
                    lifted = summary(plan_doc(files, gpu, cpu, "--allow-gpu-only-in-placer"))
                    typical = summary(plan_doc(files, gpu, cpu, "--detections", "20"))
                    rows.append((name, cpu, gpu, base, lifted, typical))
    if opts.markdown:
        print("| net | host | GPU | plan | all-CPU | all-on-GPU (Caffe2 kernels) | copies | on the CPU "
              "| placer's GPU kernels too | 20 detections |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for name, cpu, gpu, s, lifted, typical in rows:
        cpu_ops = ", ".join(f"{t}" + (f" x{n}" if n > 1 else "") for t, n in sorted(s["on_cpu"].items())) or "none"
        if opts.markdown:
            print(f"| {name} | {cpu} | {gpu} | {ms(s['plan_s'])} | {ms(s['all_cpu_s'])} | {ms(s['all_gpu_s'])} "
                  f"| {s['copies']} ({s['copy_bytes'] / 1e6:.2f} MB, {ms(s['copy_s'])}) | {cpu_ops} "
                  f"| {ms(lifted['plan_s'])} | {ms(typical['plan_s'])} |")
        else:
            print(f"{name} on {cpu} + {gpu}: plan {ms(s['plan_s'])} ({s['optimality']}); all-CPU "
                  f"{ms(s['all_cpu_s'])} ({s['all_cpu_s'] / s['plan_s']:.1f}x); all-on-GPU {ms(s['all_gpu_s'])}; "
                  f"{s['copies']} copies, {s['copy_bytes'] / 1e6:.2f} MB, {ms(s['copy_s'])}; on the CPU: {cpu_ops}; "
                  f"with placer's GPU kernels {ms(lifted['plan_s'])} (on the CPU: "
                  f"{', '.join(sorted(lifted['on_cpu'])) or 'none'}); at 20 detections {ms(typical['plan_s'])}")


if __name__ == "__main__":
    main_()
