"""Regenerate the report screenshots in docs/ that README.md shows.

    python bench/screenshots.py                  # runs `placer demo` into a temporary folder
    python bench/screenshots.py --demo reports/demo   # shoots an existing demo's reports

Each shot is one section of a demo report (the others hidden by an injected style rule),
rendered by headless Chromium (Debian's ``chromium``) at a fixed window width, cropped to
its content and written as a small PNG with matplotlib's image functions. Needs chromium
on PATH (or --chromium); no network. The demo it runs uses one BLAS thread
(OPENBLAS_NUM_THREADS=1, for profiling and runs alike), so that other work on a shared
machine disturbs the predicted-vs-measured figures shown as little as it can.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1", "--virtual-time-budget=5000"]
WIDTH = 900

# (file in docs/, report under the demo folder, sections shown, window height in pixels)
SHOTS = [
    ("report-summary.png", "dlrm_criteo_1tb/report-v100.html", ["summary"], 2000),
    ("report-timeline.png", "dlrm_criteo_1tb/report-v100.html", ["timeline"], 1000),
    ("report-measured.png", "dlrm_small/report.html", ["measured"], 1800),
    # several GPUs: the 41 GB DLRM split over four V100s
    ("report-gpus-memory.png", "dlrm_40gb/report.html", ["memory"], 1400),
    ("report-gpus-timeline.png", "dlrm_40gb/report.html", ["timeline"], 1500),
    ("report-gpus-links.png", "dlrm_40gb/report.html", ["links"], 1000),
]


def only_sections(html: str, keep: list[str]) -> str:
    """The page with every <section> but ``keep`` hidden (title and navigation kept)."""
    rule = "section{display:none}" + "".join(f"section#{s}{{display:block}}" for s in keep)
    return html.replace("</head>", f"<style>{rule} nav{{display:none}}</style></head>", 1)


def shoot(chromium: str, page: Path, png: Path, height: int, scratch: Path) -> None:
    cmd = [chromium, *FLAGS, f"--user-data-dir={scratch / 'profile'}", f"--window-size={WIDTH},{height}",
           f"--screenshot={png}", page.as_uri()]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(scratch)})
    if res.returncode != 0 or not png.exists():
        raise SystemExit(f"chromium failed ({res.returncode}): {res.stderr[-1500:]}")


def crop(png: Path, out: Path, margin: int = 12, levels: int = 16) -> tuple[int, int]:
    """Trim the blank rows and columns below and right of the content and round each
    colour channel to ``levels`` values (text stays sharp; the PNG shrinks by half);
    returns (width, height)."""
    import matplotlib.image as mpimg
    img = mpimg.imread(png)[..., :3]
    ink = (img < 0.97).any(axis=2)
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    bottom = min(img.shape[0], (rows[-1] if rows.size else img.shape[0]) + margin)
    right = min(img.shape[1], (cols[-1] if cols.size else img.shape[1]) + margin)
    kept = np.round(img[:bottom, :right] * (levels - 1)) * (255 / (levels - 1))
    mpimg.imsave(out, np.ascontiguousarray(kept.astype(np.uint8)), pil_kwargs={"optimize": True})
    return right, bottom


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", metavar="DIR", help="an existing `placer demo -o DIR` (default: run one)")
    p.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    p.add_argument("-o", "--output", default=str(ROOT / "docs"), help="folder for the PNGs (default: docs/)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        demo = Path(args.demo) if args.demo else scratch / "demo"
        if not args.demo:
            subprocess.run([sys.executable, str(ROOT / "cli.py"), "demo", "-o", str(demo), "--quiet"],
                           check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        Path(args.output).mkdir(parents=True, exist_ok=True)
        for name, report, keep, height in SHOTS:
            page = scratch / f"{Path(name).stem}.html"
            page.write_text(only_sections((demo / report).read_text(encoding="utf-8"), keep), encoding="utf-8")
            raw = scratch / name
            shoot(args.chromium, page, raw, height, scratch)
            w, h = crop(raw, Path(args.output) / name)
            size = (Path(args.output) / name).stat().st_size
            print(f"{Path(args.output) / name}: {w}x{h}, {size / 1024:.0f} KiB ({report}: {', '.join(keep)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
