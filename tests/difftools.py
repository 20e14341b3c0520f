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
             result_check: Optional[Callable[[Any, Any], None]] = None, **kwargs: Any) -> Any:
        """Calls `method` on both buffers; returns (ours, RLlib's) results."""
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
