"""``placer run OUTDIR --ray [ADDRESS]``: a cluster plan on Ray, as ``placer run`` runs one net.

Inputs: ``--inputs`` as given, or ``--random-inputs SEED``: the arrays ``placer run`` draws
for the unplaced net with that seed (the same blobs in the same order; indices and
lengths made valid for the op that reads them through the placed net's copies), so the
same seed gives the same arrays and the outputs can be compared. Outputs, the record and the trace are written only
after every worker finished (atomically); a failed run writes nothing.

The table shows each worker's ops (devices as the cluster names them), then per iteration
the wall time, each worker's time inside its step, and Ray's overhead per worker (the
round trip of its one call per iteration less the time inside it), beside the plan's
predicted step (serial and overlapped).
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from placer.errors import InputError
from placer.fileio import atomic_write_bytes, atomic_write_text, note_read, refuse_outputs
from placer.formats import load_net
from placer.report.tables import run_table
from placer.report.trace import write_cluster_trace
from placer.rewrite.manifest import read_manifest
from placer.runtime.inputs import npz_files, random_inputs, read_npz
from placer.runtime.ray.driver import run_on_ray
from placer.runtime.record import from_dict
from placer.shapes import infer
from placer.units import fmt_time


def run_command(args) -> int:
    outdir = Path(args.net)
    if not outdir.is_dir():
        raise InputError(f"--ray: {outdir} is not a directory",
                         hint="give the OUTDIR of: placer plan NET --cluster NAME -o OUTDIR")
    manifest = read_manifest(outdir)
    inputs = one_process_inputs(outdir, manifest, _one_npz(args.inputs_npz), args.random_inputs or 0)
    for w in manifest["workers"]:  # they are read: no output may be one of them
        note_read(outdir / w["net"])
        note_read(outdir / w["init_net"])
    refuse_outputs({"--outputs": args.outputs, "--record": args.record, "--trace": args.trace},
                   *(args.inputs_npz or []))
    address = None if args.ray == "local" else args.ray
    run = run_on_ray(outdir, address, inputs, iterations=args.iterations, warmup=args.warmup,
                     emulate=bool(args.emulate_gpu or args.emulate_gpus), seed=args.seed, threads=args.threads,
                     max_restarts=args.max_restarts)
    if not args.quiet:
        for host, rec in run.records.items():
            print(f"worker {host}:")
            print(run_table(from_dict(rec)))
        print(summary(manifest, run))
    if args.outputs:
        buf = io.BytesIO()
        np.savez(buf, **run.outputs)
        atomic_write_bytes(args.outputs, buf.getvalue())
    if args.record:
        atomic_write_text(args.record, json.dumps(cluster_record(manifest, run), indent=1) + "\n")
    if args.trace:
        write_cluster_trace({h: (run.records[h], run.starts.get(h, 0.0)) for h in run.records}, args.trace)
    return 0


def _one_npz(given) -> Path | None:
    """The one .npz a Ray run feeds every iteration (``--inputs`` takes several for training
    steps; a cluster plan runs inference on one batch)."""
    files = npz_files(given) if given else []
    if len(files) > 1:
        raise InputError(f"--inputs: {len(files)} .npz files; a --ray run feeds one batch every iteration",
                         hint="give one .npz file")
    return files[0] if files else None


def one_process_inputs(outdir: Path, manifest: dict, npz: str | Path | None, seed: int) -> dict:
    """The arrays ``placer run OUTDIR/one_process.pbtxt`` would feed (module docstring)."""
    if npz:
        return read_npz(npz)
    net = load_net(outdir / manifest["one_process_net"])
    typed = infer(net, {})
    made = {o for op in (net.init_proto.op if net.init_proto is not None else ()) for o in op.output}
    names = [b for b in net.external_inputs if b not in made]
    return random_inputs(net, typed.blobs, names, seed=seed)


def summary(manifest: dict, run) -> str:
    """Per iteration: wall time, each worker's busy time and Ray overhead, the prediction."""
    pred = manifest["predicted"]
    wall = float(np.median(run.iteration_s)) if run.iteration_s else 0.0
    rows = [f"cluster run: {len(run.records)} workers, {len(run.iteration_s)} timed iteration(s), "
            f"median {fmt_time(wall)} per iteration (predicted {fmt_time(pred['serial_s'])} serial, "
            f"{fmt_time(pred['makespan_s'] or 0.0)} overlapped); init nets {fmt_time(run.init_s)}"]
    for w in manifest["workers"]:
        h = w["host"]
        rows.append(f"  worker {h}: {fmt_time(run.busy_s.get(h, 0.0))} in its step (predicted "
                    f"{fmt_time(w['predicted_s'])} on its devices), Ray overhead {fmt_time(run.call_overhead_s.get(h, 0.0))} "
                    f"per iteration (one call)")
    if run.restarts:
        rows.append(f"  restarted {run.restarts} time(s) after a worker died")
    if any("emulated" in str(r.get("timing_labels")) for r in run.records.values()):
        rows.append("  GPUs emulated on the CPU: times are CPU times (a structure check, not a speed figure)")
    return "\n".join(rows)


def cluster_record(manifest: dict, run) -> dict:
    """``--record`` for a cluster run: every worker's RunRecord and the per-iteration times."""
    return {"schema": "placer.cluster_run", "schema_version": 1, "net": manifest["net"],
            "cluster": manifest["cluster"]["name"], "workers": run.records,
            "iteration_s": run.iteration_s, "busy_s": run.busy_s, "call_overhead_s": run.call_overhead_s,
            "init_s": run.init_s, "restarts": run.restarts, "predicted": manifest["predicted"]}


__all__ = ["run_command", "one_process_inputs", "summary", "cluster_record"]
