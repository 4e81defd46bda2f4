"""Test-only plugins of tests/test_ema.py (``ema_probe:Name`` with tests/ on the path):
what training commits and what validation sees, recorded in :data:`RECORD`."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from examples.sl_ddp.plugin import SlDdpPlugin, masked_mse
from slhub import hookimpl

#: What :class:`EmaProbe` saw, by run directory: the trained weights after each update
#: (``trained``), the weights ``validate`` received (``validated``) and the initial ones.
RECORD: dict[str, dict[str, Any]] = {}


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


class EmaProbe(SlDdpPlugin):
    """sl_ddp, recording the weights training commits and the weights validation sees,
    and exporting ``checkpoint.model`` as it receives it."""

    def _record(self, trainer) -> dict[str, Any]:
        return RECORD.setdefault(str(trainer.output_dir), {"trained": {}, "validated": {}})

    @hookimpl
    def build_model(self, trainer) -> nn.Module:
        model = super().build_model(trainer)
        self._record(trainer)["initial"] = _params(model)
        return model

    @hookimpl
    def on_commit(self, trainer, step) -> None:
        self._record(trainer)["trained"][step] = _params(trainer.model)

    @hookimpl
    def validate(self, trainer, model, step):
        self._record(trainer)["validated"][step] = _params(model)
        x, y, mask = self.validation_corpus
        return {"mse": float(masked_mse(model(x), y, mask)[0])}

    @hookimpl
    def export(self, checkpoint, checkpoint_path, out_dir):
        torch.save(checkpoint.model, out_dir / "weights.pt")
        manifest = {"format": "slhub.export/1", "kind": "ema-probe"}
        (out_dir / "export.json").write_text(json.dumps(manifest))
        return out_dir


class SavesFromValidate(EmaProbe):
    """Calls ``trainer.save()`` from ``validate``, while the averaged weights are in."""

    @hookimpl
    def validate(self, trainer, model, step):
        metrics = super().validate(trainer, model, step)
        trainer.save(f"from_validate_{step}.pt")
        return metrics
