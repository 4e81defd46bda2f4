"""The NeRD network: a causal transformer over a history of (state, action) tokens.

This module is inference-safe: it imports torch, :mod:`slhub.data` (numpy) and
:func:`slhub.one_line` only (no trainer or checkpoint code), so
:mod:`slhub.export` can rebuild an exported model from it.

Everything needed to rebuild the network travels inside its state dict: the
architecture as the int64 buffer ``nerd_arch``, the robot's feature layout (names
of the state, action and extra input components, and which state components are
angles) as the uint8 buffer ``nerd_layout`` holding UTF-8 JSON, and the
normalization statistics as the float buffers ``input_mean``, ``input_std``,
``target_mean`` and ``target_std``. A checkpoint of either layout (v1 without a
recipe, v2 with one) can therefore be exported from its ``model`` entry alone.
Models made before layouts existed (``feature_set`` 1, the compiled-in cart-pole)
carry no ``nerd_layout`` and still load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from slhub import one_line
from slhub.builtin.nerd.base import RobotBase, base_from_dict
from slhub.builtin.nerd.contacts import ContactFrame, slot_columns
from slhub.builtin.nerd.frame import BaseFrame, frame_of
from slhub.builtin.nerd.planar_frame import PlanarFrame
from slhub.data import json_buffer, read_json_buffer, wrap_angle
from slhub.sim import cartpole

#: Version of the ``nerd_arch`` buffer layout; bump when a field is added (2 added
#: ``extra_dim``; version 1 buffers are read and written back unchanged).
ARCH_VERSION = 2
#: Buffer keys that identify a NeRD state dict.
ARCH_KEY = "nerd_arch"
LAYOUT_KEY = "nerd_layout"
STAT_KEYS = ("input_mean", "input_std", "target_mean", "target_std")
#: A body-frame model's statistics of gravity's direction in the base frame (its own
#: inputs after the token's): only its state dict has them.
GRAVITY_KEYS = ("gravity_mean", "gravity_std")
#: Frames a layout model learns in (:mod:`slhub.builtin.nerd.frame`).
FRAMES = ("world", "body")
#: ``feature_set`` of a model whose names travel in its ``nerd_layout`` buffer.
LAYOUT_FEATURE_SET = 0

#: Compiled-in feature sets of models made before layouts, by their ``nerd_arch`` code.
FEATURE_SETS: dict[int, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    1: ("cartpole", cartpole.STATE_NAMES, cartpole.ACTION_NAMES),
}

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The recipe/export spelling of a torch dtype (``torch.float32`` -> ``"float32"``)."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"unsupported NeRD dtype {dtype}; use one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class NerdArch:
    """Architecture hyper-parameters, stored in the model as the int64 buffer ``nerd_arch``.

    :param feature_set: 0: the names travel in the ``nerd_layout`` buffer; else the
        code of a compiled-in set in :data:`FEATURE_SETS` (1 = cartpole).
    :param state_dim: number of state features.
    :param action_dim: number of action features.
    :param extra_dim: number of extra input features (contacts, gravity): fed in every
        token after the action, never predicted.
    :param history: the longest history window (positions with a learned embedding).
    :param width: token embedding width.
    :param layers: number of transformer blocks.
    :param heads: attention heads per block.
    :param mlp_hidden: hidden width of each block's MLP.
    :param causal: 1 when position t attends to positions <= t only, 0 for full attention.
    :param normalize: 1 when inputs and targets were normalized with training-set statistics.
    :param angle_index: (compiled-in sets only) index of a state feature that is an
        angle (it is also fed as sin/cos and wrapped after each step), or -1 for none;
        a layout model names its angles in its layout and has -1 here.
    """

    feature_set: int = 1
    state_dim: int = 4
    action_dim: int = 1
    extra_dim: int = 0
    history: int = 10
    width: int = 64
    layers: int = 2
    heads: int = 4
    mlp_hidden: int = 256
    causal: int = 1
    normalize: int = 1
    angle_index: int = 1

    FIELDS = (
        "feature_set",
        "state_dim",
        "action_dim",
        "extra_dim",
        "history",
        "width",
        "layers",
        "heads",
        "mlp_hidden",
        "causal",
        "normalize",
        "angle_index",
    )
    #: ``nerd_arch`` version 1 had no ``extra_dim``.
    FIELDS_V1 = tuple(f for f in FIELDS if f != "extra_dim")

    version: int = field(default=ARCH_VERSION, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.feature_set == LAYOUT_FEATURE_SET:
            if self.angle_index != -1:
                raise ValueError("a NeRD layout model names its angles in its layout")
        elif self.feature_set not in FEATURE_SETS:
            raise ValueError(f"unknown NeRD feature set code {self.feature_set}")
        else:
            _, states, actions = FEATURE_SETS[self.feature_set]
            if (self.state_dim, self.action_dim, self.extra_dim) != (len(states), len(actions), 0):
                raise ValueError(
                    f"feature set {self.feature_set} has {len(states)} state and "
                    f"{len(actions)} action features, not {self.state_dim} and "
                    f"{self.action_dim}"
                )
        if self.state_dim < 1 or self.action_dim < 0 or self.extra_dim < 0:
            raise ValueError("NeRD needs at least one state feature")
        if self.version not in (1, ARCH_VERSION) or (self.version == 1 and self.extra_dim):
            raise ValueError(f"nerd_arch version {self.version} cannot hold this architecture")
        for name in ("history", "width", "layers", "heads", "mlp_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"NeRD {name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"NeRD width {self.width} is not divisible by heads {self.heads}")
        if self.causal not in (0, 1) or self.normalize not in (0, 1):
            raise ValueError("NeRD causal and normalize flags must be 0 or 1")
        if not -1 <= self.angle_index < self.state_dim:
            raise ValueError(f"NeRD angle_index {self.angle_index} is out of range")

    def _fields(self) -> tuple[str, ...]:
        return self.FIELDS if self.version == ARCH_VERSION else self.FIELDS_V1

    def to_tensor(self) -> torch.Tensor:
        values = [self.version] + [int(getattr(self, name)) for name in self._fields()]
        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> NerdArch:
        """Read ``nerd_arch`` back; raises ValueError for an unknown layout."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.dim() != 1:
            raise ValueError("nerd_arch must be a 1-D int64 tensor")
        values = [int(v) for v in tensor.tolist()]
        fields = {1: cls.FIELDS_V1, ARCH_VERSION: cls.FIELDS}.get(values[0] if values else -1)
        if fields is None or len(values) != 1 + len(fields):
            raise ValueError(
                f"nerd_arch has an unknown layout {values[:1]} (expected version 1 or "
                f"{ARCH_VERSION})"
            )
        return cls(**dict(zip(fields, values[1:], strict=True)), version=values[0])

    def to_dict(self) -> dict[str, int | bool]:
        out: dict[str, int | bool] = asdict(self)
        out.pop("version")
        out["causal"] = bool(self.causal)
        out["normalize"] = bool(self.normalize)
        return out


