"""Train nets as Caffe2 writes them: the backward pass (``gradients``, ``backward``), the
optimizer ops (``optimizers``) and Caffe solvers turned into both (``solver``).
Importing the package registers every gradient maker (``gradient_makers``)."""
from placer.training import gradient_makers
from placer.training.backward import add_gradient_ops, backward_ops
from placer.training.gradient_registry import GradientError, GradientSlice
from placer.training.gradients import gradient_for_op

__all__ = ["add_gradient_ops", "backward_ops", "gradient_for_op", "GradientError", "GradientSlice",
           "gradient_makers"]
