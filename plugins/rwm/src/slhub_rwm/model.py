"""The world model: a GRU over (state, input) history that forecasts autoregressively.

Everything needed to rebuild and use the network travels in its state dict, so a
checkpoint's ``model`` entry is self-contained: the robot's layout and the GRU's
size as the uint8 buffer ``rwm_layout`` (UTF-8 JSON: state, action and extra
component names, which state components are angles, hidden size, layers and the
trained history and horizon), and the training split's normalization as the
buffers ``input_mean``, ``input_std``, ``delta_mean`` and ``delta_std``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import torch
from slhub import one_line
from slhub.data import json_buffer, read_json_buffer, wrap_angle
from torch import nn

#: The buffer holding the layout (and the mark of an RWM state dict).
LAYOUT_KEY = "rwm_layout"
STAT_KEYS = ("input_mean", "input_std", "delta_mean", "delta_std")
#: Version of ``rwm_layout``'s JSON; bump when a key is added.
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class RwmLayout:
    """The robot a world model simulates and the network's size.

    A step's input is the state (angles as sin and cos, every other component
    standardized), then the action and extra inputs (contacts, gravity; fed, never
    predicted), standardized. ``angles`` are indices into ``state_names``.
    """

    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    extra_names: tuple[str, ...] = ()
    angles: tuple[int, ...] = ()
    hidden: int = 64
    layers: int = 1
    history: int = 32
    horizon: int = 8
    robot: str = ""

    def __post_init__(self) -> None:
        for key in ("state_names", "action_names", "extra_names", "angles"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        names = self.state_names + self.action_names + self.extra_names
        if not self.state_names:
            raise ValueError("a world model needs at least one state component")
        if len(set(names)) != len(names):
            raise ValueError(f"RWM feature names repeat: {list(names)}")
        if any(not 0 <= a < len(self.state_names) for a in self.angles):
            raise ValueError(f"RWM angle indices {list(self.angles)} are out of range")
        for key in ("hidden", "layers", "history", "horizon"):
            if getattr(self, key) < 1:
                raise ValueError(f"RWM {key} must be >= 1, got {getattr(self, key)}")

    @classmethod
    def from_names(cls, angles: Sequence[str] = (), **fields: object) -> RwmLayout:
        """A layout whose ``angles`` are given by name (each a state component)."""
        states = tuple(fields["state_names"])  # type: ignore[arg-type]
        missing = [a for a in angles if a not in states]
        if missing:
            raise ValueError(
                f"angle {missing[0]!r} is not a state component (the state has: "
                f"{', '.join(states)})"
            )
        return cls(angles=tuple(sorted(states.index(a) for a in angles)), **fields)  # type: ignore[arg-type]

    @property
    def state_dim(self) -> int:
        return len(self.state_names)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The raw components of one step, in the order the model's buffers hold them."""
        return self.state_names + self.action_names + self.extra_names

    @property
    def feature_dim(self) -> int:
        """Width of the GRU's input: every raw component, plus a cosine per angle."""
        return len(self.input_names) + len(self.angles)

    @property
    def angle_names(self) -> tuple[str, ...]:
        return tuple(self.state_names[i] for i in self.angles)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"version": LAYOUT_VERSION, **asdict(self)}
        out["angles"] = list(self.angle_names)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RwmLayout:
        if data.get("version") != LAYOUT_VERSION:
            raise ValueError(f"rwm_layout has version {data.get('version')!r}, not 1")
        try:
            return cls.from_names(
                [str(a) for a in data["angles"]],  # type: ignore[union-attr]
                state_names=tuple(str(n) for n in data["state_names"]),  # type: ignore[union-attr]
                action_names=tuple(str(n) for n in data["action_names"]),  # type: ignore[union-attr]
                extra_names=tuple(str(n) for n in data["extra_names"]),  # type: ignore[union-attr]
                **{k: int(data[k]) for k in ("hidden", "layers", "history", "horizon")},  # type: ignore[call-overload]
                robot=str(data["robot"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"rwm_layout is damaged ({one_line(exc)})") from None

    def to_tensor(self) -> torch.Tensor:
        return json_buffer(self.to_dict())

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> RwmLayout:
        """Read ``rwm_layout`` back; raises ValueError for a damaged buffer."""
        return cls.from_dict(read_json_buffer(tensor, "rwm_layout"))


class WorldModel(nn.Module):
    """Predicts the next normalized state change from a GRU summary of the history.

    The head's output is the state change standardized with the training split's
    state-change statistics (angle changes wrapped); a predicted state has its
    angles wrapped before it is fed back.
    """

    def __init__(self, layout: RwmLayout) -> None:
        super().__init__()
        self.layout = layout
        raw = len(layout.input_names)
        self.register_buffer(LAYOUT_KEY, layout.to_tensor())
        self.register_buffer("input_mean", torch.zeros(raw))
        self.register_buffer("input_std", torch.ones(raw))
        self.register_buffer("delta_mean", torch.zeros(layout.state_dim))
        self.register_buffer("delta_std", torch.ones(layout.state_dim))
        columns = torch.tensor(layout.angles, dtype=torch.int64)
        mask = torch.zeros(layout.state_dim, dtype=torch.bool)
        mask[columns] = True
        self.register_buffer("angle_columns", columns, persistent=False)
        self.register_buffer("angle_mask", mask, persistent=False)
        self.gru = nn.GRU(
            layout.feature_dim, layout.hidden, num_layers=layout.layers, batch_first=True
        )
        self.head = nn.Linear(layout.hidden, layout.state_dim)
        self.register_load_state_dict_pre_hook(_adopt_saved_layout)

    @classmethod
    def from_state_dict(cls, state: Mapping[str, torch.Tensor]) -> WorldModel:
        """The model a state dict holds, rebuilt from its ``rwm_layout`` alone."""
        model = cls(RwmLayout.from_tensor(state[LAYOUT_KEY]))
        dtype = state["input_mean"].dtype
        model.to(dtype).load_state_dict(dict(state))
        return model

    def set_normalization(
        self,
        input_mean: torch.Tensor,
        input_std: torch.Tensor,
        delta_mean: torch.Tensor,
        delta_std: torch.Tensor,
    ) -> None:
        """Store training-split statistics (cast to the buffers' dtype); an angle's own
        mean and std are never used (it is fed as sin and cos), so they stay 0 and 1."""
        values = (input_mean.clone(), input_std.clone(), delta_mean, delta_std)
        if self.layout.angles:
            values[0][list(self.layout.angles)] = 0.0
            values[1][list(self.layout.angles)] = 1.0
        for name, value in zip(STAT_KEYS, values, strict=True):
            buffer = getattr(self, name)
            buffer.copy_(value.to(device=buffer.device, dtype=buffer.dtype))

    def features(self, states: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """GRU inputs of steps ``[B, T, S]`` / ``[B, T, U]``: standardized components,
        each angle replaced by its sine with its cosine appended."""
        raw = torch.cat([states, inputs], dim=-1)
        x = (raw - self.input_mean) / self.input_std
        if not self.layout.angles:
            return x
        angle = states.index_select(-1, self.angle_columns)
        x = x.index_copy(-1, self.angle_columns, torch.sin(angle))
        return torch.cat([x, torch.cos(angle)], dim=-1)

    def wrap(self, state: torch.Tensor) -> torch.Tensor:
        """``state`` (or a state difference) with its angle components wrapped."""
        if not self.layout.angles:
            return state
        return torch.where(self.angle_mask, wrap_angle(state), state)

    def advance(self, state: torch.Tensor, normalized_delta: torch.Tensor) -> torch.Tensor:
        """Apply a predicted normalized change to a state, wrapping its angles."""
        return self.wrap(state + normalized_delta * self.delta_std + self.delta_mean)

    def forward(self, states: torch.Tensor, inputs: torch.Tensor, horizon: int) -> torch.Tensor:
        """Forecast ``horizon`` states after a history.

        :param states: ``[B, H + horizon, S]``; only the first ``H`` (the history) are read.
        :param inputs: ``[B, H + horizon - 1, U]``: the true actions (and extra inputs)
            of the whole window.
        :returns: predicted states ``[B, horizon, S]`` for ``states[:, H:]``. After the
            first step the model's own prediction is fed back with the true input.
        """
        history = states.shape[1] - horizon
        out, hidden = self.gru(self.features(states[:, :history], inputs[:, :history]))
        pred = self.advance(states[:, history - 1], self.head(out[:, -1]))
        preds = [pred]
        for k in range(1, horizon):
            step_in = self.features(pred[:, None], inputs[:, history + k - 1 : history + k])
            out, hidden = self.gru(step_in, hidden)
            pred = self.advance(pred, self.head(out[:, -1]))
            preds.append(pred)
        return torch.stack(preds, dim=1)

    def normalized_error(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Prediction error in units of the state-change standard deviation (angles wrapped)."""
        return self.wrap(pred - target) / self.delta_std

    def relative_error(self, pred: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
        """RWM's Σ|ŝ − s| and Σ|s| in float64 (angle differences wrapped), to be divided
        after summing over every window."""
        err = self.wrap(pred.double() - target.double()).abs().sum()
        return float(err), float(target.double().abs().sum())


def _adopt_saved_layout(model: WorldModel, state_dict, prefix, *args) -> None:
    """Before a :class:`WorldModel` loads its state (a public load_state_dict pre-hook):
    take a saved ``rwm_layout`` that differs from the model's only in ``robot`` (the
    name of the dataset's folder, e.g. ``slhub eval --env``'s fresh episodes), whose
    length may differ; any other difference is refused as a mismatch, as before."""
    saved = state_dict.get(prefix + LAYOUT_KEY)
    mine = getattr(model, LAYOUT_KEY)
    if isinstance(saved, torch.Tensor) and saved.shape != mine.shape:
        try:
            layout = RwmLayout.from_tensor(saved)
        except ValueError:
            layout = None
        if layout is not None and replace(layout, robot=model.layout.robot) == model.layout:
            setattr(model, LAYOUT_KEY, torch.empty_like(saved, device=mine.device))
            model.layout = layout
