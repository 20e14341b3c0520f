"""Frame-stacked observations stored once per frame: the buffers'
`frame_stack` and `frame_stack_axis` arguments, and the frame stack of an
environment's wrappers.

With `frame_stack=K` a buffer keeps each observation leaf whose rows stack
K frames (along `frame_stack_axis`, or by default along the one axis of
length K) as its frames, each stored once: consecutive observations of an
episode share K - 1 frames, so an Atari buffer of 84x84 frames stacked 4
deep needs about a quarter of the memory. Every answer of the buffer is
the one it gives without the option (samples, states, evictions); rows
that do not overlap as a stack does (a reset, a changed frame) are stored
with their own frames.
"""
from __future__ import annotations

import numbers
from typing import Any, Dict, Optional, Tuple

import numpy as np

from episode._frames import MAX_STACK


def frame_stack_of(env: Any) -> Tuple[int, int]:
    """The frame stack of `env`'s wrappers, as (frames, axis) for a
    buffer's `frame_stack` and `frame_stack_axis`: gymnasium's
    FrameStackObservation stacks along axis 0, RLlib's Atari FrameStack
    along the last axis. A vector env is read through its first sub-env.
    ValueError when no wrapper stacks frames."""
    seen = env
    for _ in range(64):
        if seen is None:
            break
        name = type(seen).__name__
        if name == "FrameStackObservation" and isinstance(getattr(seen, "stack_size", None), int):
            return seen.stack_size, 0
        if name == "FrameStack" and isinstance(getattr(seen, "k", None), int):
            return seen.k, -1
        subs = getattr(seen, "envs", None)
        seen = subs[0] if isinstance(subs, (list, tuple)) and subs else getattr(seen, "env", None)
    raise ValueError(f"no frame-stacking wrapper (gymnasium's FrameStackObservation, RLlib's "
                     f"FrameStack) around {type(env).__name__}: pass frame_stack=<frames>")


def frame_settings(frame_stack: Any, frame_stack_axis: Any) -> Optional[Tuple[int, Optional[int]]]:
    """A buffer's (frames, axis) from its arguments (None: off): an int of
    2 to MAX_STACK frames, or an environment whose wrappers stack frames
    (frame_stack_of(); its axis unless `frame_stack_axis` is given)."""
    if frame_stack_axis is not None and not _is_int(frame_stack_axis):
        raise TypeError(f"frame_stack_axis must be an int or None, not "
                        f"{type(frame_stack_axis).__name__}")
    if frame_stack is None or (_is_int(frame_stack) and frame_stack == 0):
        if frame_stack_axis is not None:
            raise ValueError("frame_stack_axis is given without frame_stack")
        return None
    if _is_int(frame_stack):
        if not 2 <= frame_stack <= MAX_STACK:
            raise ValueError(f"frame_stack must be 2 to {MAX_STACK} frames (or None), not "
                             f"{frame_stack}")
        return int(frame_stack), None if frame_stack_axis is None else int(frame_stack_axis)
    if hasattr(frame_stack, "observation_space") and (hasattr(frame_stack, "step")
                                                      or hasattr(frame_stack, "envs")):
        frames, axis = frame_stack_of(frame_stack)
        return frames, axis if frame_stack_axis is None else int(frame_stack_axis)
    raise TypeError(f"frame_stack must be a number of frames or an environment whose wrappers "
                    f"stack frames, not {type(frame_stack).__name__}")


def _is_int(value: Any) -> bool:
    # An int or a numpy integer, not a bool.
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def store_args(settings: Optional[Tuple[int, Optional[int]]]) -> Dict[str, Any]:
    """The Store's keyword arguments for a buffer's frame settings."""
    if settings is None:
        return {}
    return {"frame_stack": settings[0], "frame_axis": settings[1]}
