"""Hardware: devices, machines, clusters, links, and the collective cost model."""