@dataclass(frozen=True)
class NerdLayout:
    """The robot a NeRD model simulates: the names of its state, action and extra input
    components (token order: state, action, extra), and which state components are
    angles (wrapped to [-pi, pi) after every step and in every error; also fed as
    sin/cos when ``angle_features``). It travels in the model as ``nerd_layout``.

    :param robot: free text naming the robot or dataset (``gymnasium:Hopper-v5``).
    :param base: the state components of the robot's floating base (a free joint or a
        planar base), if it has one.
    :param frame: ``body``: inputs and targets in the base frame of each step
        (:mod:`slhub.builtin.nerd.frame`); ``world``: every component as recorded.
        Written to ``nerd_layout`` only with a base, so a layout without one reads
        back as the world frame.
    :param contact_slots: the extra components that are contact slots
        (:mod:`slhub.builtin.nerd.contacts`), eight names each: point, normal, depth,
        active. A body-frame model turns them into each step's base frame. Written to
        ``nerd_layout`` only when there are some.
    """

    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    extra_names: tuple[str, ...] = ()
    angles: tuple[int, ...] = ()
    angle_features: bool = True
    robot: str = ""
    base: RobotBase | None = None
    frame: str = "world"
    contact_slots: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        for key in ("state_names", "action_names", "extra_names", "angles"):
            object.__setattr__(self, key, tuple(getattr(self, key)))
        object.__setattr__(self, "contact_slots", tuple(tuple(s) for s in self.contact_slots))
        for slot in self.contact_slots:
            if len(slot) != 8 or not set(slot) <= set(self.extra_names):
                raise ValueError(f"NeRD contact slot {list(slot)}: eight extra components")
        names = self.input_names
        if len(set(names)) != len(names):
            raise ValueError(f"NeRD feature names repeat: {list(names)}")
        if any(not 0 <= a < len(self.state_names) for a in self.angles):
            raise ValueError(f"NeRD angle indices {list(self.angles)} are out of range")
        if self.frame not in FRAMES:
            raise ValueError(f"NeRD frame {self.frame!r} is not one of {', '.join(FRAMES)}")
        if self.base is None:
            if self.frame != "world":
                raise ValueError("a body-frame NeRD layout needs its floating base")
            return
        self.base.indices(self.state_names)
        wrapped = (set(self.base.names) - set(self.base.angles)) & set(self.angle_names)
        if wrapped:
            raise ValueError(f"the floating base's components {sorted(wrapped)} are not angles")

    @classmethod
    def compiled(cls, arch: NerdArch) -> NerdLayout:
        """The layout of a model made before layouts (a compiled-in feature set)."""
        kind, states, actions = FEATURE_SETS[arch.feature_set]
        angles = (arch.angle_index,) if arch.angle_index >= 0 else ()
        return cls(states, actions, (), angles, bool(angles), kind)

    @classmethod
    def from_names(
        cls,
        state_names: Sequence[str],
        action_names: Sequence[str],
        extra_names: Sequence[str] = (),
        angles: Sequence[str] = (),
        angle_features: bool = True,
        robot: str = "",
        base: RobotBase | None = None,
        frame: str = "world",
        contact_slots: Sequence[Sequence[str]] = (),
    ) -> NerdLayout:
        """A layout whose ``angles`` are given by name (each a state component)."""
        missing = [a for a in angles if a not in state_names]
        if missing:
            raise ValueError(
                f"angle {missing[0]!r} is not a state component (the state has: "
                f"{', '.join(state_names)})"
            )
        indices = tuple(sorted(list(state_names).index(a) for a in angles))
        return cls(
            tuple(state_names), tuple(action_names), tuple(extra_names), indices,
            angle_features, robot, base, frame, tuple(tuple(s) for s in contact_slots),
        )  # fmt: skip

    @property
    def input_names(self) -> tuple[str, ...]:
        """Ordered features of one token: the state, the action, then extra inputs."""
        return self.state_names + self.action_names + self.extra_names

    @property
    def output_names(self) -> tuple[str, ...]:
        """Ordered features of a prediction: the next state."""
        return tuple(f"next_{name}" for name in self.state_names)

    @property
    def angle_names(self) -> tuple[str, ...]:
        return tuple(self.state_names[i] for i in self.angles)

    @property
    def body(self) -> bool:
        """Whether inputs and targets are in the base frame of each step."""
        return self.frame == "body"

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        out["angles"] = list(self.angle_names)
        out.pop("base")
        out.pop("frame")
        out.pop("contact_slots")
        if self.base is not None:
            out["base"] = self.base.to_dict()
            out["frame"] = self.frame
        if self.contact_slots:
            out["contact_slots"] = [list(slot) for slot in self.contact_slots]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> NerdLayout:
        try:
            base = data.get("base")
            return cls.from_names(
                [str(n) for n in data["state_names"]],  # type: ignore[union-attr]
                [str(n) for n in data["action_names"]],  # type: ignore[union-attr]
                [str(n) for n in data.get("extra_names", [])],  # type: ignore[union-attr]
                [str(n) for n in data.get("angles", [])],  # type: ignore[union-attr]
                bool(data.get("angle_features", True)),
                str(data.get("robot", "")),
                None if base is None else base_from_dict(base),  # type: ignore[arg-type]
                str(data.get("frame", "world")),
                [[str(n) for n in slot] for slot in data.get("contact_slots", [])],  # type: ignore[attr-defined]
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"nerd_layout is damaged ({one_line(exc)})") from None

    def to_tensor(self) -> torch.Tensor:
        return json_buffer(self.to_dict())

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> NerdLayout:
        """Read ``nerd_layout`` back; raises ValueError for a damaged buffer."""
        return cls.from_dict(read_json_buffer(tensor, "nerd_layout"))

    def check(self, arch: NerdArch) -> None:
        dims = (len(self.state_names), len(self.action_names), len(self.extra_names))
        if dims != (arch.state_dim, arch.action_dim, arch.extra_dim):
            raise ValueError(
                f"nerd_layout names {dims} state/action/extra features, nerd_arch "
                f"{(arch.state_dim, arch.action_dim, arch.extra_dim)}"
            )


