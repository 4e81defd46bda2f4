"""``slhub inspect``: what a checkpoint is and what it holds, for people."""

from __future__ import annotations

from typing import Any

import torch

from slhub import checkpoint


def _count(state: dict[str, Any]) -> tuple[int, int]:
    tensors = [v for v in state.values() if isinstance(v, torch.Tensor)]
    return len(tensors), sum(t.numel() for t in tensors)


def _dist(plugin: dict[str, Any]) -> str:
    if not plugin.get("dist"):
        return "no distribution"
    return f"dist {plugin['dist']} {plugin.get('version')}"


def describe(path: str) -> str:
    """A short multi-line description of a v1 or v2 checkpoint."""
    ckpt = checkpoint.load_checkpoint(path)
    version = checkpoint.version_of(ckpt)
    n_tensors, n_values = _count(ckpt["model"])
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in ckpt["model"].values()})
    opt_state = ckpt["optimizer"].get("state", {}) if isinstance(ckpt["optimizer"], dict) else {}
    lines = [
        f"checkpoint: {path}",
        f"format:     {ckpt.get('format', 'v1 (single-device layout, no format key)')}",
        f"step:       {ckpt['step']}",
        f"model:      {n_tensors} tensors, {n_values} values ({', '.join(dtypes)})",
        f"optimizer:  state for {len(opt_state)} parameters",
    ]
    if version == 2:
        run = ckpt["run"]
        plugin = run.get("source", {}).get("plugin", {})
        ranks = ckpt["ranks"]
        keys = sorted({k for entry in ranks for k in entry})
        lines += [
            f"run:        {run.get('run_id')} (created {run.get('created')})",
            f"world size: {run.get('world_size')}",
            f"plugin:     {plugin.get('name')} ({plugin.get('object')}, {_dist(plugin)})",
            f"ranks:      {len(ranks)} entries holding {', '.join(keys) or 'nothing'}",
            f"scheduler:  {'yes' if ckpt['scheduler'] is not None else 'none'}",
        ]
    else:
        lines += [
            "run:        none (v1 resumes only into a fresh output directory)",
            "world size: 1",
        ]
    return "\n".join(lines)
