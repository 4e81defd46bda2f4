"""A checkpoint written out for inference by a plugin's ``export`` hook: what
``slhub export --checkpoint CKPT --out DIR [--plugin NAME] [--onnx]`` runs.

The exporter is chosen among installed plugins, never by the file: a v2
checkpoint records the name of the model plugin that wrote it, and only an
installed entry point of that name is asked. A checkpoint written by a
``package.module:object`` plugin is exported only when the user names that
plugin with ``--plugin`` (a name on the command line is the user's choice; a
name inside a file is not). A v1 checkpoint records no plugin and is offered to
every installed plugin. Every user error is a one-line
:class:`~slhub.errors.SlhubError` (the CLI exits 2).

A checkpoint of a run with an ``ema`` recipe section is exported with its moving
average as the model's weights: the exporter receives the checkpoint with ``model``
holding :attr:`~slhub.checkpoint.Checkpoint.evaluation_weights` (the weights the run
validated and picked ``best.pt`` by), and ``export.json`` then records
``averaged_weights: {updates: N, ema: SECTION}`` so a reader knows which weights
it holds.

With ``--onnx`` the export just written is loaded (:func:`slhub.export.load`) and
its predictor's ``write_onnx(directory)`` adds ``model.onnx`` and records it in
``export.json``; a kind whose predictor has no such method is refused, and a missing
``onnx`` extra is refused before the checkpoint is read.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from slhub import checkpoint, log, registry
from slhub.atomic import atomic_write
from slhub.errors import (
    ArtifactError,
    CheckpointError,
    ExportError,
    PluginError,
    SlhubError,
    one_line,
)
from slhub.export import load, manifest_json, read_manifest, require_onnx
from slhub.paths import path_errors, user_path


@dataclass(frozen=True)
class Exported:
    """Where an export went and which plugin wrote it."""

    path: Path
    plugin: registry.PluginSource


def _refuse_unusable(out_dir: Path) -> None:
    """Raise unless ``out_dir`` is absent or an empty directory (one line also when the
    OS refuses the name itself: too long, a symlink loop)."""
    with path_errors(out_dir, ArtifactError, "cannot use export destination"):
        if out_dir.exists() or out_dir.is_symlink():
            if not out_dir.is_dir():
                raise ArtifactError(f"export destination {out_dir} exists and is not a directory")
            if any(out_dir.iterdir()):
                raise ArtifactError(
                    f"export destination {out_dir} is not empty; exports go into a new or empty "
                    "directory and never overwrite files"
                )


def _claim_out_dir(out_dir: Path) -> bool:
    """Make sure ``out_dir`` is an empty directory; returns True when it was created here."""
    _refuse_unusable(out_dir)
    if out_dir.is_dir():
        return False
    try:
        out_dir.mkdir(parents=True)
    except OSError as exc:
        raise ArtifactError(
            f"cannot create export destination {out_dir}: {exc.strerror or exc}"
        ) from None
    return True


def _exported_dir(result: object, source: registry.PluginSource) -> Path:
    """The directory an export hook returned, which must hold the export it wrote
    (at least the ``export.json`` manifest the export contract asks for)."""
    hook = f"the export hook of {source.describe()}"
    if not isinstance(result, (str, os.PathLike)) or isinstance(result, bytes):
        raise PluginError(
            f"{hook} returned {type(result).__name__} {_short(result)}; it must return the "
            "export directory (a path) or None"
        )
    path = Path(result)
    with path_errors(path, PluginError, f"{hook} returned an unusable path"):
        if not path.is_dir():
            raise PluginError(f"{hook} returned {path}, which is not a directory")
        if not any(path.iterdir()):
            raise PluginError(f"{hook} returned {path} but wrote nothing there: nothing exported")
        if not (path / "export.json").is_file():
            raise PluginError(
                f"{hook} returned {path} but wrote no export.json there (an export holds "
                "export.json with its format and kind)"
            )
    return path


def _record_ema_weights(exported: Exported, ckpt: checkpoint.Checkpoint) -> None:
    """Add to the exporter's ``export.json`` that its weights are the moving average, how
    many updates it holds and the recipe's ``ema`` section (export.json stays last)."""
    manifest_path = exported.path / "export.json"
    hook = f"the export hook of {exported.plugin.describe()}"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PluginError(f"{hook} wrote an unreadable {manifest_path} ({one_line(exc)})") from None
    if not isinstance(manifest, dict):
        raise PluginError(f"{hook} wrote {manifest_path} holding no JSON object")
    assert ckpt.ema is not None
    # its own key: an exporter's "weights" names its weights file (NeRD's, BC's, RWM's)
    manifest["averaged_weights"] = {"updates": ckpt.ema.step, "ema": ckpt.recipe.get("ema")}
    atomic_write(manifest_json(manifest), manifest_path)


