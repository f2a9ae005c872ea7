"""Sharding: data parallelism and embedding-table layouts over GPUs (types, estimator, search, step model, net view)."""
