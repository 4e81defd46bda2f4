"""The moving average of a model's trained parameters: the recipe's ``ema`` section.

The loop updates it after every update, skipped ones included (as the schedule
advances), so the average depends on the number of the update only. DDP keeps the
ranks' parameters identical, so every rank computes the same average and rank 0's
is the one a checkpoint holds (its ``ema`` key, written and read only by
:mod:`slhub.checkpoint`).

What is averaged: every parameter that requires grad when the model is built.
Buffers are not: they are per rank here (DDP does not broadcast them), and what
they hold (normalization statistics, BatchNorm running moments, counters) is
already a summary that validation and export use as it is. Frozen parameters do
not change, so they need no average either.

The arithmetic is ``ema = ema * d + param * (1 - d)`` in the parameters' dtype:
two products and a sum, each rounded once (no fused multiply-add), so the average
is exactly reproducible and equals the same operations done by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from slhub.errors import CheckpointError
from slhub.recipe import EmaSection


class Ema:
    """The averaged parameters of ``model`` under ``config``, and how many updates they hold.

    :param model: the unwrapped model the loop trains; the average starts as a copy
        of its parameters.
    """

    def __init__(self, model: nn.Module, config: EmaSection) -> None:
        self.config = config
        #: Updates averaged so far (diffusion_policy's ``optimization_step``).
        self.step = 0
        names: dict[int, list[str]] = {}
        params: list[nn.Parameter] = []
        for name, param in model.named_parameters(remove_duplicate=False):
            if not param.requires_grad:
                continue
            if id(param) not in names:  # a tied parameter is averaged once, under every name
                names[id(param)] = []
                params.append(param)
            names[id(param)].append(name)
        self._params = params
        #: The state-dict names of each averaged parameter (several when it is tied).
        self.names: tuple[tuple[str, ...], ...] = tuple(tuple(names[id(p)]) for p in params)
        with torch.no_grad():
            self._averages = [p.detach().clone() for p in params]
        #: The trained parameters while the averaged ones are swapped in, else None.
        self._stash: list[torch.Tensor] | None = None

    def update(self) -> None:
        """Average the parameters the update just committed into the EMA (every rank)."""
        decay = self.config.decay_after(self.step)
        with torch.no_grad():
            # torch's foreach ops have no public name (documented, beta, as torch._foreach_*;
            # torch.optim.swa_utils uses them); relied on since torch 2.4, tested on 2.13.0
            torch._foreach_mul_(self._averages, decay)
            torch._foreach_add_(self._averages, torch._foreach_mul(self._params, 1.0 - decay))
        self.step += 1

    @property
    def weights(self) -> dict[str, torch.Tensor]:
        """The averaged parameters by state-dict name (a tied one under each of its names)."""
        return {name: avg for group, avg in zip(self.names, self._averages) for name in group}

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the model's parameters for the block (validation), and
        the trained ones put back afterwards bit for bit, so training never sees them."""
        with torch.no_grad():
            stash = [p.detach().clone() for p in self._params]
            for param, avg in zip(self._params, self._averages):
                param.copy_(avg)
        self._stash = stash
        try:
            yield
        finally:
            with torch.no_grad():
                for param, trained in zip(self._params, stash):
                    param.copy_(trained)
            self._stash = None

    def trained_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model.state_dict()`` with the trained parameters, also while the averaged
        ones are swapped in (``trainer.save()`` from ``validate`` writes this)."""
        state = model.state_dict()
        if self._stash is not None:
            for group, trained in zip(self.names, self._stash):
                state.update(dict.fromkeys(group, trained))
        return state

    def load(self, step: int, weights: dict[str, Any]) -> None:
        """Continue from a checkpoint's EMA: the same names, shapes and dtypes, or one line.

        :raises CheckpointError: the weights do not fit this recipe's model.
        """
        expected = {name for group in self.names for name in group}
        if set(weights) != expected:
            extra = ", ".join(sorted(set(weights) - expected)) or "none"
            missing = ", ".join(sorted(expected - set(weights))) or "none"
            raise CheckpointError(
                "checkpoint's EMA weights do not fit this recipe's model "
                f"(unexpected: {extra}; missing: {missing})"
            )
        for group, avg in zip(self.names, self._averages):
            saved = weights[group[0]]
            if saved.shape != avg.shape or saved.dtype != avg.dtype:
                raise CheckpointError(
                    f"checkpoint's EMA weight {group[0]} is {_described(saved)}, the parameter "
                    f"is {_described(avg)}: an exact resume needs the same shape and dtype"
                )
        with torch.no_grad():
            for group, avg in zip(self.names, self._averages):
                avg.copy_(weights[group[0]])
        self.step = step


def _described(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"