def _write_onnx(exported: Exported) -> None:
    """Add the ONNX form to the export just written, through its own loader."""
    predictor = load(exported.path)
    writer = getattr(predictor, "write_onnx", None)
    if not callable(writer):
        kind = read_manifest(exported.path).get("kind")
        raise ExportError(
            f"exports of kind {kind!r} (by {exported.plugin.describe()}) have no ONNX form; "
            "export without --onnx"
        )
    writer(exported.path)


def _empty(directory: Path) -> None:
    """Remove everything inside ``directory`` (an export destination that was empty)."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def choose_exporter(ckpt: checkpoint.Checkpoint, path: Path, plugin: str | None) -> str | None:
    """The plugin name to export with; None means every installed plugin (v1 only).

    Reads only a name from the checkpoint and accepts it only when an installed
    entry point has that name: nothing recorded in a file is ever imported.
    """
    if plugin is not None:
        return plugin
    recorded = ckpt.plugins
    if not recorded:
        return None
    name = str(recorded[0].get("name"))
    if name in registry.installed_names():
        return name
    raise PluginError(
        f"{path} was written by plugin {name!r}, which is not an installed entry point; "
        f"slhub never imports code a checkpoint names: pass --plugin {name} to use it"
    )


def run_export(
    checkpoint_path: str | Path,
    out_dir: str | Path,
    plugin: str | None = None,
    onnx: bool = False,
) -> Exported:
    """Export ``checkpoint_path`` into the new or empty directory ``out_dir``.

    :param plugin: the plugin to export with (entry-point name or
        ``package.module:object``); default: the installed plugin the
        checkpoint names.
    :param onnx: also write the export's ONNX form (``model.onnx``).
    :raises ExportError: ``onnx`` is asked and the ``onnx`` extra is missing, or the
        export has no ONNX form, or its exporter refuses (a bfloat16 NeRD model).
    :raises ArtifactError: ``out_dir`` is not empty, not a directory or cannot be made.
    :raises CheckpointError: the checkpoint is missing or damaged, or no plugin
        recognizes it.
    :raises PluginError: the checkpoint's plugin is not installed, or ``plugin``
        does not load, or its export hook fails (a plain exception is logged with
        its traceback first), returns no path, or writes no ``export.json`` there.
        An ``out_dir`` created here is removed again on any failure, and one that
        was empty is emptied again.
    """
    checkpoint_path = user_path(checkpoint_path, "checkpoint", CheckpointError)
    out_dir = user_path(out_dir, "export destination", ArtifactError)
    _refuse_unusable(out_dir)  # before the (possibly slow) checkpoint load
    if onnx:
        require_onnx()
    ckpt = checkpoint.load(checkpoint_path)
    pm, candidates = registry.export_manager(choose_exporter(ckpt, checkpoint_path, plugin))
    created = _claim_out_dir(out_dir)
    judged = replace(ckpt, model=ckpt.evaluation_weights)  # the EMA weights where averaged
    try:
        for source in candidates:
            others = [p for name, p in pm.list_name_plugin() if name != source.name]
            ask = pm.subset_hook_caller("export", remove_plugins=others)
            try:
                result = ask(checkpoint=judged, checkpoint_path=checkpoint_path, out_dir=out_dir)
            except SlhubError:
                raise
            except (Exception, SystemExit) as exc:  # a plugin bug: its traceback, one line
                log.failure("export failed", exc)
                raise PluginError(
                    f"{source.describe()} failed in its export hook: {one_line(exc)}"
                ) from None
            if result is not None:
                exported = Exported(_exported_dir(result, source), source)
                if ckpt.ema is not None:
                    _record_ema_weights(exported, ckpt)
                if onnx:
                    _write_onnx(exported)
                return exported
    except BaseException:
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        elif onnx:  # it was empty: what is there now is this export's
            _empty(out_dir)
        raise
    if created:
        shutil.rmtree(out_dir, ignore_errors=True)
    asked = ", ".join(s.name for s in candidates) or "none installed"
    why = [reason for s in candidates if (reason := registry.not_a_plugin(pm, s)) is not None]
    raise CheckpointError(
        f"{checkpoint_path} is not a checkpoint any plugin asked can export (asked: {asked})"
        + "".join(f"; {reason}" for reason in why)
    )
