"""Rank-0 validation: every ``validate`` implementation runs on rank 0 only, with the
unwrapped model in eval mode, under ``torch.no_grad``, with every random stream
restored afterwards.

Restoring the streams keeps validation out of the training sequence: a run that
validates and one resumed from a checkpoint taken before that validation draw
the same numbers afterwards. The wrapper also restores the model's train mode.
"""

from __future__ import annotations

import torch

from slhub import SlhubError, Trainer, hookimpl, preserved_random_state


@hookimpl(hookwrapper=True)
def validate(trainer: Trainer, model, step):
    if trainer.rank != 0:
        raise SlhubError(f"validate called on rank {trainer.rank}; validation runs on rank 0 only")
    was_training = model.training
    model.eval()
    with preserved_random_state(trainer.device), torch.no_grad():
        try:
            yield
        finally:
            model.train(was_training)
