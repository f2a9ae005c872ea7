"""Converted Caffe deploy nets run at the batch they are fed, in placer and in real Caffe2.

    python bench/converted_batches.py [--corpus ../shared/nets] [--batches 1,2,4]

For every deploy prototxt of the corpus (and LeNet's): ``placer convert`` (the declared
input shape goes to value_info.json), the logits (the last Softmax's input) added to the
outputs, then ``placer run --inputs x.npz`` at each batch
(another batch than the declared one: the net is inferred again from the arrays), and
real Caffe2 (torch 1.8.1's caffe2.python, ``../shared/tools/caffe2-venv.sh``) runs the
same predict net on the same inputs with the weights placer's init net made. Prints, per
net and batch, the largest difference relative to the output's largest magnitude, whether
every element is within rtol 1e-3 (plus 1e-5 of that magnitude) of Caffe2's, the spread of each sample's outputs
relative to that magnitude (near 0: the random weights give a near-uniform output, and
agreement says little), and the seconds each side took.
A net placer cannot convert or run is a row that says why, not a crash.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from caffe2_oracle import run_caffe2  # noqa: E402

from placer import cli  # noqa: E402
from placer.formats import load_net  # noqa: E402
from placer.runtime.executor import Executor  # noqa: E402

NETS = ("mnist_lenet.prototxt", "bvlc_alexnet_deploy.prototxt", "caffenet_deploy.prototxt",
        "v1_caffenet_deploy.prototxt", "squeezenet_v1.0_deploy.prototxt", "mobilenet_deploy.prototxt",
        "resnet50_ResNet-50-deploy.prototxt", "ssd300_vgg_voc0712_deploy.prototxt")
PIXELS = {"mnist_lenet.prototxt": (0.0, 1.0)}          # LeNet's Data layer scales to [0, 1)
MEAN_SUBTRACTED = (-128.0, 128.0)                       # the ImageNet nets' inputs

CAFFE2 = """
predict = caffe2_pb2.NetDef()
text_format.Merge(spec["predict"], predict)
for name in spec["weights"]:
    workspace.FeedBlob(name, inputs["w/" + name])
times = {}
for batch in spec["batches"]:
    for name in spec["feeds"]:
        workspace.FeedBlob(name, inputs["%d/%s" % (batch, name)])
    start = time.perf_counter()
    workspace.RunNetOnce(predict)
    times[batch] = time.perf_counter() - start
    for name in predict.external_output:
        save(**{"%d/%s" % (batch, name): workspace.FetchBlob(name)})
save_json(times)
"""


def quiet(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, err.getvalue().strip()


def with_logits(out: Path):
    """The converted net with the last Softmax's input among its outputs (random weights
    can saturate a softmax to one-hot or flatten it to uniform, where agreement of the
    probabilities says little; the logits still differ), as ``logits_net.pbtxt``."""
    from google.protobuf import text_format
    net = load_net(out / "predict_net.pbtxt")
    proto = net.proto
    last = [op for op in proto.op if op.type == "Softmax"]
    if last and last[-1].input[0] not in proto.external_output:
        proto.external_output.append(last[-1].input[0])
    (out / "logits_net.pbtxt").write_text(text_format.MessageToString(proto))
    return load_net(out / "logits_net.pbtxt", init_path=out / "init_net.pbtxt", input_shapes=net.input_shapes)


def one_net(prototxt: Path, batches: list[int], work: Path) -> list[dict]:
    out = work / prototxt.stem
    code, err = quiet("convert", prototxt, "-o", out)
    if code:
        return [{"net": prototxt.stem, "batch": "-", "result": f"convert exit {code}: {err[:120]}"}]
    net = with_logits(out)
    weights = {k: np.asarray(v) for k, v in Executor(net).run_init().items()}
    rng = np.random.default_rng(7)
    arrays = {f"w/{k}": v for k, v in weights.items()}
    ours, placer_s = {}, {}
    for batch in batches:
        feed = {n: rng.uniform(*PIXELS.get(prototxt.name, MEAN_SUBTRACTED), (batch, *t.shape[1:])).astype(t.dtype)
                for n, t in net.input_shapes.items()}
        np.savez(out / f"x{batch}.npz", **feed)
        start = time.perf_counter()
        code, err = quiet("run", out / "logits_net.pbtxt", "--init-net", out / "init_net.pbtxt",
                          "--inputs", out / f"x{batch}.npz",
                          "--outputs", out / f"y{batch}.npz", "--warmup", "0", "--iterations", "1")
        placer_s[batch] = time.perf_counter() - start
        if code:
            return [{"net": prototxt.stem, "batch": batch, "result": f"run exit {code}: {err[:120]}"}]
        with np.load(out / f"y{batch}.npz") as y:
            ours.update({f"{batch}/{k}": y[k] for k in y.files})
        arrays.update({f"{batch}/{k}": v for k, v in feed.items()})
    from google.protobuf import text_format
    spec = {"predict": text_format.MessageToString(net.proto), "weights": sorted(weights),
            "feeds": sorted(net.input_shapes), "batches": batches}
    try:
        theirs, times = run_caffe2("import time\nspec = " + json.dumps(spec) + "\n" + CAFFE2, arrays, timeout=900)
    except Exception as e:  # a row that says why
        why = [line.strip() for line in str(e).splitlines() if line.strip()]
        said = next((line for line in reversed(why) if "Error" in line or "error" in line), why[-1] if why else "")
        return [{"net": prototxt.stem, "batch": "-", "result": f"Caffe2 failed: {said[:150]}"}]
    rows = []
    for batch in batches:
        keys = sorted(k for k in theirs if k.startswith(f"{batch}/"))
        worst, within, spread = 0.0, bool(keys), 0.0
        for k in keys:
            got, want = ours.get(k), theirs[k]
            if got is None or got.shape != want.shape:
                within = False
                continue
            scale = float(np.abs(want).max()) or 1.0
            flat = want.reshape(want.shape[0], -1) if want.ndim else want.reshape(1, 1)
            spread = max(spread, float((flat.max(axis=1) - flat.min(axis=1)).max()) / scale)
            worst = max(worst, float(np.abs(got - want).max()) / scale)
            # a logit is a sum whose terms are larger than it can be (it crosses zero): its
            # error is relative to the output's scale, not to itself
            within &= bool(np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale))
        rows.append({"net": prototxt.stem, "batch": batch, "outputs": ",".join(k.split("/", 1)[1] for k in keys),
                     "max_diff_rel": worst, "spread": round(spread, 4), "within": within, "placer_run_s": round(placer_s[batch], 3),
                     "caffe2_s": round(float(times[str(batch)]), 3), "result": "ok" if within else "DIFFERS"})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT.parent / "shared" / "nets"))
    ap.add_argument("--batches", default="1,2,4")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    caffe = Path(args.corpus) / "caffe"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in NETS:
            if (caffe / name).is_file():
                rows += one_net(caffe / name, batches, Path(tmp))
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_colwidth", 70):
        print(pd.DataFrame(rows).to_string(index=False))
    ok = {r["net"] for r in rows if r["result"] == "ok"} - {r["net"] for r in rows if r["result"] != "ok"}
    print(f"\n{len(ok)}/{len({r['net'] for r in rows})} nets give Caffe2's outputs (rtol 1e-3) at batches {args.batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
