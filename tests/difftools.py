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


# -- RLlib crashes that are not compared (pinned in the differences files) ---------

def rllib_crashes_in_one_hot_of_nothing(exc: Exception) -> bool:
    """RLlib's one_hot calls np.max on zero rows (a deliberate difference)."""
    return isinstance(exc, ValueError) and "zero-size array" in str(exc)


def rllib_slice_assertion(exc: Exception) -> bool:
    """RLlib's `_interpret_slice` asserts start >= 0, which fails for slices of a
    buffer with no rows to address (empty, or one row and `_ignore_last_ts`)
    whose stop lies before their start. Ours returns the (fill-padded) empty
    result instead (a deliberate difference, pinned in both differences files)."""
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


def buffer_state(buf: Any, read_data: bool = True) -> dict:
    """Everything observable about a buffer, deep-copied (RLlib shares objects).

    With `read_data=False` the data is read through `get_state()` instead of
    `.data`: reading our list-mode buffer's `.data` hands out its live list and
    so moves typed storage to a plain list, and a check that read it after
    every call would leave only that path to test.
    """
    return {
        "data": copy.deepcopy(buf.data if read_data else buf.get_state()["data"]),
        "len": len(buf),
        "len_incl_lookback": buf.len_incl_lookback(),
        "lookback": buf.lookback,
        "finalized": buf.finalized,
    }


def compare_buffers(ours: Any, theirs: Any, path: str = "buffer", read_data: bool = True) -> None:
    compare(buffer_state(ours, read_data), buffer_state(theirs, read_data), path)
    if theirs.space is None:
        assert ours.space is None, f"{path}.space: {ours.space} (ours) != None (RLlib)"
    else:
        assert ours.space == theirs.space, f"{path}.space: {ours.space} != {theirs.space}"


class Other:
    """Marks a call argument that is a Twin: each side gets its own buffer."""

    def __init__(self, twin: "Twin"):
        self.twin = twin


