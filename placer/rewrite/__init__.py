"""Rewrite: a Plan and a Net in, placed Caffe2 NetDefs out (one machine, per worker, the manifest)."""
