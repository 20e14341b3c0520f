"""Helpers for comparing `episode.InfiniteLookbackBuffer` with RLlib's class.

`compare` checks values AND container types (list vs tuple vs ndarray vs
Python scalar vs numpy scalar; dtype and shape for arrays; dict key order),
recursively. `Twin` drives one buffer of each implementation through the same
calls and checks that results, raised exception classes and buffer states
agree after every call.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import numpy as np
import pytest


def rllib_buffer_class():
    """RLlib's InfiniteLookbackBuffer class, or skip the calling test."""
    module = pytest.importorskip("ray.rllib.env.utils.infinite_lookback_buffer")
    return module.InfiniteLookbackBuffer


def ours_buffer_class():
    from episode import InfiniteLookbackBuffer

    return InfiniteLookbackBuffer


class Mismatch(AssertionError):
    pass


# -- RLlib crashes that are not compared (see the report / differences file) ----

def rllib_crashes_in_one_hot_of_nothing(exc: Exception) -> bool:
    """RLlib's one_hot calls np.max on zero rows (a deliberate difference)."""
    return isinstance(exc, ValueError) and "zero-size array" in str(exc)


def rllib_slice_assertion(exc: Exception) -> bool:
    """RLlib's `_interpret_slice` asserts start >= 0, which fails for slices of a
    buffer with no rows to address (empty, or one row and `_ignore_last_ts`)
    whose stop lies before their start. Ours returns the (fill-padded) empty
    result instead. Noted in the report, not compared."""
    return (isinstance(exc, AssertionError) and len(exc.args) == 1
            and isinstance(exc.args[0], tuple) and len(exc.args[0]) == 2
            and exc.args[0][0] < 0)


def known_rllib_crash(exc: Exception) -> bool:
    return rllib_crashes_in_one_hot_of_nothing(exc) or rllib_slice_assertion(exc)


def _describe(x: Any) -> str:
    text = repr(x)
    if isinstance(x, np.ndarray):
        text = f"ndarray(shape={x.shape}, dtype={x.dtype}, {x.tolist()!r})"
    elif isinstance(x, np.generic):
        text = f"{type(x).__name__}({x!r})"
    return text if len(text) < 400 else text[:400] + "..."


def _scalar_equal(a: Any, b: Any) -> bool:
    try:
        if a == b:
            return True
    except Exception:  # pragma: no cover - exotic __eq__
        return False
    try:
        return bool(math.isnan(a) and math.isnan(b))
    except (TypeError, ValueError):
        return False


def compare(ours: Any, theirs: Any, path: str = "result") -> None:
    """Asserts `ours` equals `theirs` in value AND in container/scalar types.

    ndarrays must agree in dtype, shape and values (NaN equals NaN); dicts in
    key order; lists/tuples in type and length; scalars in exact type.
    """
    if type(ours) is not type(theirs):
        raise Mismatch(
            f"{path}: type {type(ours).__name__} (ours) != {type(theirs).__name__} (RLlib)"
            f"\n  ours:  {_describe(ours)}\n  RLlib: {_describe(theirs)}"
        )
    if isinstance(theirs, np.ndarray):
        if ours.dtype != theirs.dtype or ours.shape != theirs.shape:
            raise Mismatch(
                f"{path}: ndarray {ours.dtype}{ours.shape} (ours) != "
                f"{theirs.dtype}{theirs.shape} (RLlib)"
                f"\n  ours:  {_describe(ours)}\n  RLlib: {_describe(theirs)}"
            )
        if theirs.dtype == object:
            for i, (a, b) in enumerate(zip(ours.ravel(), theirs.ravel())):
                compare(a, b, f"{path}.flat[{i}]")
            return
        equal_nan = theirs.dtype.kind in "fc"
        if not np.array_equal(ours, theirs, equal_nan=equal_nan):
            raise Mismatch(
                f"{path}: values differ\n  ours:  {_describe(ours)}\n  RLlib: {_describe(theirs)}"
            )
        return
    if isinstance(theirs, dict):
        if list(ours) != list(theirs):
            raise Mismatch(f"{path}: dict keys {list(ours)} (ours) != {list(theirs)} (RLlib)")
        for k in theirs:
            compare(ours[k], theirs[k], f"{path}[{k!r}]")
        return
    if isinstance(theirs, (list, tuple)):
        if len(ours) != len(theirs):
            raise Mismatch(
                f"{path}: length {len(ours)} (ours) != {len(theirs)} (RLlib)"
                f"\n  ours:  {_describe(ours)}\n  RLlib: {_describe(theirs)}"
            )
        for i, (a, b) in enumerate(zip(ours, theirs)):
            compare(a, b, f"{path}[{i}]")
        return
    if isinstance(theirs, np.generic):
        if ours.dtype != theirs.dtype or not _scalar_equal(ours, theirs):
            raise Mismatch(f"{path}: {_describe(ours)} (ours) != {_describe(theirs)} (RLlib)")
        return
    if not _scalar_equal(ours, theirs):
        raise Mismatch(f"{path}: {_describe(ours)} (ours) != {_describe(theirs)} (RLlib)")


