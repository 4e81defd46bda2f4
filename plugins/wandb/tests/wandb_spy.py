"""An extra plugin for the torchrun test: each rank records, when the run ends, whether
the wandb library was ever imported in its process (the plugin imports it only to
start a W&B run), in ``$WANDB_SPY_DIR/rank<R>.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slhub import Trainer, hookimpl


class WandbSpy:
    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        record = {"status": status, "wandb_imported": "wandb" in sys.modules}
        path = Path(os.environ["WANDB_SPY_DIR"]) / f"rank{trainer.rank}.json"
        path.write_text(json.dumps(record))