def _resolve(args: Any, side: str) -> Any:
    # Exact types: a namedtuple or OrderedDict argument is an item, copied as it is.
    if isinstance(args, Other):
        return args.twin.ours if side == "ours" else args.twin.theirs
    if type(args) is tuple:
        return tuple(_resolve(a, side) for a in args)
    if type(args) is dict:
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

    `read_data = False` (a subclass's) reads states through get_state()
    (see buffer_state).
    """

    read_data = True

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
        compare_buffers(self.ours, self.theirs, f"state after {label}", self.read_data)

    def call(self, method: str, *args: Any, compare_result: bool = True,
             result_check: Optional[Callable[[Any, Any], None]] = None,
             known: Optional[Callable[[Exception], bool]] = None, **kwargs: Any) -> Any:
        """Calls `method` on both buffers; returns (ours, RLlib's) results.

        `known(exc)` marks RLlib exceptions that are known RLlib crashes: the
        results are then not compared (only that our buffer is unchanged).
        """
        label = _call_label(method, args, kwargs)
        backup_theirs = copy.deepcopy(self.theirs)
        before_ours = buffer_state(self.ours, self.read_data)
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
            compare(buffer_state(self.ours, self.read_data), before_ours,
                    f"our state after {label}")
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
            compare(buffer_state(self.ours, self.read_data), before_ours,
                    f"our state after failed {label}")
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
        return type(self).from_buffers(copy.deepcopy(self.ours), copy.deepcopy(self.theirs))


class KeptTwin(Twin):
    """A Twin that reads states through get_state(), not `.data` (see
    buffer_state): our list-mode buffer keeps its typed storage."""

    read_data = False


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


# -- SingleAgentEpisode: the same machinery for whole episodes -------------------


def rllib_episode_class():
    """RLlib's SingleAgentEpisode class, or skip the calling test."""
    module = pytest.importorskip("ray.rllib.env.single_agent_episode")
    return module.SingleAgentEpisode


def ours_episode_class():
    from episode import SingleAgentEpisode

    return SingleAgentEpisode


def _safe(fn: Callable[[], Any]) -> Any:
    """fn()'s result deep-copied, or a marker naming the exception it raised."""
    try:
        return copy.deepcopy(fn())
    except Exception as e:  # noqa: BLE001 - a raising getter is part of the state
        return ("<raised>", type(e).__name__)


def episode_state(ep: Any, read_data: bool = True) -> dict:
    """Everything observable about an episode (deep-copied): counters, flags,
    ids, custom_data, each buffer's state and what every getter returns
    (`read_data`: see buffer_state)."""
    return {
        "id_": ep.id_,
        "agent_id": ep.agent_id,
        "module_id": ep.module_id,
        "multi_agent_episode_id": ep.multi_agent_episode_id,
        "len": len(ep),
        "t": ep.t,
        "t_started": ep.t_started,
        "is_done": ep.is_done,
        "is_terminated": ep.is_terminated,
        "is_truncated": ep.is_truncated,
        "is_reset": ep.is_reset,
        "is_numpy": ep.is_numpy,
        "env_steps": ep.env_steps(),
        "agent_steps": ep.agent_steps(),
        "custom_data": copy.deepcopy(ep.custom_data),
        "observations": buffer_state(ep.observations, read_data),
        "actions": buffer_state(ep.actions, read_data),
        "rewards": buffer_state(ep.rewards, read_data),
        "infos": buffer_state(ep.infos, read_data),
        "extra_model_outputs": {k: buffer_state(v, read_data)
                                for k, v in ep.extra_model_outputs.items()},
        "get_observations()": _safe(ep.get_observations),
        "get_actions()": _safe(ep.get_actions),
        "get_rewards()": _safe(ep.get_rewards),
        "get_infos()": _safe(ep.get_infos),
        "get_extra_model_outputs(k)": {
            k: _safe(lambda k=k: ep.get_extra_model_outputs(k))
            for k in list(ep.extra_model_outputs)
        },
    }


def _space_eq(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return type(a) is type(b) and a == b


def compare_episodes(ours: Any, theirs: Any, path: str = "episode",
                     read_data: bool = True) -> None:
    """Asserts two episodes (ours, RLlib's) are observably the same."""
    compare(episode_state(ours, read_data), episode_state(theirs, read_data), path)
    pairs = [("observation_space", ours.observation_space, theirs.observation_space),
             ("action_space", ours.action_space, theirs.action_space)]
    for name in ("observations", "actions", "rewards", "infos"):
        pairs.append((f"{name}.space", getattr(ours, name).space, getattr(theirs, name).space))
    for k in theirs.extra_model_outputs:
        pairs.append((f"extra_model_outputs[{k!r}].space", ours.extra_model_outputs[k].space,
                      theirs.extra_model_outputs[k].space))
    for name, a, b in pairs:
        if not _space_eq(a, b):
            raise Mismatch(f"{path}.{name}: {a} (ours) != {b} (RLlib)")


class Buf:
    """A ready lookback buffer as a constructor argument: each side gets one of
    its own buffer class (built from the same data)."""

    def __init__(self, data: Any = None, lookback: int = 0, space: Any = None,
                 finalize: bool = False):
        self.data, self.lookback, self.space, self.finalize = data, lookback, space, finalize

    def build(self, cls: Any) -> Any:
        buf = cls(copy.deepcopy(self.data), self.lookback, self.space)
        if self.finalize:
            buf.finalize()
        return buf

    def __repr__(self) -> str:
        return f"Buf(n={len(self.data or [])}, lookback={self.lookback}, fin={self.finalize})"


def _resolve_ep(args: Any, side: str) -> Any:
    if isinstance(args, Buf):
        return args.build(rllib_buffer_class() if side == "theirs" else ours_buffer_class())
    if isinstance(args, Other):
        return args.twin.ours if side == "ours" else args.twin.theirs
    if type(args) is tuple:  # (exact types, as in _resolve)
        return tuple(_resolve_ep(a, side) for a in args)
    if type(args) is dict:
        return {k: _resolve_ep(v, side) for k, v in args.items()}
    return copy.deepcopy(args)


def _is_episode(x: Any) -> bool:
    return all(hasattr(x, a) for a in ("observations", "cut", "concat_episode", "t_started"))


def _rllib_sample_batch_class():
    return pytest.importorskip("ray.rllib.policy.sample_batch").SampleBatch


class EpTwin:
    """One RLlib episode and one of ours, driven through the same calls.

    Like `Twin`: after each `call` results (episodes compared as episodes,
    SampleBatches by type, keys and values) and states must agree; where
    RLlib raises, ours must raise the same class (or a subclass) and keep its
    state, and RLlib's episode is restored from a backup. `read_data`: as
    for Twin.
    """

    read_data = True

    def __init__(self, ours: Any, theirs: Any):
        self.Rllib = rllib_episode_class()
        self.Ours = ours_episode_class()
        self.ours, self.theirs = ours, theirs

    @classmethod
    def new(cls, **kwargs: Any) -> "EpTwin":
        """Both constructors with the same arguments (Buf: each side's buffer).
        Raises Mismatch if they disagree; returns None if both raised alike."""
        Rllib, Ours = rllib_episode_class(), ours_episode_class()
        label = _call_label("SingleAgentEpisode", (), kwargs)
        try:
            theirs, exc_theirs = Rllib(**_resolve_ep(kwargs, "theirs")), None
        except Exception as e:  # noqa: BLE001
            theirs, exc_theirs = None, e
        try:
            ours, exc_ours = Ours(**_resolve_ep(kwargs, "ours")), None
        except Exception as e:  # noqa: BLE001
            ours, exc_ours = None, e
        if exc_theirs is not None:
            if not isinstance(exc_ours, type(exc_theirs)):
                raise Mismatch(
                    f"{label}: RLlib raised {type(exc_theirs).__name__}({exc_theirs}); ours "
                    + (f"raised {type(exc_ours).__name__}({exc_ours})" if exc_ours
                       else "returned an episode"))
            return None
        if exc_ours is not None:
            raise Mismatch(f"{label}: RLlib built an episode; ours raised "
                           f"{_traceback_text(exc_ours)}")
        twin = cls(ours, theirs)
        twin.check_state(label)
        return twin

    def check_state(self, label: str = "") -> None:
        compare_episodes(self.ours, self.theirs, f"state after {label}", self.read_data)

    def compare_results(self, r_ours: Any, r_theirs: Any, label: str) -> None:
        if r_theirs is self.theirs:
            if r_ours is not self.ours:
                raise Mismatch(f"{label}: RLlib returned the episode itself; ours "
                               f"returned {_describe(r_ours)}")
            return
        if _is_episode(r_theirs):
            if not isinstance(r_ours, self.Ours):
                raise Mismatch(f"{label}: RLlib returned an episode, ours {_describe(r_ours)}")
            compare_episodes(r_ours, r_theirs, f"episode returned by {label}", self.read_data)
            return
        if type(r_theirs).__name__ == "SampleBatch":
            compare_sample_batches(r_ours, r_theirs, f"result of {label}")
            return
        compare(r_ours, r_theirs, f"result of {label}")

    def call(self, method: str, *args: Any, compare_result: bool = True,
             result_check: Optional[Callable[[Any, Any], None]] = None,
             known: Optional[Callable[[Exception], bool]] = None, **kwargs: Any) -> Any:
        """Calls `method` on both episodes; returns (ours, RLlib's) results."""
        label = _call_label(method, args, kwargs)
        backup_theirs = copy.deepcopy(self.theirs)
        before_ours = episode_state(self.ours, self.read_data)
        try:
            r_theirs = getattr(self.theirs, method)(*_resolve_ep(args, "theirs"),
                                                     **_resolve_ep(kwargs, "theirs"))
            exc_theirs = None
        except Exception as e:  # noqa: BLE001
            exc_theirs, r_theirs = e, None
        try:
            r_ours = getattr(self.ours, method)(*_resolve_ep(args, "ours"),
                                                 **_resolve_ep(kwargs, "ours"))
            exc_ours = None
        except Exception as e:  # noqa: BLE001
            exc_ours, r_ours = e, None
        if exc_theirs is not None and known is not None and known(exc_theirs):
            self.theirs = backup_theirs
            return None, None
        if exc_theirs is not None:
            if exc_ours is None:
                raise Mismatch(f"{label}: RLlib raised {type(exc_theirs).__name__}"
                               f"({_short(str(exc_theirs))}), ours returned {_describe(r_ours)}")
            if not isinstance(exc_ours, type(exc_theirs)):
                raise Mismatch(f"{label}: RLlib raised {type(exc_theirs).__name__}"
                               f"({_short(str(exc_theirs))}), ours raised "
                               f"{type(exc_ours).__name__}({exc_ours})")
            compare(episode_state(self.ours, self.read_data), before_ours,
                    f"our state after failed {label}")
            self.theirs = backup_theirs
            return None, None
        if exc_ours is not None:
            raise Mismatch(f"{label}: RLlib returned {_describe(r_theirs)}, ours raised "
                           f"{_traceback_text(exc_ours)}")
        if result_check is not None:
            result_check(r_ours, r_theirs)
        elif compare_result:
            self.compare_results(r_ours, r_theirs, label)
        self.check_state(label)
        return r_ours, r_theirs

    def query(self, coll: "Collector", method: str, *args: Any,
              known: Optional[Callable[[Exception], bool]] = None, **kwargs: Any) -> None:
        """A read-only call whose disagreement is collected (no state check)."""
        label = _call_label(method, args, kwargs)

        def run() -> None:
            try:
                r_theirs, exc_theirs = getattr(self.theirs, method)(*args, **kwargs), None
            except Exception as e:  # noqa: BLE001
                r_theirs, exc_theirs = None, e
            if exc_theirs is not None and known is not None and known(exc_theirs):
                return
            try:
                r_ours, exc_ours = getattr(self.ours, method)(*args, **kwargs), None
            except Exception as e:  # noqa: BLE001
                r_ours, exc_ours = None, e
            if exc_theirs is not None:
                if not isinstance(exc_ours, type(exc_theirs)):
                    raise Mismatch(
                        f"RLlib raised {type(exc_theirs).__name__}({_short(str(exc_theirs))}); "
                        + (f"ours raised {type(exc_ours).__name__}({exc_ours})" if exc_ours
                           else f"ours returned {_describe(r_ours)}"))
                return
            if exc_ours is not None:
                raise Mismatch(f"RLlib returned {_describe(r_theirs)}; ours raised "
                               f"{type(exc_ours).__name__}({exc_ours})")
            self.compare_results(r_ours, r_theirs, label)

        coll.check(label, run)

    def copy(self) -> "EpTwin":
        return type(self)(copy.deepcopy(self.ours), copy.deepcopy(self.theirs))


class KeptEpTwin(EpTwin):
    """An EpTwin that reads states through get_state(), not `.data` (see
    buffer_state): our list-mode buffers keep their typed storage."""

    read_data = False


def _traceback_text(exc: BaseException) -> str:
    """The exception with its traceback as text. Not chained with `from`: a
    traceback pytest formats itself shows each frame's arguments, and the repr
    of a half-constructed episode must not be needed to report a failure."""
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) < 3000 else "..." + text[-3000:]


def compare_sample_batches(ours: Any, theirs: Any, path: str = "SampleBatch") -> None:
    if type(ours) is not type(theirs):
        raise Mismatch(f"{path}: type {type(ours)} (ours) != {type(theirs)} (RLlib)")
    compare(dict(ours), dict(theirs), path)
    compare(ours.count, theirs.count, f"{path}.count")
    compare(len(ours), len(theirs), f"len({path})")


def buffer_wraps_around(buf: Any, idx: int, neg: bool, fill: Any, one_hot: bool) -> bool:
    """RLlib's finalized-array fast path wraps lookback+idx < 0 around to the end
    (a deliberate buffer difference: ours raises IndexError). `buf` is RLlib's."""
    return (buf.finalized and isinstance(buf.data, np.ndarray) and neg and fill is None
            and not one_hot and buf.lookback + idx < 0)


def fill_without_space_on_finalized_rows(buf: Any, fill: Any) -> bool:
    """Fill on finalized multi-dimensional or Dict/Tuple rows without a space (a
    deliberate buffer difference). `buf` is RLlib's."""
    if fill is None or not buf.finalized or buf.space is not None:
        return False
    return isinstance(buf.data, (dict, tuple)) or (isinstance(buf.data, np.ndarray)
                                                   and buf.data.ndim > 1)


# -- Dict/Tuple items: cases the property tests keep away from ------------------------


def rllib_stacks_otherwise(items: list) -> bool:
    """Whether RLlib's finalize() of the list-mode `items` meets a deliberate
    buffer difference in stacking one leaf (or the items themselves): arrays
    of different dtypes (RLlib casts to the first's dtype, ours promotes), or
    values that do not form one array (RLlib raises or broadcasts a scalar
    into a row, ours keeps each in an object array). Items whose structures
    differ are not such a case (both raise)."""
    import tree  # dm-tree, as RLlib's batch() uses it

    if not items:
        return False
    try:
        for item in items[1:]:
            tree.assert_same_structure(items[0], item, check_types=True)
    except (ValueError, TypeError):
        return False
    for leaf in zip(*[tree.flatten(item) for item in items]):
        first = leaf[0]
        if isinstance(first, np.ndarray):
            if any(np.asarray(x).dtype != first.dtype or np.shape(x) != first.shape
                   for x in leaf[1:]):
                return True
        else:
            try:
                np.array(leaf)
            except ValueError:
                return True
    return False


def _holds(x: Any, test: Callable[[Any], bool]) -> bool:
    if test(x):
        return True
    if isinstance(x, dict):
        return any(_holds(v, test) for v in x.values())
    if isinstance(x, (tuple, list)):
        return any(_holds(v, test) for v in x)
    return False


def _is_list_or_namedtuple(x: Any) -> bool:
    return isinstance(x, list) or (isinstance(x, tuple) and hasattr(x, "_fields"))


def finalize_known_bug(items: list) -> bool:
    """Whether finalize() of the list-mode Dict/Tuple `items` meets one of the
    bugs that test_struct_items.py pins with xfail (our finalize() disagrees
    with RLlib's): a list or namedtuple inside an item (dm-tree nests into
    lists and keeps a namedtuple's type; our finalized storage does neither).
    Drop a case here once its xfail test passes."""
    if not items or not isinstance(items[0], (dict, tuple)):
        return False
    return any(_holds(item, _is_list_or_namedtuple) for item in items)


# Kinds of observations/actions for episodes (see KINDS) and what an env
# runner adds alongside them.
EPISODE_KINDS = ["box4", "discrete_int", "discrete_np", "multidiscrete", "dict", "nested",
                 "string"]


def info_item(i: int) -> Any:
    """Infos as env runners hand them: None, empty dicts and real dicts."""
    return [None, {}, {"step": i, "ok": i % 2 == 0}][i % 3]


def extra_item(i: int) -> dict:
    return {"action_logp": np.float32(-0.25 * i),
            "state_out": np.array([i, -i], dtype=np.float32)}


def struct_lookback_overflow(ep: Any) -> bool:
    """True if one of RLlib's episode's numpy'ized Dict/Tuple buffers has a
    lookback larger than its number of rows: RLlib caps a finalized buffer's
    lookback at len(data), for a dict/tuple its number of keys, not rows (a
    deliberate buffer difference: ours caps at the rows)."""
    for buf in (ep.observations, ep.actions):
        data = buf.data
        if buf.finalized and isinstance(data, (dict, tuple)):
            leaves = _leaves(data)
            if leaves and buf.lookback > len(leaves[0]):
                return True
    return False


def _leaves(x: Any) -> list:
    """The leaves of a dict/tuple struct, depth first (sub-structs may be empty)."""
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, tuple):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def rows_of(result: Any) -> int:
    """How many rows a get() result holds: a list's length, a batch's (or a
    dict/tuple of batches') number of rows; 0 for a single item."""
    if isinstance(result, list):
        return len(result)
    leaves = _leaves(result)
    return len(leaves[0]) if leaves and np.ndim(leaves[0]) else 0


def rllib_slice_overflows(theirs: Any, *args: Any, **kwargs: Any) -> bool:
    """Whether RLlib's `slice(*args, **kwargs)` of `theirs` hits the same cap:
    a lookback for numpy'ized Dict/Tuple data larger than its number of keys
    (RLlib then fails to validate), or struct_lookback_overflow (tried on a copy)."""
    sl = args[0] if args else kwargs["slice_"]
    lb = args[1] if len(args) > 1 else kwargs.get("len_lookback_buffer")
    start = 0 if sl.start is None else (len(theirs) + sl.start if sl.start < 0 else sl.start)
    for buf in (theirs.observations, theirs.actions):
        if buf.finalized and isinstance(buf.data, (dict, tuple)):
            eff = lb if lb is not None else buf.lookback
            if start >= 0 and start - eff < 0 and buf.lookback < eff - start:
                eff = buf.lookback + start
            if eff > len(buf.data):
                return True
    try:
        result = copy.deepcopy(theirs).slice(*args, **kwargs)
    except Exception:  # noqa: BLE001 - then it is compared as an error
        return False
    return struct_lookback_overflow(result)


def _buffers_as_states(x: Any) -> Any:
    """`x` with every lookback buffer in it replaced by its buffer_state (RLlib's
    get_state() keeps an extra-model-output buffer of length 0 as the buffer
    object itself)."""
    if hasattr(x, "len_incl_lookback") and hasattr(x, "lookback"):
        return ("<buffer>", buffer_state(x))
    if isinstance(x, dict):
        return {k: _buffers_as_states(v) for k, v in x.items()}
    return x


def compare_episode_states(ours: dict, theirs: dict, path: str = "get_state()") -> None:
    """get_state() results: all equal but the two timer entries, which must
    have the same types (None or float)."""
    ours, theirs = dict(ours), dict(theirs)
    for key in ("_start_time", "_last_step_time"):
        a, b = ours.pop(key), theirs.pop(key)
        if (a is None) != (b is None) or (b is not None and type(a) is not type(b)):
            raise Mismatch(f"{path}[{key!r}]: {a!r} (ours) vs {b!r} (RLlib)")
    extras = theirs.get("extra_model_outputs")
    if extras:
        # Deliberate difference: RLlib keeps a length-0 extra-model-output
        # buffer as the object itself; ours stores its state (see
        # test_single_agent_episode_differences.py).
        theirs["extra_model_outputs"] = {
            k: v.get_state() if hasattr(v, "len_incl_lookback") else v for k, v in extras.items()
        }
    compare(_buffers_as_states(ours), _buffers_as_states(theirs), path)