def buffer_state(buf: Any) -> dict:
    """Everything observable about a buffer, deep-copied (RLlib shares objects)."""
    return {
        "data": copy.deepcopy(buf.data),
        "len": len(buf),
        "len_incl_lookback": buf.len_incl_lookback(),
        "lookback": buf.lookback,
        "finalized": buf.finalized,
    }


def compare_buffers(ours: Any, theirs: Any, path: str = "buffer") -> None:
    compare(buffer_state(ours), buffer_state(theirs), path)
    if theirs.space is None:
        assert ours.space is None, f"{path}.space: {ours.space} (ours) != None (RLlib)"
    else:
        assert ours.space == theirs.space, f"{path}.space: {ours.space} != {theirs.space}"


class Other:
    """Marks a call argument that is a Twin: each side gets its own buffer."""

    def __init__(self, twin: "Twin"):
        self.twin = twin


def _resolve(args: Any, side: str) -> Any:
    if isinstance(args, Other):
        return args.twin.ours if side == "ours" else args.twin.theirs
    if isinstance(args, tuple):
        return tuple(_resolve(a, side) for a in args)
    if isinstance(args, dict):
        return {k: _resolve(v, side) for k, v in args.items()}
    return copy.deepcopy(args)


class Twin:
    """One RLlib buffer and one of ours, driven through the same calls.

    After each `call`:
      * if RLlib returned, ours must return an equal result (`compare`) and
        both buffers must have equal states;
      * if RLlib raised, ours must raise the same class (or a subclass), and
        our buffer must be unchanged (its state before the call). RLlib's
        buffer is then reset to its state before the call too (a failed RLlib
        call may leave its buffer modified), so the pair can go on.
    """

    def __init__(self, data: Any = None, lookback: int = 0, space: Any = None,
                 finalize: bool = False):
        self.Rllib = rllib_buffer_class()
        self.Ours = ours_buffer_class()
        self.theirs = self.Rllib(copy.deepcopy(data), lookback, space)
        self.ours = self.Ours(copy.deepcopy(data), lookback, space)
        self.check_state("constructor")
        if finalize:
            self.call("finalize")

    @classmethod
    def from_buffers(cls, ours: Any, theirs: Any) -> "Twin":
        twin = cls.__new__(cls)
        twin.Rllib, twin.Ours = type(theirs), type(ours)
        twin.ours, twin.theirs = ours, theirs
        return twin

    def check_state(self, label: str = "") -> None:
        compare_buffers(self.ours, self.theirs, f"state after {label}")

    def call(self, method: str, *args: Any, compare_result: bool = True,
             result_check: Optional[Callable[[Any, Any], None]] = None,
             known: Optional[Callable[[Exception], bool]] = None, **kwargs: Any) -> Any:
        """Calls `method` on both buffers; returns (ours, RLlib's) results.

        `known(exc)` marks RLlib exceptions that are known RLlib crashes: the
        results are then not compared (only that our buffer is unchanged).
        """
        label = _call_label(method, args, kwargs)
        backup_theirs = copy.deepcopy(self.theirs)
        before_ours = buffer_state(self.ours)
        try:
            r_theirs = getattr(self.theirs, method)(*_resolve(args, "theirs"),
                                                     **_resolve(kwargs, "theirs"))
            exc_theirs = None
        except Exception as e:  # noqa: BLE001 - any RLlib error is a result
            exc_theirs, r_theirs = e, None
        try:
            r_ours = getattr(self.ours, method)(*_resolve(args, "ours"), **_resolve(kwargs, "ours"))
            exc_ours = None
        except Exception as e:  # noqa: BLE001
            exc_ours, r_ours = e, None

        if exc_theirs is not None and known is not None and known(exc_theirs):
            compare(buffer_state(self.ours), before_ours, f"our state after {label}")
            self.theirs = backup_theirs
            return None, None
        if exc_theirs is not None:
            if exc_ours is None:
                raise Mismatch(
                    f"{label}: RLlib raised {type(exc_theirs).__name__}({exc_theirs}), ours "
                    f"returned {_describe(r_ours)}"
                )
            if not isinstance(exc_ours, type(exc_theirs)):
                raise Mismatch(
                    f"{label}: RLlib raised {type(exc_theirs).__name__}({exc_theirs}), ours "
                    f"raised {type(exc_ours).__name__}({exc_ours})"
                )
            compare(buffer_state(self.ours), before_ours, f"our state after failed {label}")
            self.theirs = backup_theirs
            return None, None
        if exc_ours is not None:
            raise Mismatch(
                f"{label}: RLlib returned {_describe(r_theirs)}, ours raised "
                f"{type(exc_ours).__name__}({exc_ours})"
            ) from exc_ours
        if result_check is not None:
            result_check(r_ours, r_theirs)
        elif compare_result:
            compare(r_ours, r_theirs, f"result of {label}")
        self.check_state(label)
        return r_ours, r_theirs

    def copy(self) -> "Twin":
        return Twin.from_buffers(copy.deepcopy(self.ours), copy.deepcopy(self.theirs))


def _call_label(method: str, args: tuple, kwargs: dict) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return f"{method}({', '.join(parts)})"


