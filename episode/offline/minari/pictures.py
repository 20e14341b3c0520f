"""Image observations as Minari stores them, one compressed picture per
row: decoded (PNG or JPEG, checked against the leaf's shape) and encoded
(PNG, which reads back exactly)."""
from __future__ import annotations

import io
import os
from typing import List, Sequence

import numpy as np

from episode.offline.minari.libraries import _pil_image
from episode.offline.minari.rows import _Damaged
from episode.offline.minari.spaces import _Leaf


def _decode_images(items: Sequence, leaf: _Leaf, rows: int, what: str) -> np.ndarray:
    """Rows of pictures (PNG, as to_minari writes them, or JPEG, as Minari
    does) as one uint8 array of the leaf's shape. Long runs are decoded by
    two threads (pillow decodes without the GIL)."""
    Image = _pil_image()
    if len(items) != rows:
        raise _Damaged(f"{what} has {len(items)} pictures, not {rows}")
    out = np.empty((rows,) + leaf.shape, np.uint8)
    size = (leaf.shape[1], leaf.shape[0])

    def decode(start: int, stop: int) -> None:
        for i in range(start, stop):
            try:
                with Image.open(io.BytesIO(items[i]), formats=("PNG", "JPEG")) as img:
                    # The header names the size: nothing is decoded unless it fits.
                    if img.size != size:
                        raise _Damaged(f"{what}: picture {i} is {img.size[0]}x{img.size[1]}, "
                                       f"not {size[0]}x{size[1]}")
                    pixels = np.asarray(img)
            except _Damaged:
                raise
            except Exception as exc:     # pillow raises many kinds for damaged pictures
                raise _Damaged(f"{what}: picture {i} does not decode ({exc})") from None
            if pixels.dtype != np.uint8 or pixels.size != out[i].size:
                raise _Damaged(f"{what}: picture {i} decodes to {pixels.shape} "
                               f"{pixels.dtype}, not {leaf.shape} uint8")
            out[i] = pixels.reshape(leaf.shape)

    if rows < _THREADED_PICTURES or _picture_pool() is None:
        decode(0, rows)
        return out
    half = rows // 2
    other = _picture_pool().submit(decode, half, rows)
    try:
        decode(0, half)
    finally:
        other.result()
    return out


_THREADED_PICTURES = 16
_POOL: dict = {}


def _picture_pool():
    """One helper thread for decoding pictures beside the caller (None on a
    single core). One per process: a forked child has the pool object but
    not its thread."""
    pid = os.getpid()
    if pid not in _POOL:
        from concurrent.futures import ThreadPoolExecutor
        _POOL.clear()
        _POOL[pid] = (ThreadPoolExecutor(1, thread_name_prefix="episode-pictures")
                      if (os.cpu_count() or 1) > 1 else None)
    return _POOL[pid]


def _encode_images(arr: np.ndarray) -> List[bytes]:
    """Each frame as a PNG picture (a one-channel frame as a grey one)."""
    Image = _pil_image()
    out = []
    for frame in arr:
        if frame.ndim == 3 and frame.shape[2] == 1:
            frame = frame[:, :, 0]
        try:
            img = Image.fromarray(frame)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"pictures of shape {frame.shape} have no PNG form ({exc})") \
                from None
        buf = io.BytesIO()
        # PNG, not Minari's JPEG: the pictures read back exactly.
        img.save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out
