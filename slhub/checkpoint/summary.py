"""A short description of a checkpoint for people, which ``slhub inspect CKPT`` prints.

It reads the checkpoint through :class:`slhub.checkpoint.Checkpoint` and the
metrics history beside it; the recipe digest it prints is the one run.json
records (``recipe_digest``), so the two can be compared by eye or by grep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slhub import checkpoint
from slhub.artifacts import METRICS_FILE, read_metrics
from slhub.checkpoint.resume import describe_source
from slhub.errors import SlhubError


def describe(path: str | Path) -> str:
    """``slhub inspect``: a short multi-line description of a v1 or v2 checkpoint."""
    ckpt = checkpoint.load(path)
    model = ckpt.model
    n_values = sum(t.numel() for t in model.values())
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in model.values()})
    opt_state = ckpt.optimizer.get("state", {})
    lines = [
        f"checkpoint: {path}",
        f"format:     {ckpt.format if ckpt.version == 2 else 'v1 (single-device layout)'}",
        f"step:       {ckpt.step}",
        f"model:      {len(model)} tensors, {n_values} values ({', '.join(dtypes)})",
        f"optimizer:  state for {len(opt_state) if isinstance(opt_state, dict) else 0} parameters",
    ]
    run = ckpt.run
    if run is None:
        return "\n".join(
            lines
            + ["run:        none (v1 resumes only into a fresh output directory)", "world size: 1"]
        )
    ranks = ckpt.ranks
    keys = sorted({str(k) for entry in ranks for k in entry})
    plugins = ckpt.plugins
    lines += [
        f"run:        {run.get('run_id')} (created {run.get('created')})",
        f"world size: {run.get('world_size')}",
        f"plugin:     {describe_source(plugins[0] if plugins else None)}",
    ]
    lines += [f"plugins:    {describe_source(extra)}" for extra in plugins[1:]]
    recipe = ckpt.recipe
    lines += [
        f"recipe:     sha256 {ckpt.recipe_digest} ({len(recipe)} sections)",
        f"ranks:      {len(ranks)} entries holding {', '.join(keys) or 'nothing'}",
        f"optim:      {_section(recipe, 'optim')}{_lr(ckpt.optimizer)}",
        f"schedule:   {_section(recipe, 'schedule')}{_schedule_state(ckpt.schedule)}",
        f"best:       {_best(ckpt)}",
    ]
    if ckpt.ema is not None:  # only a run with an ema section: other output stays as it was
        lines.append(f"ema:        {_ema(ckpt)}")
    return "\n".join(lines + _last_metrics(Path(path).parent / METRICS_FILE, ckpt.step))


def _best(ckpt: checkpoint.Checkpoint) -> str:
    """Which update the run's best validation was at, as far as this checkpoint knows."""
    best = (ckpt.recipe.get("trainer") or {}).get("best")
    if not isinstance(best, dict):
        return "not kept (trainer.best is not set)"
    retention = ckpt.retention
    if retention.best_step is None:
        return f"no validation yet ({best.get('metric')}, {best.get('mode')})"
    return (
        f"update {retention.best_step} ({best.get('metric')} = "
        f"{_metric_value(retention.best_value)}, {best.get('mode')}; {checkpoint.BEST})"
    )


def _ema(ckpt: checkpoint.Checkpoint) -> str:
    """The recorded ``ema`` section (the keys its schedule reads) and the updates averaged."""
    assert ckpt.ema is not None
    section = ckpt.recipe.get("ema")
    shown = "not recorded"
    if isinstance(section, dict):
        from slhub.recipe import EMA_POWER_KEYS

        keys = [k for k, v in section.items() if v is not None]
        if section.get("decay") is not None:
            keys = [k for k in keys if k not in EMA_POWER_KEYS]
        shown = " ".join(f"{k}={section[k]}" for k in keys)
    return f"{shown}; {ckpt.ema.step} updates averaged ({len(ckpt.ema.weights)} tensors)"


def _last_metrics(path: Path, step: int) -> list[str]:
    """The last training and validation lines at or before ``step`` of the run
    directory's metrics history (the checkpoint's own numbers, not later ones)."""
    try:
        records = [r for r in read_metrics(path) if isinstance(r.get("step"), int)]
    except (OSError, SlhubError) as exc:
        return [f"metrics:    unreadable ({exc})"]
    records = [r for r in records if r["step"] <= step]
    if not records:
        return [f"metrics:    none at or before update {step} in {path}"]
    out = []
    for prefix in ("train/", "validation/"):
        line = next((r for r in reversed(records) if any(k.startswith(prefix) for k in r)), None)
        if line is not None:
            values = " ".join(
                f"{k.removeprefix(prefix)}={_metric_value(v)}"
                for k, v in line.items()
                if k.startswith(prefix) and v is not None
            )
            out.append(f"{prefix[:-1] + ':':<11} update {line['step']}: {values}")
    return out


def _metric_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _section(recipe: dict[str, Any], name: str) -> str:
    """``name key=value ...`` of a recorded optim or schedule section: the keys its
    optimizer or schedule reads, None values left out."""
    section = recipe.get(name)
    if not isinstance(section, dict):
        return "not recorded"
    from slhub.optim import applicable

    shown = applicable(name, section)
    rest = " ".join(f"{k}={v}" for k, v in shown.items() if k != "name" and v is not None)
    return f"{section.get('name', '?')} {rest}".strip()


def _lr(optimizer: dict[str, Any]) -> str:
    groups = optimizer.get("param_groups")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        lr = groups[0].get("lr")
        if isinstance(lr, torch.Tensor) and lr.numel() == 1:
            lr = lr.item()
        if isinstance(lr, (int, float)) and not isinstance(lr, bool):
            return f"; lr for the next update {lr:.4g}"
    return ""


def _schedule_state(schedule: Any) -> str:
    if isinstance(schedule, dict) and "last_epoch" in schedule:
        return f"; stepped {schedule['last_epoch']} times"
    return "; no schedule state (a constant rate)"