def _short(x: Any) -> str:
    if isinstance(x, Other):
        return "<other buffer>"
    text = _describe(x)
    return text if len(text) < 120 else text[:120] + "..."


class Collector:
    """Runs many checks and reports all failures at once (with their context)."""

    def __init__(self, limit: int = 25):
        self.failures: list[str] = []
        self.count = 0
        self.limit = limit

    def check(self, context: str, fn: Callable[[], Any]) -> None:
        self.count += 1
        try:
            fn()
        except Mismatch as e:
            self.failures.append(f"[{context}] {e}")

    def assert_ok(self) -> None:
        if self.failures:
            shown = "\n\n".join(self.failures[: self.limit])
            more = len(self.failures) - self.limit
            tail = f"\n\n... and {more} more" if more > 0 else ""
            pytest.fail(
                f"{len(self.failures)} of {self.count} checks disagree with RLlib:\n\n{shown}{tail}",
                pytrace=False,
            )


# -- the kinds of data a buffer holds in RLlib episodes -----------------------

import gymnasium as gym  # noqa: E402

F32 = np.float32


class Kind:
    """A kind of buffer content: a space (or None) and a deterministic item maker.

    `item(i)` gives the i-th item as an env runner would hand it to the buffer.
    `fill` is a fill value that makes sense for the kind.
    """

    def __init__(self, name: str, space: Any, item: Callable[[int], Any], fill: Any = 0.0,
                 struct: bool = False, row_ndim: int = 0, discrete: bool = False):
        self.name = name
        self.space = space
        self.item = item
        self.fill = fill
        self.struct = struct
        self.row_ndim = row_ndim
        self.discrete = discrete

    def items(self, n: int, start: int = 0) -> list:
        return [self.item(i) for i in range(start, start + n)]

    def __repr__(self) -> str:
        return self.name


def _box4(i):
    return np.array([i % 7, (i % 5) * 0.5, -(i % 3), 1.25], dtype=F32)


def _box23(i):
    return (np.arange(6, dtype=F32).reshape(2, 3) * 0.25 + (i % 9) - 4).astype(F32)


BOX4 = gym.spaces.Box(-10.0, 10.0, (4,), F32)
BOX23 = gym.spaces.Box(-10.0, 10.0, (2, 3), F32)

KINDS = {
    k.name: k
    for k in [
        Kind("box4", BOX4, _box4, row_ndim=1),
        Kind("box23", BOX23, _box23, row_ndim=2),
        Kind("discrete_int", gym.spaces.Discrete(5), lambda i: i % 5, fill=0, discrete=True),
        Kind("discrete_np", gym.spaces.Discrete(5), lambda i: np.int64(i % 5), fill=0,
             discrete=True),
        Kind("multidiscrete", gym.spaces.MultiDiscrete([2, 3, 4]),
             lambda i: np.array([i % 2, i % 3, i % 4], dtype=np.int64), fill=0, row_ndim=1,
             discrete=True),
        Kind("dict", gym.spaces.Dict({"a": gym.spaces.Box(-10.0, 10.0, (2,), F32),
                                      "b": gym.spaces.Discrete(3)}),
             lambda i: {"a": np.array([i % 4, -1.5], dtype=F32), "b": np.int64(i % 3)},
             struct=True, discrete=True),
        Kind("nested", gym.spaces.Tuple((
                gym.spaces.Discrete(2),
                gym.spaces.Dict({"x": gym.spaces.Box(-10.0, 10.0, (3,), F32),
                                 "y": gym.spaces.MultiDiscrete([2, 2])}))),
             lambda i: (np.int64(i % 2),
                        {"x": np.array([i % 3, 0.5, -2], dtype=F32),
                         "y": np.array([i % 2, (i + 1) % 2], dtype=np.int64)}),
             struct=True, discrete=True),
        Kind("reward", None, lambda i: float(i) * 0.5 - 1.0),
        Kind("int_nospace", None, lambda i: i * 3 - 4, fill=0),
        Kind("box4_nospace", None, _box4, row_ndim=1),
        Kind("info", None, lambda i: {"step": i, "flag": i % 2 == 0}, fill=0, struct=True),
        Kind("string", None, lambda i: "s" * (i % 3 + 1), fill="pad"),
        Kind("image_u8", gym.spaces.Box(0, 255, (2, 2), np.uint8),
             lambda i: np.full((2, 2), (i * 37) % 256, np.uint8), fill=0, row_ndim=2),
        Kind("multibinary", gym.spaces.MultiBinary(3),
             lambda i: np.array([i % 2, (i // 2) % 2, 1], dtype=np.int8), fill=0, row_ndim=1),
        Kind("bool_nospace", None, lambda i: i % 3 == 0, fill=False),
        Kind("f32_scalar", None, lambda i: np.float32(i) / 4, fill=0.0),
        # Scalars whose type changes from item to item (list mode keeps each type).
        Kind("mixed_scalar", None,
             lambda i: [float(i) / 2, i, np.float32(i), np.int64(-i), i % 2 == 0][i % 5],
             fill=0),
    ]
}

SPACE_KINDS = [k for k in KINDS.values() if k.space is not None]
