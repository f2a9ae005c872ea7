"""What ``plan_sharding`` plans for: a train net at any per-replica batch, either read from
a file (``ScaledTrainNet``: every fed blob's first dimension scaled) or made from a DLRM
configuration (``DlrmTrainNet``: ``placer.examples.dlrm`` with its loss and optimizer)."""
from __future__ import annotations

from typing import TypeAlias

from placer.sharding.net import DlrmTrainNet, ScaledTrainNet

ShardingSource: TypeAlias = ScaledTrainNet | DlrmTrainNet

__all__ = ["ShardingSource"]
