"""Imported once by the warm server of tests/warm_processes.py (never by a test).

Importing modules is only part of a fresh process's first run: torch, pydantic
and slhub also initialize lazily on first use (operators, optimizers, model
validators, plugin modules). One tiny single-process run here does all of that
once, so every forked worker starts where a long-running process would be.
"""

import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import slhub  # noqa: E402
import slhub.cli  # noqa: E402

slhub.cli.build_parser()  # imports every command's module

_RECIPE = Path(__file__).resolve().parents[1] / "examples" / "sl_ddp" / "cpu.yaml"

with tempfile.TemporaryDirectory(prefix="slhub-warmup-") as _folder:
    slhub.train(
        _RECIPE,
        [f"trainer.output_dir={_folder}/run", "trainer.steps=4", "trainer.validate_every=2"],
        log_format="json",
    )
