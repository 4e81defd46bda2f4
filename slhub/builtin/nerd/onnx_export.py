"""A NeRD export's ONNX form: ``model.onnx`` beside ``model.safetensors``.

The graph is the predictor's call: input ``tokens`` ``[batch, length, features]``
(``export.json``'s ``input_names`` on the last axis), output ``next_state``
``[batch, state_dim]`` with the angles wrapped, normalization inside (and, for a
body-frame model, the conversions into the base's frame and back to world
coordinates, :mod:`slhub.builtin.nerd.frame`, in plain ONNX arithmetic). Batch is
dynamic, and so is the history length of a causal model (1..history; a
non-causal one takes exactly ``history`` tokens). A runtime with no slhub steps
it by feeding the last ``history`` tokens, as :class:`NerdSimulator` does.

ONNX runtimes fuse and reorder float arithmetic (LayerNorm, GELU, attention),
so their outputs equal the torch export's within float32 rounding, not bit for
bit; before the file is written its predictions are checked against the torch
model's with onnxruntime, which catches an exporter that got the graph wrong
(a difference of the order of the outputs, not of their rounding). Only
float32 weights are written: onnxruntime's CPU kernels do not run this graph in
float64 (Erf, Gelu) or bfloat16, and casting would give outputs that differ
from the torch export by more than rounding.

Needs the ``onnx`` extra; torch writes the graph with its ``torch.export``-based
exporter (onnxscript).
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from slhub import ExportError, atomic_write, one_line
from slhub.builtin.nerd.export_names import EXPORT_FORMAT, KIND, MANIFEST
from slhub.builtin.nerd.model import NerdModel, dtype_name
from slhub.export import manifest_json, read_manifest, require_onnx

ONNX_FILE = "model.onnx"
INPUT = "tokens"
OUTPUT = "next_state"
#: The export-time check: an exporter that got the graph wrong is off by about the
#: outputs' size; float32 rounding in a fused runtime is some 1e-7 of it.
CHECK_TOLERANCE = 1e-3


class _NextState(nn.Module):
    """The predictor's call as a module with one tensor in and one out."""

    def __init__(self, model: NerdModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.next_state(tokens)


def write_onnx(model: NerdModel, directory: Path) -> dict[str, Any]:
    """Write ``model.onnx`` for ``model`` into its export ``directory``; record it there.

    ``model.onnx`` is written atomically, then ``export.json`` is rewritten
    atomically with an ``onnx`` entry (file, opset, input and output shapes, the
    history lengths it takes), so a manifest that names the file has a whole file
    beside it; ``model.onnx`` is removed again when the manifest cannot be written.

    :returns: the updated manifest.
    :raises slhub.ExportError: the ``onnx`` extra is missing, ``directory`` holds
        another model's export, the weights are not float32, torch cannot write the
        graph, or onnxruntime predicts differently.
    """
    require_onnx()
    manifest = read_manifest(directory)
    arch, layout = model.arch, model.layout
    if (
        manifest.get("kind") != KIND
        or manifest.get("input_names") != list(layout.input_names)
        or manifest.get("architecture") != arch.to_dict()
    ):
        raise ExportError(
            f"{directory} holds another export than this NeRD model's; write its ONNX form "
            "into the directory it was loaded from"
        )
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ExportError(
            f"ONNX export needs float32 weights; this NeRD model is {dtype_name(dtype)} "
            "(onnxruntime does not run its graph in that dtype): train with "
            "model.precision: float32, or use the safetensors export"
        )
    model = model.eval()
    graph = _export(_NextState(model), arch.history, bool(arch.causal), len(layout.input_names))
    _set_metadata(graph, model)
    data = graph.SerializeToString()
    _check_with_onnxruntime(data, model)
    lengths = [1, arch.history] if arch.causal else [arch.history, arch.history]
    manifest["onnx"] = {
        "file": ONNX_FILE,
        "opset": next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": {INPUT: ["batch", "length", len(layout.input_names)]},
        "outputs": {OUTPUT: ["batch", len(layout.state_names)]},
        "length": lengths,
        "dtype": "float32",
        "exporter": f"torch {torch.__version__}",
    }
    atomic_write(data, directory / ONNX_FILE)
    try:
        atomic_write(manifest_json(manifest), directory / MANIFEST)
    except BaseException:
        (directory / ONNX_FILE).unlink(missing_ok=True)
        raise
    return manifest


def _export(module: nn.Module, history: int, causal: bool, features: int) -> Any:
    """The ONNX ``ModelProto`` of ``module``, batch (and a causal model's length) dynamic."""
    example = torch.zeros(2, history, features)
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
    if causal and history > 1:
        dims[1] = torch.export.Dim("length", min=1, max=history)
    try:
        with _quiet():
            program = torch.onnx.export(
                module,
                (example,),
                dynamo=True,
                input_names=[INPUT],
                output_names=[OUTPUT],
                dynamic_shapes={"tokens": dims},
                optimize=True,
                external_data=False,
                verbose=False,
            )
    except Exception as exc:  # noqa: BLE001 - the exporter raises many unrelated types
        raise ExportError(
            f"torch {torch.__version__} could not write this NeRD model as ONNX ({one_line(exc)})"
        ) from None
    return program.model_proto


def _set_metadata(graph: Any, model: NerdModel) -> None:
    """Name the token layout inside the file too, so a runtime without export.json
    knows the order of the last input axis."""
    layout = model.layout
    entries = {
        "slhub_export": f"{EXPORT_FORMAT} {KIND}",
        "input_names": json.dumps(list(layout.input_names)),
        "output_names": json.dumps(list(layout.output_names)),
        "history": str(model.arch.history),
        "layout": json.dumps(layout.to_dict(), sort_keys=True),
    }
    for key, value in entries.items():
        prop = graph.metadata_props.add()
        prop.key, prop.value = key, value


def _check_with_onnxruntime(data: bytes, model: NerdModel) -> None:
    """Raise ExportError unless onnxruntime predicts what ``model`` does on probe
    tokens at the training data's scale, for the shortest and the longest history."""
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    arch = model.arch
    features = arch.state_dim + arch.action_dim + arch.extra_dim
    generator = torch.Generator().manual_seed(0)
    lengths = sorted({1, arch.history}) if arch.causal else [arch.history]
    for length in lengths:
        noise = torch.randn(3, length, features, generator=generator)
        tokens = (model.input_mean + model.input_std * noise).float()
        with torch.no_grad():
            expected = model.next_state(tokens).numpy()
        (found,) = session.run([OUTPUT], {INPUT: tokens.numpy()})
        worst = float(np.max(np.abs(found - expected)))
        scale = 1.0 + float(np.max(np.abs(expected)))
        if not worst <= CHECK_TOLERANCE * scale:
            raise ExportError(
                f"the ONNX graph torch {torch.__version__} wrote predicts differently from "
                f"the torch model (largest difference {worst:.3g} at history length "
                f"{length}); model.onnx not written"
            )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporter's warnings and log lines (optional torchvision ops, deprecations)
    off the user's console; an export that fails still raises."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
