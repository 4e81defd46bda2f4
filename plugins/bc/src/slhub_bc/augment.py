"""Image augmentation of visual BC: a random crop at train, the centre crop otherwise,
and optional brightness/contrast jitter (robomimic's CropRandomizer, diffusion_policy's
crop, torchvision's ColorJitter).

The work is split so that results never depend on where frames are decoded:

- :func:`draw` (called in ``sample``) draws every random number, from the trainer's
  per-rank generator only, right after the batch's windows are served: per camera,
  the crop corners ``image[i]_crop`` ``[B, 2]`` (top, left), then the factors
  ``image[i]_jitter`` ``[B, 2]`` (brightness, contrast). The generator is checkpointed,
  so a resume draws the same; decode threads never draw.
- :func:`crop` and :func:`jitter` (in the policy's ``forward``) are pure functions of the
  frames and those numbers. Without them in the batch (validation, rollouts, an export)
  the policy takes the centre crop and no jitter, so evaluation is deterministic and
  always sees frames of the size it was trained on.

One corner and one pair of factors per window and camera, shared by its history
frames: the encoder stacks the frames as channels and reads motion from their
differences, which per-frame crops would blur.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from slhub import RecipeError

from slhub_bc.sections import ColorJitterSection

CROP_SUFFIX = "_crop"
JITTER_SUFFIX = "_jitter"
#: ITU-R 601 luma weights, as torchvision's rgb_to_grayscale.
LUMA = (0.299, 0.587, 0.114)


def crop_sizes(
    crop: int | float | None, shapes: Sequence[tuple[int, int, int]]
) -> list[tuple[int, int]]:
    """The cropped ``(h, w)`` of each camera ``(H, W, C)``: the whole frame without a
    crop, ``crop x crop`` pixels, or ``round(crop * side)`` of each side.

    :raises RecipeError: a crop larger than a camera's frame.
    """
    out = []
    for index, (h, w, _) in enumerate(shapes):
        if crop is None:
            size = (int(h), int(w))
        elif isinstance(crop, float):
            size = (max(1, round(crop * h)), max(1, round(crop * w)))
        else:
            size = (int(crop), int(crop))
        if size[0] > h or size[1] > w:
            raise RecipeError(
                f"bc.crop {crop}: larger than camera image[{index}]'s {h} x {w} frames"
            )
        out.append(size)
    return out


def draw(
    generator: torch.Generator,
    count: int,
    roles: Sequence[str],
    shapes: Sequence[tuple[int, int, int]],
    sizes: Sequence[tuple[int, int]],
    color: ColorJitterSection | None,
) -> dict[str, torch.Tensor]:
    """The random numbers of ``count`` windows' augmentation, drawn from ``generator``
    only, in a fixed order (camera by camera: corner rows, corner columns, factors)."""
    out: dict[str, torch.Tensor] = {}
    for role, (h, w, _), (ch, cw) in zip(roles, shapes, sizes, strict=True):
        if (ch, cw) != (h, w):
            top = torch.randint(0, h - ch + 1, (count,), generator=generator)
            left = torch.randint(0, w - cw + 1, (count,), generator=generator)
            out[role + CROP_SUFFIX] = torch.stack([top, left], dim=1)
        if color is not None and (color.brightness or color.contrast):
            unit = torch.rand((count, 2), generator=generator, dtype=torch.float64)
            spread = torch.tensor([color.brightness, color.contrast], dtype=torch.float64)
            out[role + JITTER_SUFFIX] = 1.0 + (2.0 * unit - 1.0) * spread
    return out


def crop(frames: torch.Tensor, size: tuple[int, int], corners: torch.Tensor | None) -> torch.Tensor:
    """``frames [B, K, H, W, C]`` cut to ``size`` at ``corners [B, 2]`` (top, left), or at
    the centre when ``corners`` is None."""
    b, _, h, w, _ = frames.shape
    ch, cw = size
    if corners is None:
        top, left = (h - ch) // 2, (w - cw) // 2
        return frames[:, :, top : top + ch, left : left + cw]
    corners = corners.to(frames.device)
    rows = corners[:, :1] + torch.arange(ch, device=frames.device)  # [B, ch]
    cols = corners[:, 1:] + torch.arange(cw, device=frames.device)  # [B, cw]
    batch = torch.arange(b, device=frames.device)[:, None, None]
    picked = frames[batch, :, rows[:, :, None], cols[:, None, :]]  # [B, ch, cw, K, C]
    return picked.permute(0, 3, 1, 2, 4)


def jitter(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``images [B, K, H, W, C]`` in [0, 1] with brightness then contrast ``factors
    [B, 2]`` applied as torchvision does (a blend with black, then with the frame's mean
    grey level, each clamped to [0, 1])."""
    factors = factors.to(images.device, images.dtype)
    brightness = factors[:, 0].view(-1, 1, 1, 1, 1)
    contrast = factors[:, 1].view(-1, 1, 1, 1, 1)
    images = (images * brightness).clamp(0.0, 1.0)
    if images.shape[-1] == 3:
        luma = torch.tensor(LUMA, dtype=images.dtype, device=images.device)
        grey = (images * luma).sum(-1, keepdim=True)
    else:
        grey = images.mean(-1, keepdim=True)
    mean = grey.mean(dim=(2, 3, 4), keepdim=True)
    return (contrast * images + (1.0 - contrast) * mean).clamp(0.0, 1.0)