class _Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, mlp_hidden: int, causal: bool) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln2(x))


class NerdModel(nn.Module):
    """Causal transformer predicting the normalized state change of every history position.

    A token is ``[state, action, extra]`` (``layout.input_names`` order). Position
    ``t`` predicts the change from state ``t`` to state ``t + 1`` under action ``t``;
    with ``causal`` it sees positions ``<= t`` only.
    """

    def __init__(self, arch: NerdArch, layout: NerdLayout | None = None) -> None:
        super().__init__()
        if layout is None:
            if arch.feature_set == LAYOUT_FEATURE_SET:
                raise ValueError("a NeRD layout model needs its NerdLayout")
            layout = NerdLayout.compiled(arch)
        layout.check(arch)
        self.arch = arch
        self.layout = layout
        features = arch.state_dim + arch.action_dim + arch.extra_dim
        self.register_buffer(ARCH_KEY, arch.to_tensor())
        if arch.feature_set == LAYOUT_FEATURE_SET:
            self.register_buffer(LAYOUT_KEY, layout.to_tensor())
        self.register_buffer("input_mean", torch.zeros(features))
        self.register_buffer("input_std", torch.ones(features))
        self.register_buffer("target_mean", torch.zeros(arch.state_dim))
        self.register_buffer("target_std", torch.ones(arch.state_dim))
        angles = torch.tensor(layout.angles, dtype=torch.int64)
        self.register_buffer("angle_columns", angles, persistent=False)
        mask = torch.zeros(arch.state_dim, dtype=torch.bool).index_fill_(0, angles, True)
        self.register_buffer("angle_mask", mask, persistent=False)
        sincos = 2 * len(layout.angles) if layout.angle_features else 0
        self.frame: BaseFrame | PlanarFrame | None = None
        if layout.body:
            assert layout.base is not None
            self.frame = frame_of(layout.base, layout.state_names)
        self.contacts: ContactFrame | None = None
        if self.frame is not None and layout.contact_slots:
            columns = slot_columns(layout.contact_slots, layout.input_names)
            self.contacts = ContactFrame(columns, features)
        gravity = self.frame.gravity_dim if self.frame is not None else 0
        if gravity:
            self.register_buffer(GRAVITY_KEYS[0], torch.zeros(gravity))
            self.register_buffer(GRAVITY_KEYS[1], torch.ones(gravity))
        self.embed = nn.Linear(features + sincos + gravity, arch.width)
        self.position = nn.Parameter(torch.randn(arch.history, arch.width) * 0.02)
        self.blocks = nn.ModuleList(
            _Block(arch.width, arch.heads, arch.mlp_hidden, bool(arch.causal))
            for _ in range(arch.layers)
        )
        self.norm = nn.LayerNorm(arch.width)
        self.head = nn.Sequential(
            nn.Linear(arch.width, arch.width), nn.GELU(), nn.Linear(arch.width, arch.state_dim)
        )

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> NerdModel:
        """Rebuild a model in its weights' dtype from a state dict that carries ``nerd_arch``.

        Raises ValueError when the state dict is not a complete NeRD state dict.
        """
        arch = NerdArch.from_tensor(state[ARCH_KEY])
        layout = None
        if arch.feature_set == LAYOUT_FEATURE_SET:
            if LAYOUT_KEY not in state:
                raise ValueError(f"NeRD weights of feature set 0 need a {LAYOUT_KEY} buffer")
            layout = NerdLayout.from_tensor(state[LAYOUT_KEY])
        floating = {t.dtype for t in state.values() if t.is_floating_point()}
        if len(floating) != 1:
            raise ValueError(
                f"NeRD weights must share one dtype, found {sorted(map(str, floating))}"
            )
        dtype = floating.pop()
        dtype_name(dtype)
        model = cls(arch, layout).to(dtype)
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"NeRD weights do not fit their nerd_arch: {one_line(exc)}") from None
        return model

    # ---------------------------------------------------------------- statistics

    def set_normalization(
        self,
        input_mean: torch.Tensor,
        input_std: torch.Tensor,
        target_mean: torch.Tensor,
        target_std: torch.Tensor,
        *gravity: torch.Tensor,
    ) -> None:
        """Store training-set statistics (cast to the buffers' dtype); identity when disabled.

        :param gravity: a body-frame model's gravity mean and std (in its base frame).
        """
        if not self.arch.normalize:
            return
        keys = STAT_KEYS + (GRAVITY_KEYS if gravity else ())
        values = (input_mean, input_std, target_mean, target_std, *gravity)
        for name, value in zip(keys, values, strict=True):
            buffer = getattr(self, name)
            buffer.copy_(value.to(device=buffer.device, dtype=buffer.dtype))

    def normalize_target(self, delta: torch.Tensor) -> torch.Tensor:
        """A raw state change (:func:`~slhub.builtin.nerd.data.tokens_of`'s, in the
        model's frame) in units of the training-set statistics."""
        return (delta - self.target_mean) / self.target_std

    # ---------------------------------------------------------------- network

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Normalized state change predicted at every position.

        A body-frame model converts the (world) tokens, their state and contact slots,
        into each step's base frame first, appends gravity's direction in it, and
        predicts the change in the base frame of the step it starts from
        (:mod:`slhub.builtin.nerd.frame`).

        :param tokens: ``[batch, length, state_dim + action_dim]`` with ``length <= history``.
        :returns: ``[batch, length, state_dim]``.
        """
        length = tokens.shape[1]
        gravity = None
        if self.frame is not None:
            if self.contacts is not None:
                tokens = self.contacts.to_body(tokens, *self.frame.pose(tokens))
            tokens, gravity = self.frame.inputs(tokens)
        x = (tokens - self.input_mean) / self.input_std
        if self.layout.angle_features and self.layout.angles:
            angle = tokens.index_select(-1, self.angle_columns)
            x = torch.cat([x, torch.sin(angle), torch.cos(angle)], dim=-1)
        if gravity is not None:
            x = torch.cat([x, (gravity - self.gravity_mean) / self.gravity_std], dim=-1)
        h = self.embed(x) + self.position[:length]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def predict_delta(self, tokens: torch.Tensor) -> torch.Tensor:
        """Raw change from the last state of ``tokens`` to the next: ``[batch, state_dim]``
        (in the last state's base frame for a body-frame model)."""
        normalized = self.forward(tokens)[:, -1]
        return normalized * self.target_std + self.target_mean

    def next_state(self, tokens: torch.Tensor) -> torch.Tensor:
        """The state after the last token: ``[batch, state_dim]`` (world coordinates,
        angles wrapped, a floating base's quaternion a unit one in the body frame)."""
        last = tokens[:, -1, : self.arch.state_dim]
        if self.frame is not None:
            return self.wrap(self.frame.to_world(last, self.predict_delta(tokens)))
        return self.wrap(last + self.predict_delta(tokens))

    def wrap(self, state: torch.Tensor) -> torch.Tensor:
        """``state`` (or a state difference) with its angle components wrapped."""
        if not self.layout.angles:
            return state
        return torch.where(self.angle_mask, wrap_angle(state), state)

    def rollout(self, tokens: torch.Tensor, future_actions: torch.Tensor) -> torch.Tensor:
        """Predict autoregressively, feeding predictions back as states.

        :param tokens: history ``[batch, length, features]``; the last token's action
            is applied to its state to give the first prediction.
        :param future_actions: ``[batch, K - 1, action_dim + extra_dim]`` (the action
            and extra inputs of each later token) applied to predictions 1 .. K - 1.
        :returns: the next ``K`` states ``[batch, K, state_dim]``; the window slides,
            keeping the last ``history`` tokens.
        """
        window = tokens[:, -self.arch.history :]
        states = [self.next_state(window)]
        for k in range(future_actions.shape[1]):
            window = self.advance(window, states[-1], future_actions[:, k])
            states.append(self.next_state(window))
        return torch.stack(states, dim=1)

    def advance(
        self, window: torch.Tensor, state: torch.Tensor, controls: torch.Tensor
    ) -> torch.Tensor:
        """``window`` with the token ``[state, controls]`` appended, keeping the last
        ``history`` tokens: the one way a rollout and an exported simulator slide, so
        that stepping one reproduces the other bit for bit.

        :param window: ``[batch, length, features]`` (``length`` may be 0).
        :param state: ``[batch, state_dim]``; ``controls``: ``[batch, action_dim + extra_dim]``.
        """
        token = torch.cat([state, controls], dim=-1).unsqueeze(1)
        return torch.cat([window, token], dim=1)[:, -self.arch.history :]
