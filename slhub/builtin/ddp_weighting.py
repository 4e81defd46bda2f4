"""Distributed loss weighting: the committed update is sum(w_r * L_r) / sum(w_r).

DDP averages gradients over the N ranks, so back-propagating
``L_r * w_r * N / W`` (W = sum of weights) on rank r makes the averaged gradient
``sum_r w_r * grad(L_r) / W``: the gradient of the weighted global mean, whatever
the valid-supervision counts of the local batches are. On one process this is
``L * w / w = L``. The trainer never calls this for a rank with weight 0 (that
rank back-propagates an exact zero instead, so a 0/0 NaN in its loss cannot
reach the gradients), nor for an update whose total weight is 0 (skipped).
"""

from __future__ import annotations

import torch

from slhub import LossResult, Trainer, hookimpl


@hookimpl(trylast=True)
def scale_loss(trainer: Trainer, result: LossResult, total_weight: float) -> torch.Tensor:
    weight = float(result.weight)
    return result.loss * (weight * trainer.world_size / total_weight)
