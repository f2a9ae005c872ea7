#!/usr/bin/env python3
"""Run placer from a checkout: `python cli.py plan net.pbtxt` does what `placer plan net.pbtxt` does."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from placer.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
