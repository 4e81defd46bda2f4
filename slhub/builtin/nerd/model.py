"""The NeRD network: a causal transformer over a history of (state, action) tokens.

This module is inference-safe: it imports torch, :mod:`slhub.data` (numpy) and
:func:`slhub.one_line` only (no trainer or checkpoint code), so
:mod:`slhub.export` can rebuild an exported model from it.

Everything needed to rebuild the network travels inside its state dict: the
architecture as the int64 buffer ``nerd_arch`` and the normalization statistics
as the float buffers ``input_mean``, ``input_std``, ``target_mean`` and
``target_std``. A checkpoint of either layout (v1 without a recipe, v2 with one)
can therefore be exported from its ``model`` entry alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from slhub import one_line
from slhub.data import ACTION_NAMES, STATE_NAMES, wrap_angle

#: Version of the ``nerd_arch`` buffer layout; bump when a field is added.
ARCH_VERSION = 1
#: Buffer keys that identify a NeRD state dict.
ARCH_KEY = "nerd_arch"
STAT_KEYS = ("input_mean", "input_std", "target_mean", "target_std")

#: Feature sets a NeRD model can be trained on, by the code stored in ``nerd_arch``.
FEATURE_SETS: dict[int, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    1: ("cartpole", STATE_NAMES, ACTION_NAMES),
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

    :param feature_set: code of the feature names in :data:`FEATURE_SETS` (1 = cartpole).
    :param state_dim: number of state features.
    :param action_dim: number of action features.
    :param history: the longest history window (positions with a learned embedding).
    :param width: token embedding width.
    :param layers: number of transformer blocks.
    :param heads: attention heads per block.
    :param mlp_hidden: hidden width of each block's MLP.
    :param causal: 1 when position t attends to positions <= t only, 0 for full attention.
    :param normalize: 1 when inputs and targets were normalized with training-set statistics.
    :param angle_index: index of a state feature that is an angle (it is also fed as
        sin/cos and wrapped after each step), or -1 for none.
    """

    feature_set: int = 1
    state_dim: int = 4
    action_dim: int = 1
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
        "history",
        "width",
        "layers",
        "heads",
        "mlp_hidden",
        "causal",
        "normalize",
        "angle_index",
    )

    def __post_init__(self) -> None:
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(f"unknown NeRD feature set code {self.feature_set}")
        _, states, actions = FEATURE_SETS[self.feature_set]
        if (self.state_dim, self.action_dim) != (len(states), len(actions)):
            raise ValueError(
                f"feature set {self.feature_set} has {len(states)} state and {len(actions)} "
                f"action features, not {self.state_dim} and {self.action_dim}"
            )
        for name in ("history", "width", "layers", "heads", "mlp_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"NeRD {name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"NeRD width {self.width} is not divisible by heads {self.heads}")
        if self.causal not in (0, 1) or self.normalize not in (0, 1):
            raise ValueError("NeRD causal and normalize flags must be 0 or 1")
        if not -1 <= self.angle_index < self.state_dim:
            raise ValueError(f"NeRD angle_index {self.angle_index} is out of range")

    def to_tensor(self) -> torch.Tensor:
        values = [ARCH_VERSION] + [int(getattr(self, name)) for name in self.FIELDS]
        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> NerdArch:
        """Read ``nerd_arch`` back; raises ValueError for an unknown layout."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64 or tensor.dim() != 1:
            raise ValueError("nerd_arch must be a 1-D int64 tensor")
        values = [int(v) for v in tensor.tolist()]
        if not values or values[0] != ARCH_VERSION or len(values) != 1 + len(cls.FIELDS):
            raise ValueError(f"nerd_arch has an unknown layout {values[:1]} (expected version 1)")
        return cls(**dict(zip(cls.FIELDS, values[1:], strict=True)))

    def to_dict(self) -> dict[str, int | bool]:
        out: dict[str, int | bool] = asdict(self)
        out["causal"] = bool(self.causal)
        out["normalize"] = bool(self.normalize)
        return out

    @property
    def kind(self) -> str:
        return FEATURE_SETS[self.feature_set][0]

    @property
    def state_names(self) -> tuple[str, ...]:
        return FEATURE_SETS[self.feature_set][1]

    @property
    def action_names(self) -> tuple[str, ...]:
        return FEATURE_SETS[self.feature_set][2]

    @property
    def input_names(self) -> tuple[str, ...]:
        """Ordered features of one token: the state, then the action."""
        return self.state_names + self.action_names

    @property
    def output_names(self) -> tuple[str, ...]:
        """Ordered features of a prediction: the next state."""
        return tuple(f"next_{name}" for name in self.state_names)


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

    A token is ``[state, action]`` (``arch.input_names`` order). Position ``t``
    predicts the change from state ``t`` to state ``t + 1`` under action ``t``;
    with ``causal`` it sees positions ``<= t`` only.
    """

    def __init__(self, arch: NerdArch) -> None:
        super().__init__()
        self.arch = arch
        features = arch.state_dim + arch.action_dim
        self.register_buffer(ARCH_KEY, arch.to_tensor())
        self.register_buffer("input_mean", torch.zeros(features))
        self.register_buffer("input_std", torch.ones(features))
        self.register_buffer("target_mean", torch.zeros(arch.state_dim))
        self.register_buffer("target_std", torch.ones(arch.state_dim))
        extra = 2 if arch.angle_index >= 0 else 0
        self.embed = nn.Linear(features + extra, arch.width)
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
        floating = {t.dtype for t in state.values() if t.is_floating_point()}
        if len(floating) != 1:
            raise ValueError(
                f"NeRD weights must share one dtype, found {sorted(map(str, floating))}"
            )
        dtype = floating.pop()
        dtype_name(dtype)
        model = cls(arch).to(dtype)
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
    ) -> None:
        """Store training-set statistics (cast to the buffers' dtype); identity when disabled."""
        if not self.arch.normalize:
            return
        for name, value in zip(
            STAT_KEYS, (input_mean, input_std, target_mean, target_std), strict=True
        ):
            buffer = getattr(self, name)
            buffer.copy_(value.to(device=buffer.device, dtype=buffer.dtype))

    def normalize_target(self, delta: torch.Tensor) -> torch.Tensor:
        """A raw state change in units of the training-set statistics."""
        return (delta - self.target_mean) / self.target_std

    # ---------------------------------------------------------------- network

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Normalized state change predicted at every position.

        :param tokens: ``[batch, length, state_dim + action_dim]`` with ``length <= history``.
        :returns: ``[batch, length, state_dim]``.
        """
        length = tokens.shape[1]
        x = (tokens - self.input_mean) / self.input_std
        index = self.arch.angle_index
        if index >= 0:
            angle = tokens[..., index : index + 1]
            x = torch.cat([x, torch.sin(angle), torch.cos(angle)], dim=-1)
        h = self.embed(x) + self.position[:length]
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def predict_delta(self, tokens: torch.Tensor) -> torch.Tensor:
        """Raw change from the last state of ``tokens`` to the next: ``[batch, state_dim]``."""
        normalized = self.forward(tokens)[:, -1]
        return normalized * self.target_std + self.target_mean

    def next_state(self, tokens: torch.Tensor) -> torch.Tensor:
        """The state after the last token: ``[batch, state_dim]`` (angle wrapped)."""
        state = tokens[:, -1, : self.arch.state_dim] + self.predict_delta(tokens)
        index = self.arch.angle_index
        if index >= 0:
            state = torch.cat(
                [state[:, :index], wrap_angle(state[:, index : index + 1]), state[:, index + 1 :]],
                dim=-1,
            )
        return state

    def rollout(self, tokens: torch.Tensor, future_actions: torch.Tensor) -> torch.Tensor:
        """Predict autoregressively, feeding predictions back as states.

        :param tokens: history ``[batch, length, state_dim + action_dim]``; the last
            token's action is applied to its state to give the first prediction.
        :param future_actions: ``[batch, K - 1, action_dim]`` applied to predictions
            1 .. K - 1.
        :returns: the next ``K`` states ``[batch, K, state_dim]``; the window slides,
            keeping the last ``history`` tokens.
        """
        history = self.arch.history
        window = tokens[:, -history:]
        states = [self.next_state(window)]
        for k in range(future_actions.shape[1]):
            token = torch.cat([states[-1], future_actions[:, k]], dim=-1).unsqueeze(1)
            window = torch.cat([window, token], dim=1)[:, -history:]
            states.append(self.next_state(window))
        return torch.stack(states, dim=1)
