"""Measuring this machine: per-op timings, link curves, collectives, the host's rates.

- ``bench``: per-op timing of a net with the runtime's kernels;
- ``in_network``: op timings taken inside a whole-net run;
- ``link``: host<->GPU copy curves through cupy;
- ``collective_bench``: all-reduce and friends over the GPUs, fitted to the collective model;
- ``host``: a quick CPU characterisation (GEMM, streaming bandwidth, call overhead);
- ``calibration``: the nets that fit each op family's cost curve.

What they measure is written as a device profile (``placer.hardware.device_profile``);
finding and loading profiles is ``placer.hardware.profiles``.
"""
