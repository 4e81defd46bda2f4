"""A rollout's frames as an mp4 file (PyAV), e.g. ``slhub eval --video FILE.mp4``.

H.264 in yuv420p, which every player decodes; frames with an odd side are padded by
one pixel (the chroma planes need even sides). The file is written under a temporary
name and renamed into place, so a reader never sees half a video.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from slhub.errors import SimulatorError


def write_video(path: str | Path, frames: np.ndarray, fps: float) -> Path:
    """Write ``frames`` (``[T, H, W, 3]`` uint8) to ``path`` at ``fps`` frames a second.

    :raises SimulatorError: PyAV is missing, or the frames are not RGB uint8.
    """
    try:
        import av
    except ImportError:
        raise SimulatorError(
            "writing a video needs av (PyAV), which is not installed: pip install av"
        ) from None
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise SimulatorError(
            f"a video takes frames [T, H, W, 3] uint8, got {list(frames.shape)} {frames.dtype}"
        )
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial.mp4")
    rate = Fraction(float(fps)).limit_denominator(1000)
    try:
        with av.open(str(partial), mode="w") as container:
            stream = container.add_stream("h264", rate=rate)
            stream.width, stream.height = int(frames.shape[2]), int(frames.shape[1])
            stream.pix_fmt = "yuv420p"
            for frame in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path
