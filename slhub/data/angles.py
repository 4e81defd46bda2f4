"""The one angle-wrap convention of slhub's data, for numpy and torch alike.

Cart-pole data, NeRD and the external packages all wrap angles to [-pi, pi);
one function keeps them agreeing bit for bit. It is written with the ``%``
operator, which is ``numpy.remainder`` on arrays and ``torch.remainder`` on
tensors (both floored: the result has the sign of the divisor), so the same
expression serves both libraries without importing torch here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

AngleT = TypeVar("AngleT", np.ndarray, "torch.Tensor", float)


def wrap_angle(theta: AngleT) -> AngleT:
    """Wrap angles to [-pi, pi).

    :param theta: a numpy array, a torch tensor (any float dtype, on any device;
        differentiable) or a float.
    :returns: the same kind of object, ``(theta + pi) mod 2 pi - pi``.
    """
    return (theta + math.pi) % (2.0 * math.pi) - math.pi
