"""The NeRD predictor runtime: its export directory (``model.safetensors`` +
``export.json``), written and loaded.

Inference-safe (torch, safetensors and the json standard library only): an
export needs no training code, recipe or checkpoint to be used, and holds no
pickle.

``model.safetensors`` is the model's state dict in the trained dtype (weights,
the ``nerd_arch`` buffer and the normalization buffers). It depends on the
weights only, so the same weights saved as a v1 or a v2 checkpoint export to
byte-identical files; provenance (run id, step, checkpoint digest) lives in
``export.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import nn

from slhub import ExportError, atomic_write, one_line
from slhub.builtin.nerd.base import FREE
from slhub.builtin.nerd.export_names import EXPORT_FORMAT, KIND, MANIFEST, WEIGHTS
from slhub.builtin.nerd.model import ARCH_KEY, STAT_KEYS, NerdArch, NerdModel, dtype_name
from slhub.export import export_file, manifest_json


def write_export(model: NerdModel, out_dir: Path, provenance: dict[str, Any]) -> Path:
    """Write ``model`` into the empty directory ``out_dir``.

    Each file is written atomically (:func:`slhub.atomic_write`) and
    ``export.json`` last, so a directory holding it holds a whole export. The
    weights are removed again when the manifest cannot be written.

    :param model: the model to export, in its trained dtype.
    :param out_dir: an existing, empty directory.
    :param provenance: ``source_run_id``, ``step``, ``checkpoint_sha256``,
        ``checkpoint_format`` and ``checkpoint_path`` of the source checkpoint.
    :returns: ``out_dir``.
    """
    arch, layout = model.arch, model.layout
    dtype = dtype_name(next(model.parameters()).dtype)
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}
    manifest = {
        "format": EXPORT_FORMAT,
        "kind": KIND,
        "dtype": dtype,
        "architecture": arch.to_dict(),
        "layout": layout.to_dict(),
        "input_names": list(layout.input_names),
        "state_names": list(layout.state_names),
        "action_names": list(layout.action_names),
        "extra_names": list(layout.extra_names),
        "output_names": list(layout.output_names),
        "output": "next state; the angle components are wrapped to [-pi, pi)"
        + (
            "; world coordinates, learned in the floating base's frame"
            + (" (its quaternion a unit one)" if layout.base.kind == FREE else "")
            if layout.body and layout.base is not None
            else ""
        ),
        "normalization": {
            "enabled": bool(arch.normalize),
            **{key: [float(v) for v in tensors[key].double().tolist()] for key in STAT_KEYS},
        },
        "weights": WEIGHTS,
        **provenance,
    }
    # one metadata key only: safetensors writes a multi-key header map in hash order,
    # which would make identical weights export to different bytes
    data = save(tensors, metadata={"slhub_export": f"{EXPORT_FORMAT} {KIND}"})
    atomic_write(data, out_dir / WEIGHTS)
    try:
        atomic_write(manifest_json(manifest), out_dir / MANIFEST)
    except BaseException:
        (out_dir / WEIGHTS).unlink(missing_ok=True)
        raise
    return out_dir


class NerdPredictor(nn.Module):
    """An exported NeRD model, ready for inference and for use in place of a simulator.

    A token is one step ``[state, action, extra inputs]``, its last axis ordered as
    :attr:`input_names`; a state is ordered as :attr:`state_names`, an action (with
    the extra inputs after it) as :attr:`action_names` + :attr:`extra_names`.
    Every call that takes tokens names their order with ``input_names=`` and is
    checked against the export: a different order, feature count, dtype or an
    over-long history raises ValueError instead of predicting from misread
    inputs. Inputs are never cast implicitly; normalization happens inside.

    >>> predictor = slhub.export.load("exports/nerd_cartpole")
    >>> predictor.input_names
    ('x', 'theta', 'x_dot', 'theta_dot', 'force')
    >>> sim = predictor.simulator(past_tokens, state, input_names=predictor.input_names)
    >>> next_state = sim.step(action)                                          # [B, 4]
    >>> next_state = predictor.step(past_tokens, state, action, input_names=...)  # stateless
    >>> next_state = predictor(tokens, input_names=predictor.input_names)   # [B, 4]
    >>> states = predictor.rollout(tokens, future_actions, input_names=...)  # [B, K, 4]
    """

    def __init__(self, model: NerdModel, manifest: dict[str, Any]) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.manifest = manifest
        arch, layout = model.arch, model.layout
        self.layout = layout
        self.input_names: tuple[str, ...] = layout.input_names
        self.state_names: tuple[str, ...] = layout.state_names
        self.action_names: tuple[str, ...] = layout.action_names
        self.extra_names: tuple[str, ...] = layout.extra_names
        self.output_names: tuple[str, ...] = layout.output_names
        self.history: int = arch.history
        self.causal: bool = bool(arch.causal)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def architecture(self) -> NerdArch:
        return self.model.arch

    def _check_names(self, input_names: Sequence[str]) -> None:
        names = tuple(input_names)
        if names != self.input_names:
            if sorted(names) == sorted(self.input_names):
                problem = "are in the wrong order"
            else:
                problem = "do not match"
            raise ValueError(
                f"input features {list(names)} {problem}: this NeRD export expects "
                f"{list(self.input_names)} (state, action, extra inputs) on the last axis"
            )

    def _check(self, tokens: torch.Tensor, input_names: Sequence[str]) -> None:
        self._check_names(input_names)
        if not isinstance(tokens, torch.Tensor):
            raise ValueError(f"inputs must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dtype != self.dtype:
            raise ValueError(
                f"inputs have dtype {tokens.dtype} but this NeRD export was trained in "
                f"{self.dtype}; convert explicitly with .to({self.dtype})"
            )
        if tokens.dim() != 3 or tokens.shape[-1] != len(self.input_names):
            raise ValueError(
                f"inputs must have shape [batch, length, {len(self.input_names)}], "
                f"got {list(tokens.shape)}"
            )
        length = tokens.shape[1]
        if self.causal and not 1 <= length <= self.history:
            raise ValueError(f"history length must be 1..{self.history}, got {length}")
        if not self.causal and length != self.history:
            raise ValueError(
                f"this non-causal NeRD export needs exactly {self.history} history steps, "
                f"got {length}"
            )

    def forward(self, tokens: torch.Tensor, *, input_names: Sequence[str]) -> torch.Tensor:
        """Predict the next state ``[batch, state_dim]`` from history tokens.

        :param tokens: ``[batch, length, features]`` in the dtype of the export.
        :param input_names: the order of the last axis; must equal :attr:`input_names`.
        """
        self._check(tokens, input_names)
        with torch.no_grad():
            return self.model.next_state(tokens)

    predict = forward

    def rollout(
        self,
        tokens: torch.Tensor,
        future_actions: torch.Tensor,
        *,
        input_names: Sequence[str],
    ) -> torch.Tensor:
        """Roll out ``K = future_actions.shape[1] + 1`` states autoregressively.

        The first predicted state follows the last history token (state and
        action); each further state follows the previous prediction under the
        next of ``future_actions`` ``[batch, K - 1, action_dim]``.

        :returns: ``[batch, K, state_dim]``.
        """
        self._check(tokens, input_names)
        if (
            not isinstance(future_actions, torch.Tensor)
            or future_actions.dim() != 3
            or future_actions.shape[0] != tokens.shape[0]
            or future_actions.shape[-1] != len(self.action_names) + len(self.extra_names)
        ):
            inputs = self.action_names + self.extra_names
            raise ValueError(
                f"future_actions must have shape [{tokens.shape[0]}, K - 1, "
                f"{len(inputs)}] ({list(inputs)})"
            )
        if future_actions.dtype != self.dtype:
            raise ValueError(
                f"future_actions have dtype {future_actions.dtype} but this NeRD export was "
                f"trained in {self.dtype}; convert explicitly with .to({self.dtype})"
            )
        if not self.causal and future_actions.shape[1] and tokens.shape[1] != self.history:
            raise ValueError(f"a non-causal rollout needs exactly {self.history} history steps")
        with torch.no_grad():
            return self.model.rollout(tokens, future_actions)

    def step(
        self,
        history: torch.Tensor,
        state: torch.Tensor,
        action: torch.Tensor,
        *,
        input_names: Sequence[str],
    ) -> torch.Tensor:
        """The state after applying ``action`` in ``state``: a simulator's step, stateless.

        :param history: the tokens of the steps before ``state``, ``[batch, L, features]``
            oldest first; only the last ``history - 1`` are used, and ``L`` may be 0 for
            a causal model (a non-causal one needs at least ``history - 1``).
        :param state: the current state ``[batch, state_dim]``.
        :param action: the action and extra inputs applied in it ``[batch, action_dim +
            extra_dim]``.
        :param input_names: the order of the tokens' last axis; must equal
            :attr:`input_names`.
        :returns: the next state ``[batch, state_dim]``, its angles wrapped.
        """
        self._check_step(history, state, action, input_names)
        with torch.no_grad():
            return self.model.next_state(self.model.advance(history, state, action))

    def simulator(
        self,
        history: torch.Tensor,
        state: torch.Tensor,
        *,
        input_names: Sequence[str],
        contacts: Contacts | None = None,
    ) -> NerdSimulator:
        """A stateful stand-in for a simulator, started in ``state`` after ``history``.

        Its :meth:`NerdSimulator.step` takes an action, returns the next state and
        remembers the last :attr:`history` tokens, so ``state = sim.step(action)``
        replaces the simulator's step in a control loop. Stepping it along an
        episode's recorded actions reproduces :meth:`rollout` (and the validation
        rollouts of the trained run) bit for bit, for the same batch of episodes.

        :param history: tokens of the steps before ``state`` (as for :meth:`step`).
        :param state: the state to start in ``[batch, state_dim]``.
        :param contacts: computes the extra inputs of a state, as a simulator would:
            ``contacts(state, previous_action)`` -> ``[batch, extra_dim]``
            (``previous_action`` None at the start), e.g.
            ``slhub.sim.contacts.StateContacts(env, ...).tensor``; with it,
            :meth:`NerdSimulator.step` takes the action alone.
        """
        self._check_step(history, state, None, input_names)
        kept = history[:, max(history.shape[1] - (self.history - 1), 0) :]
        return NerdSimulator(self, kept, state, contacts)

    def write_onnx(self, directory: str | Path) -> Path:
        """Write ``model.onnx`` into this export's directory and record it in export.json.

        The graph maps tokens ``[batch, length, features]`` to the next state, like
        calling the predictor; see :mod:`slhub.builtin.nerd.onnx_export`. Needs the
        ``onnx`` extra (``pip install 'slhub[onnx]'``).

        :raises slhub.ExportError: the extra is missing or the model cannot be written
            as ONNX (weights other than float32).
        """
        from slhub.builtin.nerd.onnx_export import write_onnx

        self.manifest = write_onnx(self.model, Path(directory))
        return Path(directory) / self.manifest["onnx"]["file"]

    def _check_step(
        self,
        history: torch.Tensor,
        state: torch.Tensor,
        action: torch.Tensor | None,
        input_names: Sequence[str],
    ) -> None:
        """Raise ValueError unless the arguments of :meth:`step` fit this export."""
        self._check_names(input_names)
        controls = self.action_names + self.extra_names
        parts = [("state", state, self.state_names), ("history", history, self.input_names)]
        if action is not None:
            parts.append(("action", action, controls))
        for name, tensor, names in parts:
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dtype != self.dtype:
                raise ValueError(
                    f"{name} has dtype {tensor.dtype} but this NeRD export was trained in "
                    f"{self.dtype}; convert explicitly with .to({self.dtype})"
                )
            dims = 3 if name == "history" else 2
            if tensor.dim() != dims or tensor.shape[-1] != len(names):
                shape = "[batch, L, " if dims == 3 else "[batch, "
                raise ValueError(
                    f"{name} must have shape {shape}{len(names)}] ({list(names)}), got "
                    f"{list(tensor.shape)}"
                )
            if tensor.shape[0] != state.shape[0]:
                raise ValueError(
                    f"{name} holds {tensor.shape[0]} batch rows, the state {state.shape[0]}"
                )
        if not self.causal and history.shape[1] < self.history - 1:
            raise ValueError(
                f"this non-causal NeRD export needs at least {self.history - 1} history "
                f"tokens before the state, got {history.shape[1]}"
            )


#: Computes a state's extra inputs: ``contacts(state, previous_action) -> extra``.
Contacts = Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]


class NerdSimulator:
    """A NeRD export used as a simulator: ``next_state = sim.step(action)``.

    Made by :meth:`NerdPredictor.simulator`. It keeps the current :attr:`state` and
    :attr:`tokens`, the last ``history`` completed steps (oldest first), and slides
    them exactly as :meth:`NerdModel.rollout` does, so its states equal a rollout's.
    """

    def __init__(
        self,
        predictor: NerdPredictor,
        tokens: torch.Tensor,
        state: torch.Tensor,
        contacts: Contacts | None = None,
    ) -> None:
        self.predictor = predictor
        self.tokens = tokens
        self.state = state
        self.contacts = contacts
        self.previous: torch.Tensor | None = None

    def step(self, action: torch.Tensor) -> torch.Tensor:
        """Apply ``action`` (``[batch, action_dim + extra_dim]``, the extra inputs after
        the action; the action alone when the simulator computes its contacts) in the
        current state and return the next state ``[batch, state_dim]``.
        """
        predictor = self.predictor
        if self.contacts is not None:
            extra = self.contacts(self.state, self.previous)
            self.previous = action
            action = torch.cat([action, extra.to(action.dtype)], dim=-1)
        predictor._check_step(self.tokens, self.state, action, predictor.input_names)
        with torch.no_grad():
            self.tokens = predictor.model.advance(self.tokens, self.state, action)
            self.state = predictor.model.next_state(self.tokens)
        return self.state


def load_export(directory: Path, manifest: dict[str, Any]) -> NerdPredictor:
    """Rebuild the predictor of a NeRD export.

    The manifest's ``weights`` must name a regular file inside ``directory``
    (:func:`slhub.export.export_file`: no ``..``, no absolute path, no symlink out of
    it, no FIFO), and the weights must fit the architecture their ``nerd_arch``
    buffer describes, which is checked on shapes alone before any memory is given to
    the model (a damaged buffer could ask for terabytes).

    :raises slhub.ExportError: (a ``ValueError``) for a weights path outside the
        export, and for missing, unreadable, damaged or inconsistent weights.
    """
    weights = export_file(Path(directory), manifest.get("weights", WEIGHTS))
    try:
        state = load_file(str(weights))
    except Exception as exc:  # noqa: BLE001 - safetensors' errors share no base class
        raise ExportError(f"{weights} cannot be read ({one_line(exc)})") from None
    if ARCH_KEY not in state:
        raise ExportError(f"{weights} holds no {ARCH_KEY} buffer; it is not a NeRD export")
    try:
        _check_shapes(state)
        model = NerdModel.from_state_dict(state)
    except ValueError as exc:  # the model's own one-line messages
        raise ExportError(f"{weights}: {exc}") from None
    except (RuntimeError, MemoryError) as exc:  # what shapes alone could not foresee
        raise ExportError(f"{weights}: damaged NeRD weights ({one_line(exc)})") from None
    arch = model.arch
    expected = {
        "dtype": dtype_name(next(model.parameters()).dtype),
        "architecture": arch.to_dict(),
        "input_names": list(model.layout.input_names),
        "output_names": list(model.layout.output_names),
    }
    for key, value in expected.items():
        if manifest.get(key) != value:
            raise ExportError(
                f"{directory / MANIFEST} says {key}={manifest.get(key)!r} but "
                f"{weights.name} holds {value!r}"
            )
    return NerdPredictor(model, manifest)


def _check_shapes(state: dict[str, torch.Tensor]) -> None:
    """Raise ValueError unless every size the ``nerd_arch`` buffer gives (history,
    width, layers, MLP width, features) is the size of the tensors that hold it, so the
    model built from it is no larger than the weights read (a damaged buffer could
    otherwise ask for terabytes). The rest is checked when the weights are loaded."""
    arch = NerdArch.from_tensor(state[ARCH_KEY])
    features = arch.state_dim + arch.action_dim + arch.extra_dim
    wanted = {
        "position": [arch.history, arch.width],
        "input_mean": [features],
        "target_mean": [arch.state_dim],
        f"blocks.{arch.layers - 1}.mlp.0.weight": [arch.mlp_hidden, arch.width],
    }
    for key, shape in wanted.items():
        found = list(state[key].shape) if key in state else None
        if found != shape:
            raise ValueError(
                f"NeRD weights do not fit their nerd_arch: {key} has shape "
                f"{found if found is not None else 'none (absent)'}, the architecture "
                f"needs {shape}"
            )
    if f"blocks.{arch.layers}.mlp.0.weight" in state:
        raise ValueError(f"NeRD weights do not fit their nerd_arch: more than {arch.layers} layers")
