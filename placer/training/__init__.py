"""Train nets as Caffe2 writes them: the backward pass (``gradients``, ``backward``), the
optimizer ops (``optimizers``) and Caffe solvers turned into both (``solver``)."""
from placer.training.backward import add_gradient_ops, backward_ops
from placer.training.gradients import GradientError, GradientSlice, gradient_for_op

__all__ = ["add_gradient_ops", "backward_ops", "gradient_for_op", "GradientError", "GradientSlice"]
