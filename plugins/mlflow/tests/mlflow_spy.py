"""An extra plugin for the torchrun test: each rank records, when the run ends, whether
the mlflow library was ever imported in its process (the plugin imports it only on
rank 0, to reach the server), in ``$MLFLOW_SPY_DIR/rank<R>.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slhub import Trainer, hookimpl


class MlflowSpy:
    @hookimpl
    def on_fit_end(self, trainer: Trainer, status: str) -> None:
        record = {"status": status, "mlflow_imported": "mlflow" in sys.modules}
        path = Path(os.environ["MLFLOW_SPY_DIR"]) / f"rank{trainer.rank}.json"
        path.write_text(json.dumps(record))
