"""Garbage inputs for the compiled core, run in a child process.

test_garbage_input.py starts `python garbage.py` with case names on stdin.
The child imports everything once, then runs the cases in forks of itself,
a few per fork; a case that fails or crashes there runs again in a fork of
its own, whose report counts, so that a crash or a problem is pinned on the
case that caused it. For each case it prints `RESULT name <base64 pickle>`:
one record per step, with the exception the step raised (class and MRO
names) or a plain summary of the value it returned, and the problems found;
or, for a fork that died, its signal or exit status and its output (each
step is noted on stderr first, so the output names the step that died).
A step's problems are: a value holding data that was never written (each
case declares the values it wrote), an exception or value other than the
one the step expects, stored data that changed although the step was
rejected, a SystemError.

Cases are plain functions `fn(impl, probe)`. `impl` bundles the classes
under test, so the cases marked `rllib` run unchanged on RLlib's classes in
the parent, which compares the two step by step.
"""

from __future__ import annotations

import base64
import collections
import copy
import datetime
import functools
import gc
import math
import os
import pickle
import pickletools
import signal
import sys
import tempfile
import traceback

import gymnasium as gym
from collections import OrderedDict

import numpy as np

# -- registry ----------------------------------------------------------------

Case = collections.namedtuple("Case", "name group fn rllib")
CASES: dict = {}


def add(group, name, fn, rllib=False):
    name = f"{group}:{name}"
    if name in CASES or any(c.isspace() for c in name):
        raise ValueError(f"duplicate case name, or one with spaces: {name!r}")
    CASES[name] = Case(name, group, fn, rllib)


def groups() -> dict:
    out: dict = {}
    for case in CASES.values():
        out.setdefault(case.group, []).append(case.name)
    return out


class Impl:
    """The classes a case runs on."""

    def __init__(self, buffer, episode, ours):
        self.Buffer = buffer
        self.Episode = episode
        self.ours = ours


def ours() -> Impl:
    import episode.replay  # noqa: F401 - imported before the forks (the replay cases)
    from episode import InfiniteLookbackBuffer, SingleAgentEpisode

    return Impl(InfiniteLookbackBuffer, SingleAgentEpisode, True)


def rllib() -> Impl:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    return Impl(InfiniteLookbackBuffer, SingleAgentEpisode, False)


# -- flipped bytes -------------------------------------------------------------

_DTYPE_CLASSES = {("numpy", "dtype"), ("numpy.core.multiarray", "dtype"),
                  ("numpy._core.multiarray", "dtype")}


def numpy_dtype_states(data: bytes) -> set:
    """The positions in pickle `data` that hold a numpy dtype's state (byte
    order, sizes, flags: the tuple its __setstate__ gets). numpy takes that
    state on trust: a flipped flag there makes numpy itself fail when an
    array of the dtype is freed, at some later GC (a RuntimeError from
    get_clear_loop; test_garbage_input pins it), which says nothing about
    our code. Found by running the pickle's opcodes over a stack of
    (start position, what, str value) without building anything."""
    stack: list = []
    memo: dict = {}
    out: set = set()
    mark = pickletools.markobject
    for op, arg, pos in pickletools.genops(data):
        before = op.stack_before
        if mark in before:
            popped = []
            while stack and stack[-1][1] != "mark":
                popped.append(stack.pop())
            popped.append(stack.pop())
            popped += [stack.pop() for _ in range(before.index(mark))]
            popped.reverse()
        else:
            popped = stack[len(stack) - len(before):]
            del stack[len(stack) - len(before):]
        start = min([item[0] for item in popped], default=pos)
        name = op.name
        if name == "MARK":
            pushed = [(pos, "mark", None)]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            pushed = [(pos,) + memo[arg]]
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = stack[-1][1:]
            pushed = []
        elif name == "MEMOIZE":
            memo[len(memo)] = popped[0][1:]
            pushed = popped
        elif name in ("DUP", "READONLY_BUFFER"):
            pushed = popped * len(op.stack_after)
        elif name == "GLOBAL":
            found = tuple(arg.split(" ", 1)) in _DTYPE_CLASSES
            pushed = [(pos, "dtype class" if found else None, None)]
        elif name == "STACK_GLOBAL":
            found = (popped[0][2], popped[1][2]) in _DTYPE_CLASSES
            pushed = [(start, "dtype class" if found else None, None)]
        elif name == "REDUCE":
            pushed = [(start, "dtype" if popped[0][1] == "dtype class" else None, None)]
        elif name == "BUILD":
            if popped[0][1] == "dtype":
                out.update(range(popped[1][0], pos + 1))
            pushed = popped[:1]
        else:
            pushed = [(start, None, arg if isinstance(arg, str) else None)
                      for _ in op.stack_after]
        stack += pushed
    return out


def flippable(data: bytes) -> np.ndarray:
    """The positions of pickle `data` a flipped-bytes case may change: all
    but numpy's dtype states (numpy_dtype_states)."""
    kept = numpy_dtype_states(data)
    return np.array([i for i in range(len(data)) if i not in kept], dtype=np.int64)


def flipped(data: bytes, positions: np.ndarray, rng, count: int) -> bytes:
    """`data` with `count` of `positions` set to random bytes."""
    bad = bytearray(data)
    for i in rng.integers(0, len(positions), size=count):
        bad[positions[i]] = int(rng.integers(0, 256))
    return bytes(bad)


# -- values --------------------------------------------------------------------


def leaves(x):
    """The scalar values inside `x` (arrays, containers, numpy scalars), as
    Python objects, so that "was this value ever written?" is a set lookup."""
    if isinstance(x, np.ndarray):
        if x.dtype.hasobject:
            for item in x.ravel():
                yield from leaves(item)
            return
        yield from leaves(x.tolist())
    elif isinstance(x, np.generic):
        yield from leaves(x.item())
    elif isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from leaves(v)
    else:
        yield x


def _keys_and_chars(x, depth=0):
    if depth > 10:
        return
    if isinstance(x, str):
        yield from x
    elif isinstance(x, dict):
        for k, v in x.items():
            yield k
            yield from _keys_and_chars(v, depth + 1)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _keys_and_chars(v, depth + 1)


def _hashable(v):
    try:
        hash(v)
        return True
    except TypeError:
        return False


def summary(x, depth=0):
    """`x` as plain, picklable data: arrays, containers and scalars; any
    other object as the string '<TypeName>' (the parent never unpickles
    objects of the package under test)."""
    if depth > 20:
        return "<deep>"
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            out = np.empty(x.shape, dtype=object)
            for i, item in enumerate(x.ravel()):
                out.reshape(-1)[i] = summary(item, depth + 1)
            return out
        return np.array(x, copy=True)
    if isinstance(x, dict):
        return {summary(k, depth + 1): summary(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        return type(x)(summary(v, depth + 1) for v in x)
    if x is None or isinstance(
        x, (bool, int, float, complex, str, bytes, np.generic, datetime.date, datetime.timedelta)
    ):
        return x
    return f"<{type(x).__name__}>"


def same(a, b) -> bool:
    """Equal values of the same types (arrays: dtype, shape, values; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind in "fc":
            return bool(np.array_equal(a, b, equal_nan=True))
        if a.dtype == object:
            return all(same(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return bool(math.isnan(b))
    try:
        return bool(a == b)
    except Exception:
        return False


def token(x, limit=40) -> str:
    """A short name for `x` that is the same in every process (no addresses, no spaces)."""
    if isinstance(x, (list, tuple)) and type(x) in (list, tuple):
        inner = ",".join(token(v, limit) for v in x)
        text = f"[{inner}]" if type(x) is list else f"({inner})"
    elif type(x) is dict:
        text = "{" + ",".join(f"{token(k)}:{token(v)}" for k, v in x.items()) + "}"
    elif isinstance(x, slice):
        text = f"slice({token(x.start)},{token(x.stop)},{token(x.step)})"
    elif isinstance(x, (np.ndarray, np.generic)):
        text = f"{type(x).__name__}:{x.dtype}:{np.asarray(x).tolist()!r}"
    elif (
        x is None
        or isinstance(x, (bool, int, float, complex, str, bytes))
        and type(x) in (bool, int, float, complex, str, bytes)
    ):
        text = repr(x)
    else:
        text = type(x).__name__
    text = text.replace(" ", "")
    return text if len(text) <= limit else text[:limit] + "..."


def short(x, limit=300) -> str:
    text = repr(x)
    if isinstance(x, np.ndarray):
        text = (
            f"array({x.tolist()!r}, dtype={x.dtype.str!r})"
            if x.size < 50
            else f"array(shape={x.shape}, dtype={x.dtype.str!r})"
        )
    return text if len(text) <= limit else text[:limit] + "..."


def state_of(obj) -> str:
    """A comparable picture of the data `obj` stores (None if it cannot be read)."""
    try:
        if hasattr(obj, "get_state"):
            st = obj.get_state()
        elif hasattr(obj, "to_list"):
            st = (obj.kind, obj.finalized, len(obj), obj.to_list())
        else:
            return None
        return short(summary(st), limit=10**6)
    except Exception as e:
        return f"<state unreadable: {type(e).__name__}: {e}>"


class Value:
    """An expected return value."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Value({short(self.value)})"


class Check:
    """An expected return value given by a predicate: `fn(value)` returns a
    problem string or None."""

    def __init__(self, fn, text):
        self.fn, self.text = fn, text

    def __repr__(self):
        return self.text


# Ops that read or grow the data are skipped on objects claiming more rows
# than this: reading them would hang the child.
PLAUSIBLE_ROWS = 10_000
MAX_RESULT = 10**6  # elements in a value returned by any case's step


def _size(x, depth=0):
    """Elements in `x` (arrays, containers), capped by what `summary` would copy."""
    if isinstance(x, np.ndarray):
        return x.size
    if isinstance(x, (list, tuple)) and depth < 5:
        return len(x) + sum(_size(v, depth + 1) for v in x[:100])
    if isinstance(x, dict) and depth < 5:
        return sum(_size(v, depth + 1) for v in x.values())
    return 1


class Probe:
    """Runs the steps of one case and records what each did."""

    def __init__(self):
        self.steps = []
        self.known = set()  # values written into the data (data steps may return only these)
        self.nan_ok = False  # NaN was written (or None, which float storage holds as NaN)
        self.check_data = True
        self.skipped = None  # why the case does not apply (the parent skips its test)
        self.problems = []  # problems outside any step (setup failures)
        self.trace = False  # note each step on stderr (a crash's output then names it)

    def allow(self, *items):
        """Marks the values inside `items` as written (and what list-mode
        code can make of them: a dict's keys, a string's characters)."""
        for v in _keys_and_chars(items):
            self.known.add(v)
        try:
            values = list(leaves(list(items)))
        except Exception:  # bytes numpy cannot read back (a corrupted payload)
            values = []
        for v in values:
            if v is None or isinstance(v, float) and math.isnan(v):
                self.nan_ok = True
            elif _hashable(v):
                forms = [v]
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    # numpy's promotions of a number: to float, to str, to bytes
                    forms += [float(v), str(v), str(v).encode()]
                for form in forms:
                    self.known.add(form)
                    if isinstance(form, (str, bytes)):
                        # fixed-width strings cut values to their width
                        self.known.update(form[:k] for k in range(1, len(form)))

    def run(self, label, fn, *, ok=None, state=None, data=True, cmp=False):
        """Runs `fn()` as step `label`.

        ok: the acceptable outcomes (exception classes, Value, Check), or
            None for any ordinary exception or value.
        state: an object whose stored data must be unchanged if the step raises.
        data: check that a returned value holds only written values.
        cmp: compare this step with RLlib (in cases marked rllib).
        Returns the value, or None when the step raised.
        """
        if self.trace:
            os.write(2, f"step: {label}\n".encode(errors="replace"))
        before = state_of(state) if state is not None else None
        record = {
            "label": label,
            "raised": None,
            "mro": [],
            "msg": "",
            "value": None,
            "problems": [],
            "cmp": cmp,
        }
        value = None
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - every outcome is recorded
            if isinstance(e, KeyboardInterrupt):
                raise
            record["raised"] = type(e).__name__
            record["mro"] = [c.__name__ for c in type(e).__mro__]
            record["msg"] = str(e)[:300]
            if isinstance(e, SystemError) or not isinstance(e, Exception):
                record["problems"].append(
                    f"raised {type(e).__name__} (an interpreter-level error): {e}"
                )
            if state is not None:
                after = state_of(state)
                if after != before:
                    record["problems"].append(
                        f"rejected, but the stored data changed:\n  before {before[:600]}\n"
                        f"  after  {after[:600]}"
                    )
        else:
            try:
                size = _size(value)
                if size > MAX_RESULT:
                    record["problems"].append(
                        f"returned a result of {size} elements (a buffer of a few rows was "
                        f"asked): it holds memory nobody wrote"
                    )
                    value = None
                record["value"] = summary(value)
                if data and self.check_data:
                    bad = [v for v in leaves(record["value"]) if not self._written(v)]
                    if bad:
                        record["problems"].append(
                            f"returned values never written: {short(bad[:5])} in "
                            f"{short(record['value'])}"
                        )
            except MemoryError:
                record["value"] = "<too large to inspect>"
                record["problems"].append("the returned value is too large to inspect")
            except Exception as e:
                record["value"] = "<unreadable>"
                record["problems"].append(
                    f"the returned value cannot be read back ({type(e).__name__}: {e}): "
                    f"it holds bytes that are not values of its dtype"
                )
        if ok is not None:
            problem = self._check_outcome(record, value, ok)
            if problem:
                record["problems"].append(problem)
        self.steps.append(record)
        return value

    def _written(self, v):
        if v is None or not _hashable(v):
            return True
        if isinstance(v, float) and math.isnan(v):
            return self.nan_ok
        if isinstance(v, str) and v.startswith("<") and v.endswith(">"):
            return True  # an object's summary, not data
        return v in self.known

    @staticmethod
    def _check_outcome(record, value, ok):
        if record["raised"] == "SystemError":
            return None  # already a problem
        for want in ok:
            if isinstance(want, type) and issubclass(want, BaseException):
                if record["raised"] and want.__name__ in record["mro"]:
                    return None
            elif record["raised"] is None:
                if isinstance(want, Value) and same(record["value"], summary(want.value)):
                    return None
                if isinstance(want, Check) and want.fn(value) is None:
                    return None
        got = (
            f"raised {record['raised']}: {record['msg']}"
            if record["raised"]
            else f"returned {short(record['value'])}"
        )
        wanted = " or ".join(w.__name__ if isinstance(w, type) else repr(w) for w in ok)
        return f"expected {wanted}; {got}"

    def problem(self, text):
        self.problems.append(text)

    def skip(self, reason):
        self.skipped = reason

    def report(self):
        return {"steps": self.steps, "problems": self.problems, "skipped": self.skipped}


# -- fixtures --------------------------------------------------------------------

F = -7.0  # the fill value; never a data value, nor is 0 (zeroed heap memory)
DATA = [1.0, 2.0, 3.0, 4.0, 5.0]


def buf_list(impl):
    return impl.Buffer(list(DATA), lookback=2)


def buf_numpy(impl):
    buf = buf_list(impl)
    buf.finalize()
    return buf


def buf_rows(impl):
    buf = impl.Buffer([np.array([i, i + 0.5], np.float32) for i in DATA], lookback=2)
    buf.finalize()
    return buf


def buf_dict_list(impl):
    # List mode: ours keeps the items in a tree of typed Columns (one per leaf).
    return impl.Buffer([{"a": i, "b": np.array([i, -i], np.int64)} for i in DATA], lookback=2)


def buf_dict(impl):
    buf = buf_dict_list(impl)
    buf.finalize()
    return buf


def buf_nested_list(impl):
    return impl.Buffer([({"c": int(i)}, np.array([i, i + 0.5], np.float32)) for i in DATA],
                       lookback=2)


def buf_empty(impl):
    buf = impl.Buffer([], lookback=0)
    buf.finalize()
    return buf


BUFFERS = {"list": buf_list, "numpy": buf_numpy, "rows": buf_rows, "dict": buf_dict,
           "dict_list": buf_dict_list, "nested_list": buf_nested_list}


def allow_buffer_fixture(p):
    p.allow(DATA, [[i, i + 0.5] for i in DATA], [-i for i in DATA], F)


def obs(t):
    return np.array([t + 1.0, t + 1.5], np.float32)


def make_episode(impl, numpy=False, steps=5):
    ep = impl.Episode()
    ep.add_env_reset(obs(0), infos={"t": 0})
    for t in range(1, steps + 1):
        ep.add_env_step(
            obs(t), t % 3 + 1, t + 0.25, infos={"t": t}, extra_model_outputs={"vf": 10.0 + t}
        )
    if numpy:
        ep.to_numpy()
    return ep


def allow_episode_fixture(p, steps=5):
    p.allow(
        [obs(t) for t in range(steps + 1)],
        [t % 3 + 1 for t in range(steps + 1)],
        [t + 0.25 for t in range(steps + 1)],
        [10.0 + t for t in range(steps + 1)],
        list(range(steps + 1)),
        "t",
        F,
        np.float32(F),
    )


EPISODES = {
    "list": lambda impl: make_episode(impl),
    "numpy": lambda impl: make_episode(impl, True),
}


# -- probes: standard reads and writes on a possibly corrupted object -----------------


def _fresh_list(impl):
    return impl.Buffer([11.0, 12.0, 13.0], lookback=1)


def probe_buffer(p, tag, buf, impl, heavy=True):
    """Reads, writes and block moves on `buf`; none may crash or return
    data nobody wrote."""
    p.allow(11.0, 12.0, 13.0, 21.0, 22.0, F)
    lb = p.run(f"{tag}.lookback", lambda: buf.lookback, data=False)
    if isinstance(lb, (int, np.integer)) and not isinstance(lb, bool) and lb < 0:
        p.steps[-1]["problems"].append(
            f"the buffer accepted a negative lookback ({lb}): it reads rows before its data"
        )
    n = p.run(f"{tag}.len_incl_lookback", lambda: buf.len_incl_lookback(), data=False)
    p.run(f"{tag}.len", lambda: len(buf), data=False)
    if not isinstance(n, int) or n > PLAUSIBLE_ROWS:
        if isinstance(n, int):
            p.steps[-1]["problems"].append(f"implausible len_incl_lookback {n}")
        return
    wild = not isinstance(lb, int) or abs(lb) > PLAUSIBLE_ROWS
    p.run(f"{tag}.get()", lambda: buf.get())
    p.run(f"{tag}.get(0)", lambda: buf.get(0))
    p.run(f"{tag}.get(-1)", lambda: buf.get(-1))
    p.run(f"{tag}.get(-1,neg)", lambda: buf.get(-1, neg_index_as_lookback=True))
    p.run(f"{tag}[:]", lambda: buf[:])
    p.run(f"{tag}.get(slice(-2,None,-1))", lambda: buf.get(slice(-2, None, -1)))
    if not wild:
        p.run(f"{tag}.get(slice(-10,10),fill)", lambda: buf.get(slice(-10, 10), fill=F))
        p.run(
            f"{tag}.get(slice(-10,10),neg,fill)",
            lambda: buf.get(slice(-10, 10), neg_index_as_lookback=True, fill=F),
        )
        p.run(f"{tag}.get([0,-1,9],fill)", lambda: buf.get([0, -1, 9], fill=F))
        p.run(f"{tag}.get(-9,fill)", lambda: buf.get(-9, fill=F))
    p.run(f"{tag}.data", lambda: buf.data)
    p.run(f"{tag}.repr", lambda: repr(buf), data=False)
    p.run(f"{tag}.get_state", lambda: buf.get_state()["data"])
    p.run(
        f"{tag}.pickle5", lambda: pickle.loads(pickle.dumps(buf, protocol=5)).get_state()["data"]
    )
    p.run(
        f"{tag}.pickle2", lambda: pickle.loads(pickle.dumps(buf, protocol=2)).get_state()["data"]
    )
    p.run(f"{tag}.deepcopy", lambda: copy.deepcopy(buf).get_state()["data"])
    if not heavy:
        return
    other = _fresh_list(impl)
    p.run(f"{tag}->list.concat", lambda: (other.concat(buf), other.get_state()["data"])[1])
    other = _fresh_list(impl)
    other.finalize()
    p.run(f"{tag}->numpy.concat", lambda: (other.concat(buf), other.get_state()["data"])[1])
    p.run(f"{tag}.concat(list)", lambda: buf.concat(_fresh_list(impl)), data=False)
    p.run(f"{tag}.get() after concat", lambda: buf.get())
    p.run(f"{tag}.append", lambda: buf.append(21.0), data=False)
    p.run(f"{tag}.extend", lambda: buf.extend([22.0, 22.0]), data=False)
    p.run(f"{tag}.pop", lambda: buf.pop(), data=False)
    p.run(f"{tag}.pop(0)", lambda: buf.pop(0), data=False)
    p.run(f"{tag}.set(0)", lambda: buf.set(21.0, at_indices=0), data=False)
    p.run(f"{tag}.finalize", lambda: buf.finalize(), data=False)
    p.run(f"{tag}.get() after finalize", lambda: buf.get())
    if not wild:
        p.run(
            f"{tag}.get(slice(-10,10),fill) after finalize",
            lambda: buf.get(slice(-10, 10), fill=F),
        )
    p.run(f"{tag}.get_state at end", lambda: buf.get_state()["data"])


def episode_data(ep):
    """The data of every track in `ep.get_state()` (no ids, spaces or times)."""
    state = ep.get_state()
    data = {k: state[k]["data"] for k in ("observations", "actions", "rewards", "infos")}
    data.update(
        {
            k: v["data"] if isinstance(v, dict) else v
            for k, v in (state["extra_model_outputs"] or {}).items()
        }
    )
    return data


def probe_episode(p, tag, ep, impl, heavy=True):
    """Reads, writes and block moves on episode `ep`."""
    p.allow(F, np.float32(F), obs(50), 51.0, 1, {"z": 1}, "z")
    n = p.run(f"{tag}.len", lambda: len(ep), data=False)
    if isinstance(n, int) and n > PLAUSIBLE_ROWS:
        return  # t - t_started set far apart: only the buffers' own sizes matter
    wild = False
    extras = getattr(ep, "extra_model_outputs", None)
    extras = list(extras.items()) if isinstance(extras, dict) else []
    tracks = ("observations", "actions", "rewards", "infos")
    for name, buf in [(track, getattr(ep, track, None)) for track in tracks] + extras:
        lb = getattr(buf, "lookback", 0)
        if isinstance(lb, int) and not isinstance(lb, bool) and lb < 0:
            p.problem(f"{tag}: the episode's {name} buffer has a negative lookback ({lb})")
        # Fill requests on a lookback far outside the data would build huge results.
        wild = wild or not isinstance(lb, int) or abs(lb) > PLAUSIBLE_ROWS
        k = getattr(buf, "len_incl_lookback", None)
        if k is not None:
            k = p.run(f"{tag}.{name}.len_incl_lookback", k, data=False)
            if isinstance(k, int) and k > PLAUSIBLE_ROWS:
                p.steps[-1]["problems"].append(f"implausible length {k}")
                return
    p.run(f"{tag}.get_observations()", lambda: ep.get_observations())
    p.run(f"{tag}.get_observations(-1)", lambda: ep.get_observations(-1))
    p.run(f"{tag}.get_actions()", lambda: ep.get_actions())
    p.run(
        f"{tag}.get_actions(-1,neg,fill)",
        lambda: ep.get_actions(-1, neg_index_as_lookback=True, fill=F),
    )
    p.run(f"{tag}.get_infos()", lambda: ep.get_infos())
    if not wild:
        p.run(
            f"{tag}.get_observations(slice(-10,10),fill)",
            lambda: ep.get_observations(slice(-10, 10), fill=F),
        )
        p.run(
            f"{tag}.get_observations(slice(-10,10),neg,fill)",
            lambda: ep.get_observations(slice(-10, 10), neg_index_as_lookback=True, fill=F),
        )
        p.run(
            f"{tag}.get_rewards(slice(-10,10),fill)",
            lambda: ep.get_rewards(slice(-10, 10), fill=F),
        )
        p.run(
            f"{tag}.get_extra_model_outputs(vf)",
            lambda: ep.get_extra_model_outputs("vf", slice(-10, 10), fill=F),
        )
    p.run(f"{tag}.get_state", lambda: episode_data(ep))
    p.run(f"{tag}.pickle5", lambda: episode_data(pickle.loads(pickle.dumps(ep, protocol=5))))
    p.run(f"{tag}.pickle2", lambda: episode_data(pickle.loads(pickle.dumps(ep, protocol=2))))
    p.run(f"{tag}.validate", lambda: ep.validate(), data=False)
    p.run(f"{tag}.repr", lambda: repr(ep), data=False)
    p.run(f"{tag}.get_return", lambda: ep.get_return(), data=False)
    p.run(f"{tag}.env_steps", lambda: ep.env_steps(), data=False)
    if not heavy or wild:
        return
    chunk = p.run(f"{tag}.cut(1)", lambda: ep.cut(len_lookback_buffer=1), data=False)
    if chunk is not None:
        p.run(
            f"{tag}.cut(1).get_observations(fill)",
            lambda: chunk.get_observations(slice(-10, 10), fill=F),
        )
    piece = p.run(f"{tag}[1:3]", lambda: ep[1:3], data=False)
    if piece is not None:
        p.run(
            f"{tag}[1:3].get_observations(neg,fill)",
            lambda: piece.get_observations(slice(-10, 10), neg_index_as_lookback=True, fill=F),
        )
    p.run(
        f"{tag}.add_env_step",
        lambda: ep.add_env_step(
            obs(50), 1, 51.0, infos={"z": 1}, extra_model_outputs={"vf": 51.0}
        ),
        data=False,
    )
    p.run(f"{tag}.to_numpy", lambda: ep.to_numpy(), data=False)
    p.run(
        f"{tag}.get_observations(slice(-10,10),fill) after to_numpy",
        lambda: ep.get_observations(slice(-10, 10), fill=F),
    )
    p.run(
        f"{tag}.get_data_dict",
        lambda: {
            k: v
            for k, v in ep.get_data_dict().items()
            if k not in ("eps_id", "t", "terminateds", "truncateds")
        },
    )
    if chunk is not None:
        p.run(f"{tag}.concat_episode(cut)", lambda: ep.concat_episode(chunk), data=False)
        p.run(f"{tag}.get_observations() after concat", lambda: ep.get_observations())


# -- indices of every type and size ---------------------------------------------------

NP_INTS = [
    np.int64(1),
    np.int32(-1),
    np.uint8(2),
    np.int64(-4),
    np.int16(0),
    np.uint64(2**64 - 1),
    np.int64(2**62),
    np.int64(-(2**63)),
]
HUGE_INTS = [2**63, -(2**63), 2**63 - 1, -(2**63) - 1, 2**64, -(2**64), 2**62, -(2**62), 2**100]
NOT_INDICES = [
    1.0,
    1.5,
    -0.0,
    float("nan"),
    "a",
    "0",
    b"x",
    (0, 1),
    np.array([0, 1]),
    np.array(0),
    {},
    set(),
    np.float64(1.0),
    np.bool_(True),
    range(2),
    object(),
    Ellipsis,
    1j,
    [0, "a"],
    [0, 1.5],
    [0, None],
    [[0]],
    [slice(0, 1)],
    [np.float64(0)],
    [object()],
]
# Slices whose fields are huge, zero, negative or not ints. With `fill`,
# those that ask for ~2**62 fill rows may raise instead (RLlib: MemoryError).
TOO_BIG = (MemoryError, OverflowError, ValueError, IndexError)
# slice -> (expected rows after the lookback of [1, 2, | 3, 4, 5] without fill, with fill F)
SLICES = {
    "[2**63:]": (slice(2**63, None), [], TOO_BIG),
    "[:2**64]": (slice(None, 2**64), [3.0, 4.0, 5.0], TOO_BIG),
    "[-2**63:2**63]": (slice(-(2**63), 2**63), DATA, TOO_BIG),
    "[-2**62:]": (slice(-(2**62), None), DATA, TOO_BIG),
    "[:2**62]": (slice(None, 2**62), [3.0, 4.0, 5.0], TOO_BIG),
    "[-2**62:-2**62+2]": (slice(-(2**62), -(2**62) + 2), [], [F, F]),
    "[2**62:2**62+2]": (slice(2**62, 2**62 + 2), [], [F, F]),
    "[2**63-2:2**63-1]": (slice(2**63 - 2, 2**63 - 1), [], [F]),
    "[-2**63:-2**63+3]": (slice(-(2**63), -(2**63) + 3), [], [F, F, F]),
    "[::2**63]": (slice(None, None, 2**63), [3.0], [3.0]),
    "[::-2**63]": (slice(None, None, -(2**63)), [], []),
    "[0:3:2**63-1]": (slice(0, 3, 2**63 - 1), [3.0], [3.0]),
    "[3:0:-2**63]": (slice(3, 0, -(2**63)), [5.0], [5.0]),
    "[0:3:0]": (slice(0, 3, 0), ZeroDivisionError, ZeroDivisionError),
    "[0:2**63:0]": (slice(0, 2**63, 0), ZeroDivisionError, ZeroDivisionError),
    "[::-1]": (slice(None, None, -1), [], []),
    "[-1:-4:-1]": (slice(-1, -4, -1), [5.0, 4.0, 3.0], [5.0, 4.0, 3.0]),
    "[5:-9]": (slice(5, -9), [], None),
    "[-9:-8]": (slice(-9, -8), [], [F]),
}
BAD_SLICES = [
    slice(1.5, 3),
    slice("a", None),
    slice(0, 3, 1.0),
    slice(None, None, "x"),
    slice(None, [1]),
    slice(np.float64(0), 2),
]


def as_rows(values, finalized):
    return np.array(values, dtype=np.float64) if finalized else list(values)


def _expect(want, finalized, fill_ok=()):
    """`ok` for a step expected to give `want` (a list of rows or an exception class)."""
    if want is None:
        return None
    if isinstance(want, tuple):
        return list(want)
    if isinstance(want, type):
        return [want]
    return [Value(as_rows(want, finalized))] + list(fill_ok)


def _same_outcome_as(fn):
    """`ok` saying: the same outcome as `fn()` (a reference call)."""
    try:
        return [Value(fn())]
    except Exception as e:
        return [type(e)]


def buffer_index_case(fixture, idx, kind, slice_spec=None):
    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(99.0, 98.0)
        buf = BUFFERS[fixture](impl)
        fin = fixture != "list"
        cmp = kind in ("bool", "huge", "slice", "huge_list", "empty")
        ok = ok_fill = ok_set = ok_pop = None
        if kind == "not_index":
            ok = ok_fill = ok_set = ok_pop = [TypeError, IndexError, AssertionError]
        elif kind == "huge":
            # Out of range at any size, in every storage (on numpy'ized data
            # RLlib overflows converting the index: a pinned difference).
            ok = ok_set = ok_pop = [IndexError]
            ok_fill = [Value(F)]
        elif kind == "huge_list" and fixture in ("list", "numpy"):
            ok = [IndexError]
            # Index 0 is the first row after the lookback of 2; the others are out of range.
            ok_fill = _expect([DATA[2] if i == 0 else F for i in idx], fin)
        elif kind == "np_int":
            ok = _same_outcome_as(lambda: BUFFERS[fixture](impl).get(int(idx)))
            ok_fill = _same_outcome_as(lambda: BUFFERS[fixture](impl).get(int(idx), fill=F))
        elif kind == "slice" and fixture in ("list", "numpy"):
            ok = _expect(slice_spec[1], fin)
            ok_fill = _expect(slice_spec[2], fin)
        elif kind == "empty":
            ok = ok_fill = [Value([])] if not fin else [ValueError]
        if fixture == "dict" and isinstance(idx, list) and idx:
            # RLlib takes new_data[i] for the i-th index before it looks at
            # the index: a dict of batches has no key i, whatever the index.
            ok_set = [KeyError]
        # Fill rows for rows of more than one dimension: a documented difference.
        cmp_fill = cmp and fixture in ("list", "numpy")
        p.run("get", lambda: buf.get(idx), ok=ok, cmp=cmp)
        p.run("get(fill)", lambda: buf.get(idx, fill=F), ok=ok_fill, cmp=cmp_fill)
        p.run(
            "get(neg,fill)",
            lambda: buf.get(idx, neg_index_as_lookback=True, fill=F),
            ok=ok_fill if kind in ("not_index", "empty", "huge", "huge_list") else None,
            cmp=cmp_fill,
        )
        p.run("[]", lambda: buf[idx], ok=ok, cmp=cmp)
        if fixture in ("list", "numpy"):
            # No space to one-hot with: RLlib's ValueError, unless the index fails first.
            ok_hot = {
                "not_index": [TypeError, IndexError, AssertionError, ValueError],
                "huge": [IndexError, ValueError],
            }.get(kind)
            p.run("get(one_hot)", lambda: buf.get(idx, one_hot_discrete=True), ok=ok_hot, cmp=cmp)
        # One new item per index (a batch of one for a slice), in the form the
        # buffer holds: a list before finalize(), arrays after.
        count = len(idx) if isinstance(idx, list) else 1
        batch = isinstance(idx, (list, slice))
        if fixture == "dict":
            value = (
                {"a": np.full(count, 99.0), "b": np.full((count, 2), 99)}
                if batch
                else {"a": 99.0, "b": np.array([99, 99])}
            )
        elif fixture == "rows":
            value = (
                np.full((count, 2), 99.0, np.float32) if batch else np.full(2, 99.0, np.float32)
            )
        elif batch:
            value = [99.0] * count if fixture == "list" else np.full(count, 99.0)
        else:
            value = 99.0
        # RLlib's set() on numpy'ized dict data fails inside (a documented
        # difference), except where it fails first on a list of indices.
        cmp_set = cmp and (fixture != "dict" or isinstance(idx, list))
        p.run(
            "set",
            lambda: buf.set(value, at_indices=idx),
            ok=ok_set,
            state=buf,
            data=False,
            cmp=cmp_set,
        )
        p.run(
            "set(neg)",
            lambda: buf.set(value, at_indices=idx, neg_index_as_lookback=True),
            ok=ok_set,
            state=buf,
            data=False,
            cmp=cmp_set,
        )
        p.run(
            "[]=",
            lambda: buf.__setitem__(idx, value),
            ok=ok_set,
            state=buf,
            data=False,
            cmp=cmp_set,
        )
        if not isinstance(idx, (slice, list)):
            # (RLlib's np.delete takes a bool as a mask: not compared)
            p.run(
                "pop",
                lambda: buf.pop(idx),
                ok=ok_pop,
                state=buf,
                data=False,
                cmp=cmp and kind != "huge" and not (fin and kind == "bool"),
            )
        # (RLlib sets some items of a list before failing on a later one: not compared)
        p.run("get() after", lambda: buf.get())
        probe_buffer(p, "buf", buf, impl, heavy=False)

    return run


def _index_cases():
    cases = [(f"bool-{i}", i, "bool", None) for i in (True, False)]
    cases += [(f"np-{type(i).__name__}({i})", i, "np_int", None) for i in NP_INTS]
    cases += [(f"huge({i})", i, "huge", None) for i in HUGE_INTS]
    cases += [(f"huge_list([{i}])", [i], "huge_list", None) for i in (2**63, -(2**63), 2**64)]
    cases += [(f"huge_list([0,{i}])", [0, i], "huge_list", None) for i in (2**62, -(2**62))]
    cases += [
        (f"not_index({type(i).__name__}:{token(i)})", i, "not_index", None) for i in NOT_INDICES
    ]
    cases += [(f"slice{name}", spec[0], "slice", spec) for name, spec in SLICES.items()]
    cases += [
        (f"bad_slice({s.start!r},{s.stop!r},{s.step!r})", s, "not_index", None) for s in BAD_SLICES
    ]
    cases += [("empty_list", [], "empty", None), ("None", None, "none", None)]
    return cases


for _fixture in ("list", "numpy", "rows", "dict"):
    for _name, _idx, _kind, _spec in _index_cases():
        add(
            "buffer_index",
            f"{_fixture}:{_name}",
            buffer_index_case(_fixture, _idx, _kind, _spec),
            rllib=_kind != "np_int",
        )


def episode_index_case(fixture, idx, kind):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(99.0, 2)
        ep = EPISODES[fixture](impl)
        cmp = kind in ("bool", "huge", "slice", "huge_list", "empty")
        ok = ok_fill = ok_set = None
        fin = fixture == "numpy"
        if kind == "not_index":
            ok = ok_fill = ok_set = [TypeError, IndexError, AssertionError]
        elif kind == "huge":
            # Out of range at any size (RLlib overflows on numpy'ized data: pinned).
            ok = ok_set = [IndexError]
            ok_fill = [Value(F)]
        # Observation rows have two values: fill rows for them are a documented
        # difference once numpy'ized.
        cmp_fill = cmp and not fin
        p.run("get_observations", lambda: ep.get_observations(idx), ok=ok, cmp=cmp)
        p.run(
            "get_observations(fill)",
            lambda: ep.get_observations(idx, fill=F),
            ok=ok_fill,
            cmp=cmp_fill,
        )
        p.run(
            "get_observations(neg,fill)",
            lambda: ep.get_observations(idx, neg_index_as_lookback=True, fill=F),
            cmp=cmp_fill,
        )
        p.run("get_actions", lambda: ep.get_actions(idx), ok=ok, cmp=cmp)
        p.run("get_actions(fill)", lambda: ep.get_actions(idx, fill=F), ok=ok_fill, cmp=cmp)
        p.run(
            "get_rewards(neg,fill)",
            lambda: ep.get_rewards(idx, neg_index_as_lookback=True, fill=F),
            cmp=cmp,
        )
        p.run("get_infos", lambda: ep.get_infos(idx), ok=ok, cmp=cmp)
        p.run(
            "get_extra_model_outputs",
            lambda: ep.get_extra_model_outputs("vf", idx),
            ok=ok,
            cmp=cmp,
        )
        p.run(
            "get_extra_model_outputs(fill)",
            lambda: ep.get_extra_model_outputs("vf", idx, fill=F),
            ok=ok_fill,
            cmp=cmp,
        )
        count = len(idx) if isinstance(idx, list) else 1
        batch = isinstance(idx, (list, slice))
        rewards = (np.full(count, 99.0) if fin else [99.0] * count) if batch else 99.0
        actions = (np.full(count, 2) if fin else [2] * count) if batch else 2
        p.run(
            "set_rewards",
            lambda: ep.set_rewards(new_data=rewards, at_indices=idx),
            ok=ok_set,
            state=ep,
            data=False,
            cmp=cmp,
        )
        p.run(
            "set_actions",
            lambda: ep.set_actions(new_data=actions, at_indices=idx),
            ok=ok_set,
            state=ep,
            data=False,
            cmp=cmp,
        )
        if isinstance(idx, slice):
            piece = p.run("ep[slice]", lambda: ep[idx], data=False, cmp=False)
            if piece is not None:
                probe_episode(p, "piece", piece, impl, heavy=False)
        else:
            p.run(
                "ep[not a slice]",
                lambda: ep[idx],
                ok=[TypeError, NotImplementedError],
                state=ep,
                data=False,
                cmp=False,
            )
        probe_episode(p, "ep", ep, impl, heavy=False)

    return run


for _fixture in ("list", "numpy"):
    for _name, _idx, _kind, _spec in _index_cases():
        add(
            "episode_index",
            f"{_fixture}:{_name}",
            episode_index_case(_fixture, _idx, _kind),
            rllib=_kind != "np_int",
        )


# -- lookbacks: negative, huge, not ints ---------------------------------------------------

LOOKBACKS = [
    -1,
    -2,
    -6,
    -100_000_000,
    -(2**62),
    -(2**63),
    2**60,
    2**60 + 1,
    2**62,
    2**63 - 1,
    2**63,
    1.5,
    "2",
    None,
    np.int64(-2),
    [1],
]


def _lookback_name(lb):
    return f"{type(lb).__name__}({token(lb)})"


LOOKBACK_MAX = 2**60  # the largest lookback a buffer keeps (RLlib takes any)


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def refused_lookback(lb):
    """True for a lookback that setting refuses with ValueError (an int below
    0 or above LOOKBACK_MAX): no buffer may read rows before its data."""
    return _is_int(lb) and not 0 <= lb <= LOOKBACK_MAX


def lookback_is(want):
    """`ok` for a step returning a buffer whose lookback is `want`."""
    return Check(
        lambda buf: None if buf.lookback == want else f"lookback {buf.lookback!r}, not {want}",
        f"a buffer with lookback {want}",
    )


def _lookback_ok(how, lb, rows):
    """The outcome of making a buffer of `rows` rows with lookback `lb`, `how`."""
    if not _is_int(lb):
        return [TypeError]
    if lb < 0:
        return [ValueError]
    if how == "constructor":
        return [lookback_is(min(lb, rows))]  # capped at the data's length, as RLlib
    if how == "sub_buffer":
        # Capped at the piece's 3 rows; the argument is a C index (64 bits).
        return [lookback_is(min(lb, 3))] + ([OverflowError] if lb >= 2**63 else [])
    return [ValueError] if lb > LOOKBACK_MAX else None


def _initial_data(fixture):
    if fixture == "list":
        return list(DATA)
    if fixture == "numpy":
        return np.array(DATA)
    if fixture == "rows":
        return np.array([[i, i + 0.5] for i in DATA], np.float32)
    return {"a": np.array(DATA), "b": np.array([[i, -i] for i in DATA], np.int64)}


def lookback_case(fixture, how, lb):
    def run(impl, p):
        allow_buffer_fixture(p)
        ok = _lookback_ok(how, lb, len(DATA))
        if how == "constructor":
            buf = p.run(
                "construct",
                lambda: impl.Buffer(_initial_data(fixture), lookback=lb),
                ok=ok,
                data=False,
            )
        elif how == "assign":
            buf = BUFFERS[fixture](impl)
            p.run(
                "assign lookback",
                lambda: setattr(buf, "lookback", lb),
                ok=ok,
                state=buf,
                data=False,
            )
        elif how == "from_state":
            state = BUFFERS[fixture](impl).get_state()
            state["lookback"] = lb
            buf = p.run("from_state", lambda: impl.Buffer.from_state(state), ok=ok, data=False)
        elif how == "pickle":
            good = BUFFERS[fixture](impl)
            fn, args = good.__reduce__()
            pos = [i for i, a in enumerate(args) if type(a) is int and a == good.lookback]
            if len(pos) != 1:
                p.problem(f"cannot find the lookback in the buffer's reduce args {args!r}")
                return
            args = list(args)
            args[pos[0]] = lb
            buf = p.run("restore", lambda: fn(*args), ok=ok, data=False)
        else:  # sub_buffer: the compiled core's public cpdef
            good = BUFFERS[fixture](impl)
            buf = p.run(
                "sub_buffer",
                lambda: good.sub_buffer(slice(0, 3), False, lb, None),
                ok=ok,
                state=good,
                data=False,
            )
            probe_buffer(p, "parent", good, impl, heavy=False)
        if buf is not None:
            probe_buffer(p, "buf", buf, impl)

    return run


for _how in ("constructor", "assign", "from_state", "pickle", "sub_buffer"):
    for _fixture in ("list", "numpy", "rows", "dict"):
        for _lb in LOOKBACKS:
            add(
                "buffer_lookback",
                f"{_how}:{_fixture}:{_lookback_name(_lb)}",
                lookback_case(_fixture, _how, _lb),
            )


def brief_concat_case(impl, p):
    """The issue's reproducer: a lookback far before the block, then concat.
    Both ways of making that buffer are refused; the buffer stays as it was."""
    allow_buffer_fixture(p)
    buf = BUFFERS["list"](impl)
    p.run(
        "assign lookback",
        lambda: setattr(buf, "lookback", -100_000_000),
        ok=[ValueError],
        state=buf,
        data=False,
    )
    other = _fresh_list(impl)
    p.allow(11.0, 12.0, 13.0)
    p.run("buf.concat(other)", lambda: buf.concat(other), data=False)
    p.run("other.concat(buf)", lambda: other.concat(buf), data=False)
    p.run("other.get()", lambda: other.get())
    p.run(
        "construct lookback=-2",
        lambda: impl.Buffer([1.0, 2.0, 3.0], lookback=-2),
        ok=[ValueError],
        data=False,
    )


add("buffer_lookback", "issue_reproducer", brief_concat_case)


# -- data of the wrong kind, shape or size -------------------------------------------------

GARBAGE_ITEMS = {
    "None": None,
    "str": "x",
    "long_str": "y" * 40,
    "bytes": b"z",
    "row3": np.full(3, 9.0),
    "row2x2": np.full((2, 2), 9.0),
    "row2_f32": np.full(2, 9.0, np.float32),
    "row2_i8": np.full(2, 9, np.int8),
    "row2_str": np.array(["q", "r"]),
    "dict": {"a": 9.0},
    "dict_b": {"a": 9.0, "b": np.array([9, 9])},
    "dict_extra": {"a": 9.0, "b": 9, "c": 9},
    "tuple": (9.0, 9.0),
    "big_int": 2**70,
    "nan": float("nan"),
    "complex": 9 + 9j,
    "object": object(),
    "f32": np.float32(9),
    "u64": np.uint64(2**64 - 1),
    "dt": np.datetime64("2020-01-09"),
    "0d_str_arr": np.array("w"),
    "0d_arr": np.array(9.0),
    "empty_arr": np.empty((0,)),
    "ragged": [np.full(2, 9.0), np.full(3, 9.0)],
    "big_array": np.full((3, 1000), 9.0),
    "readonly": np.broadcast_to(np.float64(9), (2,)),
    "noncontig": np.full((2, 4), 9.0)[:, ::2],
    "swapped": np.full(2, 9.0, ">f8"),
    "struct": np.array((9, 9.0), dtype=[("a", "i4"), ("b", "f8")]),
    "list": [9.0, 9.0],
}
GARBAGE_BATCHES = {
    "None": None,
    "int": 9,
    "str": "xyz",
    "list_of_None": [None, None],
    "rows3": np.full((2, 3), 9.0),
    "rows_f32": np.full((2, 2), 9.0, np.float32),
    "scalars": np.full(2, 9.0),
    "empty": [],
    "empty_arr": np.empty((0, 2)),
    "dict": {"a": np.full(2, 9.0)},
    "dict_ragged": {"a": np.full(2, 9.0), "b": np.full((3, 2), 9)},
    "gen": "gen",
    "ragged_list": [np.full(2, 9.0), np.full(3, 9.0)],
    "strs": ["q", "rrrrrrrrrrrr"],
    "objects": np.array([None, 9.0], dtype=object),
    "0d": np.array(9.0),
}


def fresh(x):
    """A copy of module-level garbage `x`, so that no case sees what another
    one changed (read-only arrays cannot change and stay as they are)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return x
    try:
        return copy.deepcopy(x)
    except Exception:
        return x


def _item_allowed(p, item):
    p.allow(item, 9, 9.0, "q", "r", "w", "x", "y" * 40, "xyz", "z", b"z", "rrrrrrrrrrrr")
    arr = np.asarray(item) if isinstance(item, (np.ndarray, np.generic)) else None
    if arr is not None and arr.dtype.kind in "mM":
        p.allow(arr.astype(np.int64))  # a date stored into numbers is its count of units


def buffer_append_case(fixture, name, garbage_item):
    def run(impl, p):
        allow_buffer_fixture(p)
        _item_allowed(p, garbage_item)
        buf = BUFFERS[fixture](impl)
        item = fresh(garbage_item)
        p.run("append", lambda: buf.append(item), state=buf, data=False)
        p.run("get(-1)", lambda: buf.get(-1))
        if impl.ours:
            p.run("check_append", lambda: buf.check_append(item), data=False)
        probe_buffer(p, "buf", buf, impl)

    return run


def buffer_extend_case(fixture, name, items):
    def run(impl, p):
        allow_buffer_fixture(p)
        _item_allowed(p, items)
        buf = BUFFERS[fixture](impl)
        batch = (x for x in [9.0, 9.0]) if name == "gen" else fresh(items)
        p.run("extend", lambda: buf.extend(batch), state=buf, data=False)
        probe_buffer(p, "buf", buf, impl)

    return run


def buffer_set_case(fixture, name, garbage_item):
    def run(impl, p):
        allow_buffer_fixture(p)
        _item_allowed(p, garbage_item)
        buf = BUFFERS[fixture](impl)
        item = fresh(garbage_item)
        p.run("set(0)", lambda: buf.set(item, at_indices=0), state=buf, data=False)
        p.run(
            "set([0,1])", lambda: buf.set([item, item], at_indices=[0, 1]), state=buf, data=False
        )
        p.run(
            "set(slice(0,2))",
            lambda: buf.set([item, item], at_indices=slice(0, 2)),
            state=buf,
            data=False,
        )
        p.run(
            "set(slice(0,2)) batch",
            lambda: buf.set(item, at_indices=slice(0, 2)),
            state=buf,
            data=False,
        )
        p.run("set(None)", lambda: buf.set(item), state=buf, data=False)
        probe_buffer(p, "buf", buf, impl, heavy=False)

    return run


def buffer_fill_case(fixture, name, fill):
    def run(impl, p):
        allow_buffer_fixture(p)
        _item_allowed(p, fill)
        buf = BUFFERS[fixture](impl)
        p.run("get(slice(-9,9),fill)", lambda: buf.get(slice(-9, 9), fill=fill), state=buf)
        p.run("get(slice(7,9),fill)", lambda: buf.get(slice(7, 9), fill=fill), state=buf)
        p.run("get(-9,fill)", lambda: buf.get(-9, fill=fill), state=buf)
        p.run("get([0,-9],fill)", lambda: buf.get([0, -9], fill=fill), state=buf)
        p.run(
            "get(slice(-9,9),neg,fill)",
            lambda: buf.get(slice(-9, 9), neg_index_as_lookback=True, fill=fill),
            state=buf,
        )

    return run


for _fixture in ("list", "numpy", "rows", "dict"):
    for _name, _item in GARBAGE_ITEMS.items():
        add(
            "buffer_data", f"append:{_fixture}:{_name}", buffer_append_case(_fixture, _name, _item)
        )
        add("buffer_data", f"set:{_fixture}:{_name}", buffer_set_case(_fixture, _name, _item))
        if _fixture in ("numpy", "rows"):
            add(
                "buffer_data", f"fill:{_fixture}:{_name}", buffer_fill_case(_fixture, _name, _item)
            )
    for _name, _items in GARBAGE_BATCHES.items():
        add(
            "buffer_data",
            f"extend:{_fixture}:{_name}",
            buffer_extend_case(_fixture, _name, _items),
        )


def operator_case(fixture, name, other):
    """`buf + other` and `buf == other` with garbage on the right."""

    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(9.0, 1.0, "a", "b", "c")
        buf = BUFFERS[fixture](impl)
        value = other(impl, p) if callable(other) else fresh(other)
        if value is REFUSED:
            return
        # `+ number` adds it to each item; `list + array` is numpy's sum
        p.allow([d + x for d in DATA for x in (5, 9.0, 1j)], [obs(t) for t in range(6)])
        total = p.run("+", lambda: buf + value, state=buf, data=False)
        if total is not None and hasattr(total, "get"):
            probe_buffer(p, "sum", total, impl, heavy=False)
        p.run("==", lambda: buf == value, data=False)
        p.run("!=", lambda: buf != value, data=False)

    return run


OPERANDS = {
    "int": 5,
    "float": 9.0,
    "complex": 1j,
    "str": "abc",
    "None": None,
    "list": [9.0],
    "array": np.array([9.0]),
    "dict": {"a": 9.0},
    "buffer_numpy": lambda impl, p: buf_numpy(impl),
    "buffer_neg_lookback": lambda impl, p: _refused_lookback_buffer(p, impl, -100_000_000),
    "buffer_str": lambda impl, p: impl.Buffer(["a", "b", "c"], lookback=1),
}
for _fixture in BUFFERS:
    for _name, _other in OPERANDS.items():
        add("buffer_data", f"operator:{_fixture}:{_name}", operator_case(_fixture, _name, _other))


def sub_buffer_case(fixture, name, args):
    """The compiled core's public `sub_buffer(slice, neg_index_as_lookback, lookback, space)`."""

    def run(impl, p):
        allow_buffer_fixture(p)
        buf = BUFFERS[fixture](impl)
        piece = p.run("sub_buffer", lambda: buf.sub_buffer(*args), state=buf, data=False)
        if piece is not None:
            probe_buffer(p, "piece", piece, impl)
        probe_buffer(p, "buf", buf, impl, heavy=False)

    return run


SUB_BUFFER_ARGS = {
    "slice_huge": (slice(0, 2**63), False, 0, None),
    "slice_wrapping": (slice(2**63 - 2, 2**63 - 1), True, 1, None),
    "slice_step0": (slice(0, 3, 0), False, 0, None),
    "slice_back": (slice(4, 0, -1), False, 1, None),
    "slice_floats": (slice(0.5, 2), False, 0, None),
    "not_a_slice": ([0, 1], False, 0, None),
    "none": (None, False, 0, None),
    "lookback_over_len": (slice(0, 2), False, 10, None),
    "space_str": (slice(0, 2), False, 0, "space"),
    "space_mismatch": (slice(0, 2), False, 0, gym.spaces.Box(0, 1, (7,))),
    "neg_lookback_before_start": (slice(-9, 2), True, 3, None),
}
for _fixture in BUFFERS:
    for _name, _args in SUB_BUFFER_ARGS.items():
        add(
            "buffer_attrs",
            f"sub_buffer:{_fixture}:{_name}",
            sub_buffer_case(_fixture, _name, _args),
        )


def _other_buffers(impl):
    """Buffers to concat: every storage kind, and lookbacks at the edges."""
    out = {}
    for name, fixture in BUFFERS.items():
        out[name] = fixture(impl)
    out["str_list"] = impl.Buffer(["q", "rrrrrrrrrrrr"], lookback=0)
    out["str_numpy"] = impl.Buffer(["q", "rrrrrrrrrrrr"], lookback=0)
    out["str_numpy"].finalize()
    out["f32_list"] = impl.Buffer([np.float32(9), np.float32(9)], lookback=1)
    out["int_list"] = impl.Buffer([9, 9, 9], lookback=3)
    out["empty"] = impl.Buffer()
    out["empty_numpy"] = buf_empty(impl)
    out["all_lookback"] = impl.Buffer([9.0, 9.0], lookback=2)
    return out


def concat_case(fixture, other_name):
    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(9, 9.0, "q", "rrrrrrrrrrrr")
        buf = BUFFERS[fixture](impl)
        other = _other_buffers(impl)[other_name]
        p.run("concat", lambda: buf.concat(other), state=buf, data=False)
        p.run("get()", lambda: buf.get())
        probe_buffer(p, "buf", buf, impl, heavy=False)
        probe_buffer(p, "other", other, impl, heavy=False)

    return run


for _fixture in BUFFERS:
    for _other in (
        "list",
        "numpy",
        "rows",
        "dict",
        "str_list",
        "str_numpy",
        "f32_list",
        "int_list",
        "empty",
        "empty_numpy",
        "all_lookback",
    ):
        add("buffer_data", f"concat:{_fixture}<-{_other}", concat_case(_fixture, _other))


def concat_garbage_case(fixture, other):
    def run(impl, p):
        allow_buffer_fixture(p)
        buf = BUFFERS[fixture](impl)
        p.run(
            "concat",
            lambda: buf.concat(other() if callable(other) else other),
            state=buf,
            data=False,
        )
        p.run("concat(self)", lambda: buf.concat(buf), data=False)
        probe_buffer(p, "buf", buf, impl, heavy=False)

    return run


for _fixture in BUFFERS:
    for _name, _other in {
        "None": None,
        "list": [1.0],
        "int": 5,
        "str": "abc",
        "array": np.array([1.0]),
    }.items():
        add(
            "buffer_data",
            f"concat_garbage:{_fixture}:{_name}",
            concat_garbage_case(_fixture, _other),
        )


def attribute_case(fixture, attr, value):
    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(9, 9.0, "q", "rr")
        buf = BUFFERS[fixture](impl)
        val = value(impl) if callable(value) else fresh(value)
        # The storage is read-only: _set_storage (below) checks what it takes.
        ok = [AttributeError] if attr in ("_col", "_tree") else None
        p.run(f"set {attr}", lambda: setattr(buf, attr, val), ok=ok, state=buf, data=False)
        probe_buffer(p, "buf", buf, impl)

    return run


def set_storage_case(fixture, name):
    """The core's `_set_storage(tree)`: one Column, or one dict/tuple of
    Columns of one length and one mode; anything else is refused, nothing changed."""

    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(9, 9.0, "q", "rr")
        buf = BUFFERS[fixture](impl)
        tree, ok = STORAGES[name]
        tree = tree(impl) if callable(tree) else fresh(tree)
        p.run("_set_storage", lambda: buf._set_storage(tree), ok=ok, state=buf, data=False)
        probe_buffer(p, "buf", buf, impl)

    return run


def _column_of(impl, data):
    from episode._column import Column

    return Column.from_array(np.asarray(data))


BUFFER_ATTRS = {
    "_col": {
        "None": None,
        "int": 5,
        "list": [1.0],
        "array": np.array([9.0]),
        "col_str": lambda impl: _column_of(impl, np.array(["q", "rr"])),
        "col_2d": lambda impl: _column_of(impl, np.full((3, 3), 9.0)),
        "col_empty": lambda impl: _column_of(impl, np.empty((0, 7))),
        "col_object": lambda impl: _column_of(impl, np.array([None, 9.0], dtype=object)),
    },
    "_tree": {
        "None": None,
        "int": 5,
        "list": [1, 2],
        "dict_of_ints": {"a": 1},
        "ragged_cols": lambda impl: {
            "a": _column_of(impl, np.full(5, 9.0)),
            "b": _column_of(impl, np.full(2, 9.0)),
        },
        "empty_dict": {},
        "tuple": (None,),
    },
    "data": {
        "None": None,
        "int": 5,
        "str": "abc",
        "0d": np.array(9.0),
        "ragged_dict": {"a": [9.0, 9.0], "b": [9.0]},
        "list_of_None": [None],
        "object": np.array([None, 9.0], dtype=object),
        "empty": np.empty((0, 2)),
        "dict_empty": {},
        "64d": np.full((1,) * 64, 9.0),
    },
    "finalized": {"False": False, "str": "x", "None": None},
    "space": {
        "str": "x",
        "int": 5,
        "box_bad_shape": gym.spaces.Box(0, 1, (7,)),
        "discrete": gym.spaces.Discrete(2),
        "dict": gym.spaces.Dict({"z": gym.spaces.Discrete(2)}),
    },
    "_space": {"str": "x"},
    "_space_struct": {"int": 5, "box": gym.spaces.Box(0, 1, (7,))},
}


def _list_column(impl, items):
    from episode._column import Column

    return Column.from_list(items)


ACCEPTED = [Value(None)]
STORAGES = {  # name -> (tree, ok)
    "None": (None, [TypeError]),
    "int": (5, [TypeError]),
    "list": ([1.0], [TypeError]),
    "col_str": (lambda impl: _column_of(impl, np.array(["q", "rr"])), ACCEPTED),
    "col_2d": (lambda impl: _column_of(impl, np.full((3, 3), 9.0)), ACCEPTED),
    "col_empty": (lambda impl: _column_of(impl, np.empty((0, 7))), ACCEPTED),
    "col_list_mode": (lambda impl: _list_column(impl, [9.0, 9.0]), ACCEPTED),
    "tree_list": ([1, 2], [TypeError]),
    "tree_of_ints": ({"a": 1}, [TypeError]),
    "tree_of_None": ((None,), [TypeError]),
    "tree_list_mode": (lambda impl: {"a": _list_column(impl, [9.0]),
                                     "b": _list_column(impl, [9])}, ACCEPTED),
    "tree_mixed_modes": (
        lambda impl: {"a": _list_column(impl, [9.0]), "b": _column_of(impl, np.full(1, 9.0))},
        [ValueError],
    ),
    "tree_shared_leaf": (
        lambda impl: (lambda col: {"a": col, "b": col})(_column_of(impl, np.full(2, 9.0))),
        [ValueError],
    ),
    "tree_list_mode_ordered": (
        lambda impl: OrderedDict(a=_list_column(impl, [9.0])), [TypeError]),
    "tree_ragged": (
        lambda impl: {
            "a": _column_of(impl, np.full(5, 9.0)),
            "b": _column_of(impl, np.full(2, 9.0)),
        },
        [ValueError],
    ),
    "tree": (
        lambda impl: {
            "a": _column_of(impl, np.full(5, 9.0)),
            "b": _column_of(impl, np.full((5, 2), 9)),
        },
        ACCEPTED,
    ),
    "tree_ordered": (
        lambda impl: OrderedDict(b=_column_of(impl, np.full(2, 9.0)),
                                 a=_column_of(impl, np.full(2, 9))),
        ACCEPTED,
    ),
    "tree_nested": (
        lambda impl: ({"a": _column_of(impl, np.full(2, 9.0))}, _column_of(impl, np.full(2, 9))),
        ACCEPTED,
    ),
    "tree_empty": ({}, [ValueError]),
}
for _fixture in BUFFERS:
    for _name in STORAGES:
        add("buffer_attrs", f"{_fixture}:_set_storage:{_name}", set_storage_case(_fixture, _name))

for _fixture in BUFFERS:
    for _attr, _values in BUFFER_ATTRS.items():
        for _name, _value in _values.items():
            add(
                "buffer_attrs",
                f"{_fixture}:{_attr}={_name}",
                attribute_case(_fixture, _attr, _value),
            )


def one_hot_case(values, space, finalized, ok=None):
    def run(impl, p):
        p.allow(values, 0, 1, 0.0, 1.0, F)
        buf = impl.Buffer(list(values), lookback=1, space=space)
        if finalized:
            buf.finalize()
        p.run("get(one_hot)", lambda: buf.get(one_hot_discrete=True), ok=ok, cmp=True)
        p.run(
            "get(slice(-5,5),one_hot,fill)",
            lambda: buf.get(slice(-5, 5), one_hot_discrete=True, fill=0),
            ok=ok,
            cmp=True,
        )
        p.run("get(-1,one_hot)", lambda: buf.get(-1, one_hot_discrete=True), ok=ok, cmp=True)
        p.run(
            "get([0,9],one_hot,fill)",
            lambda: buf.get([0, 9], one_hot_discrete=True, fill=0),
            ok=ok,
            cmp=True,
        )

    return run


ONE_HOT = {
    "discrete_out_of_range": ([1, 2, 5, 7], gym.spaces.Discrete(3)),
    "discrete_negative": ([1, 2, -1, -(2**40)], gym.spaces.Discrete(3)),
    "discrete_huge": ([1, 2**62, 2**63 - 1], gym.spaces.Discrete(3)),
    "discrete_float": ([1, 1.5, 2.0], gym.spaces.Discrete(3)),
    "multidiscrete_bad": ([np.array([1, 9]), np.array([-1, 0])], gym.spaces.MultiDiscrete([2, 2])),
    "box": ([np.full(2, 0.5)] * 3, gym.spaces.Box(0, 1, (2,))),
    "discrete_start": ([1, 2, 3], gym.spaces.Discrete(3, start=-5)),
}
# Every step of these reads a value that is not an integer: IndexError, as
# RLlib's for a float array (for Python floats RLlib fails on float.dtype,
# AttributeError: a pinned difference).
ONE_HOT_OK = {"discrete_float": [IndexError]}
for _name, (_values, _space) in ONE_HOT.items():
    for _fin in (False, True):
        add(
            "buffer_data",
            f"one_hot:{_name}:{'numpy' if _fin else 'list'}",
            one_hot_case(_values, _space, _fin, ONE_HOT_OK.get(_name)),
            rllib=True,
        )


def buffer_constructor_case(data, lookback, space):
    def run(impl, p):
        p.allow(9, 9.0, F, "q")
        d = data() if callable(data) else fresh(data)
        buf = p.run(
            "construct", lambda: impl.Buffer(d, lookback=lookback, space=space), data=False
        )
        if buf is not None:
            probe_buffer(p, "buf", buf, impl)

    return run


CONSTRUCTOR_DATA = {
    "int": 5,
    "str": "abc",
    "bytes": b"abc",
    "0d": np.array(9.0),
    "set": {9.0},
    "gen": lambda: (x for x in [9.0]),
    "dict_ragged": {"a": [9.0, 9.0], "b": [9.0]},
    "dict_scalar": {"a": 9.0},
    "tuple": (9.0, 9.0),
    "object_array": np.array([None, 9.0], dtype=object),
    "empty_rows": np.empty((0, 3)),
    "zero_width": np.empty((4, 0)),
    "64d": np.full((1,) * 64, 9.0),
    "list_mixed": [9.0, "q", None, np.full(2, 9.0)],
    "readonly": np.broadcast_to(9.0, (4,)),
    "swapped": np.full(4, 9.0, ">f8"),
    "noncontig": np.full((4, 4), 9.0)[::2, ::2],
}
for _name, _data in CONSTRUCTOR_DATA.items():
    for _lb in (0, 2, -1, 2**63 - 1):
        for _space_name, _space in (
            ("none", None),
            ("discrete", gym.spaces.Discrete(3)),
            ("str", "space"),
        ):
            add(
                "buffer_attrs",
                f"constructor:{_name}:lookback={_lb}:space={_space_name}",
                buffer_constructor_case(_data, _lb, _space),
            )


# -- episodes: lookbacks, attributes, states, pickles, set_* ---------------------------------


def episode_lookback_case(how, lb):
    # A negative len_lookback_buffer, or a lookback no buffer takes in a
    # state, raises ValueError; cut() asserts, as RLlib's.
    neg = _is_int(lb) and lb < 0
    refused = [AssertionError] if neg and how.startswith("cut") else [ValueError]
    ok = refused if neg or how.startswith("from_state") and refused_lookback(lb) else None

    def run(impl, p):
        allow_episode_fixture(p)
        if how == "constructor":
            ep = p.run(
                "construct",
                lambda: impl.Episode(
                    observations=[obs(t) for t in range(6)],
                    actions=[1, 2, 3, 1, 2],
                    rewards=[1.25, 2.25, 3.25, 4.25, 5.25],
                    infos=[{"t": t} for t in range(6)],
                    extra_model_outputs={"vf": [11.0, 12.0, 13.0, 14.0, 15.0]},
                    len_lookback_buffer=lb,
                ),
                ok=ok,
                data=False,
            )
        elif how in ("slice", "slice_numpy"):
            src = make_episode(impl, numpy=how == "slice_numpy")
            ep = p.run(
                "slice",
                lambda: src.slice(slice(1, 4), len_lookback_buffer=lb),
                ok=ok,
                state=src,
                data=False,
            )
            probe_episode(p, "source", src, impl, heavy=False)
        elif how in ("cut", "cut_numpy"):
            src = make_episode(impl, numpy=how == "cut_numpy")
            ep = p.run(
                "cut", lambda: src.cut(len_lookback_buffer=lb), ok=ok, state=src, data=False
            )
        else:  # from_state with a garbage lookback in every buffer
            state = make_episode(impl, numpy=how == "from_state_numpy").get_state()
            for key in ("observations", "actions", "rewards", "infos"):
                state[key]["lookback"] = lb
            ep = p.run("from_state", lambda: impl.Episode.from_state(state), ok=ok, data=False)
        if ep is not None:
            probe_episode(p, "ep", ep, impl)

    return run


for _how in (
    "constructor",
    "slice",
    "slice_numpy",
    "cut",
    "cut_numpy",
    "from_state",
    "from_state_numpy",
):
    for _lb in LOOKBACKS + [-5, True, "auto", 0, 5, 6]:
        add("episode_lookback", f"{_how}:{_lookback_name(_lb)}", episode_lookback_case(_how, _lb))


REFUSED = object()  # a garbage value whose making was refused (see below)


def _refused_lookback_buffer(p, impl, lb):
    """A buffer of observations given lookback `lb` (below 0 or above
    LOOKBACK_MAX): refused with ValueError, the buffer unchanged. Returns
    REFUSED: a case then has no such buffer to go on with."""
    buf = impl.Buffer([obs(t) for t in range(6)], lookback=2)
    p.run(
        f"buffer.lookback={lb}",
        lambda: setattr(buf, "lookback", lb),
        ok=[ValueError],
        state=buf,
        data=False,
    )
    return REFUSED


EPISODE_ATTRS = {
    "t": [-1, -5, 0, 3, 2**62, 2**63 - 1, 2**63, -(2**63), 1.5, "x", None],
    "t_started": [-1, 6, 7, 2**62, -(2**62), 2**63, 1.5, None],
    "observations": [
        None,
        5,
        "x",
        [1.0],
        np.array([1.0]),
        "short_buffer",
        "neg_lookback_buffer",
        "huge_lookback_buffer",
        "raw_core",
        "str_buffer",
    ],
    "actions": [None, 5, "short_buffer", "neg_lookback_buffer", "raw_core"],
    "rewards": [None, "x", "short_buffer", "neg_lookback_buffer", "raw_core"],
    "infos": [None, "short_buffer", "neg_lookback_buffer", "raw_core"],
    "extra_model_outputs": [
        None,
        5,
        [],
        {"vf": None},
        {"vf": 5},
        {"vf": "neg_lookback_buffer"},
        {"vf": "short_buffer"},
        "defaultdict_int",
    ],
    "is_terminated": ["x", None, np.array([True, False])],
    "_observation_space": ["x", gym.spaces.Box(0, 1, (7,)), gym.spaces.Discrete(2)],
    "_action_space": ["x", gym.spaces.Discrete(1)],
    "_start_time": ["x", -1.0, float("nan")],
    "_last_step_time": ["x"],
    "_custom_data": [None, 5],
    "id_": [None, 5, object()],
    "_last_added_observation": [None, object()],
}


def _attr_value(impl, value, p):
    """The garbage value `value` names (REFUSED if making it was refused)."""
    if not isinstance(value, str):
        if isinstance(value, dict):
            out = {k: _attr_value(impl, v, p) for k, v in value.items()}
            return REFUSED if any(v is REFUSED for v in out.values()) else out
        return value
    if value == "short_buffer":
        return impl.Buffer([9.0], lookback=0)
    if value == "neg_lookback_buffer":
        return _refused_lookback_buffer(p, impl, -100_000_000)
    if value == "huge_lookback_buffer":
        return _refused_lookback_buffer(p, impl, 2**62)
    if value == "raw_core":
        from episode._buffer import BufferCore

        return BufferCore()
    if value == "str_buffer":
        return impl.Buffer(["q", "rr", "sss", "t", "uu", "v"], lookback=0)
    if value == "defaultdict_int":
        return collections.defaultdict(int)
    return value


def _counter_ok(attr, value):
    """t and t_started are 64-bit counters: a bigger int raises OverflowError
    (a pinned difference: RLlib keeps any int)."""
    if attr in ("t", "t_started") and _is_int(value) and not -(2**63) <= value < 2**63:
        return [OverflowError]
    return None


def episode_attribute_case(fixture, attr, value):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0, "q", "rr", "sss", "t", "uu", "v")
        ep = EPISODES[fixture](impl)
        val = _attr_value(impl, value, p)
        if val is not REFUSED:
            p.run(
                f"set {attr}",
                lambda: setattr(ep, attr, val),
                ok=_counter_ok(attr, val),
                state=ep,
                data=False,
            )
        probe_episode(p, "ep", ep, impl)

    return run


for _fixture in EPISODES:
    for _attr, _values in EPISODE_ATTRS.items():
        for _value in _values:
            add(
                "episode_attrs",
                f"{_fixture}:{_attr}={token(_value)}",
                episode_attribute_case(_fixture, _attr, _value),
            )


STATE_GARBAGE = {"None": None, "neg": -3, "huge": 2**63, "str": "x", "list": []}
BUFFER_STATE_GARBAGE = {
    "data=None": ("data", None),
    "data=5": ("data", 5),
    "data=str": ("data", "abc"),
    "data=ragged": ("data", [np.full(2, 9.0), np.full(3, 9.0)]),
    "data=0d": ("data", np.array(9.0)),
    "data=short": ("data", [9.0]),
    "data=long": ("data", [9.0] * 12),
    "data=empty": ("data", []),
    "data=object": ("data", np.array([None] * 6, dtype=object)),
    "finalized=str": ("finalized", "x"),
    "finalized=None": ("finalized", None),
    "space=garbage": ("space", {"type": "nope"}),
    "space=int": ("space", 5),
    "lookback=None": ("lookback", None),
    "lookback=-1": ("lookback", -1),
    "lookback=2**63": ("lookback", 2**63),
    "lookback=huge": ("lookback", 2**62),
    "missing_data": ("data", KeyError),
    "missing_lookback": ("lookback", KeyError),
}


def episode_state_case(fixture, key, value):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0)
        state = EPISODES[fixture](impl).get_state()
        if value is KeyError:
            del state[key]
        else:
            state[key] = fresh(value)
        ep = p.run(
            "from_state",
            lambda: impl.Episode.from_state(state),
            ok=_counter_ok(key, value),
            data=False,
        )
        if ep is not None:
            probe_episode(p, "ep", ep, impl)

    return run


def episode_buffer_state_case(fixture, track, key, value):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0)
        state = EPISODES[fixture](impl).get_state()
        sub = state[track] if track != "vf" else state["extra_model_outputs"]["vf"]
        if value is KeyError:
            del sub[key]
        else:
            sub[key] = fresh(value)
        ok = [ValueError] if key == "lookback" and refused_lookback(value) else None
        ep = p.run("from_state", lambda: impl.Episode.from_state(state), ok=ok, data=False)
        if ep is not None:
            probe_episode(p, "ep", ep, impl)
        buf = p.run("buffer from_state", lambda: impl.Buffer.from_state(sub), ok=ok, data=False)
        if buf is not None:
            probe_buffer(p, "buf", buf, impl)

    return run


_STATE_KEYS = [
    "id_",
    "agent_id",
    "observations",
    "actions",
    "rewards",
    "infos",
    "extra_model_outputs",
    "is_terminated",
    "is_truncated",
    "t_started",
    "t",
    "_observation_space",
    "_action_space",
    "_start_time",
    "_last_step_time",
    "custom_data",
]
for _fixture in EPISODES:
    for _key in _STATE_KEYS:
        add(
            "episode_state",
            f"{_fixture}:missing:{_key}",
            episode_state_case(_fixture, _key, KeyError),
        )
        for _name, _value in STATE_GARBAGE.items():
            add(
                "episode_state",
                f"{_fixture}:{_key}={_name}",
                episode_state_case(_fixture, _key, _value),
            )
    for _track in ("observations", "actions", "rewards", "infos", "vf"):
        for _name, (_key, _value) in BUFFER_STATE_GARBAGE.items():
            add(
                "episode_state",
                f"{_fixture}:{_track}.{_name}",
                episode_buffer_state_case(_fixture, _track, _key, _value),
            )


def len_outcome(t, t_started):
    """What len() of an episode with these counters gives: t - t_started, or
    the errors Python raises for a __len__ below 0 or past a C index (as
    RLlib's len(), which returns that difference)."""
    n = t - t_started
    if n < 0:
        return [ValueError]
    if n >= 2**63:
        return [OverflowError]
    return [Value(n)]


def episode_t_case(fixture, t, t_started):
    """from_state with inconsistent step counters (len would be negative or huge)."""

    def run(impl, p):
        allow_episode_fixture(p)
        state = EPISODES[fixture](impl).get_state()
        state["t"], state["t_started"] = t, t_started
        ep = p.run("from_state", lambda: impl.Episode.from_state(state), data=False)
        if ep is not None:
            p.run("len", lambda: len(ep), ok=len_outcome(t, t_started), data=False)
            probe_episode(p, "ep", ep, impl)

    return run


for _fixture in EPISODES:
    for _t, _ts in [
        (0, 3),
        (4, 5),
        (5, 0),
        (3, 3),
        (-1, 0),
        (2**62, 0),
        (0, 2**62),
        (-(2**62), 2**62),
        (2**63 - 1, -1),
        (5, -(2**63)),
    ]:
        add(
            "episode_state",
            f"{_fixture}:t={_t},t_started={_ts}",
            episode_t_case(_fixture, _t, _ts),
        )


def episode_reduce_case(fixture, garbage_name):
    """Every field of the episode's pickle replaced by garbage, one at a time."""

    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0)
        fn, args = EPISODES[fixture](impl).__reduce__()
        if _attr_value(impl, REDUCE_GARBAGE[garbage_name], p) is REFUSED:
            return
        flat = list(args)
        # The reduce args may nest the field values in a tuple: corrupt those.
        targets = [(i, None) for i in range(len(flat))]
        for i, a in enumerate(flat):
            if type(a) is tuple:
                targets += [(i, j) for j in range(len(a))]
        for i, j in targets:
            args2 = list(flat)
            garbage = _attr_value(impl, REDUCE_GARBAGE[garbage_name], p)
            if j is None:
                args2[i] = garbage
            else:
                inner = list(args2[i])
                inner[j] = garbage
                args2[i] = tuple(inner)
            ep = p.run(f"restore[{i},{j}]", lambda: fn(*args2), data=False)
            if ep is not None and not isinstance(ep, (int, float, str, type(None))):
                probe_episode(p, f"ep[{i},{j}]", ep, impl, heavy=False)

    return run


REDUCE_GARBAGE = {
    "None": None,
    "neg": -1,
    "huge": 2**62,
    "too_big": 2**63,
    "str": "x",
    "short_buffer": "short_buffer",
    "neg_lookback_buffer": "neg_lookback_buffer",
    "dict": {"vf": "neg_lookback_buffer"},
}
for _fixture in EPISODES:
    for _name in REDUCE_GARBAGE:
        add("episode_pickle", f"{_fixture}:{_name}", episode_reduce_case(_fixture, _name))


def buffer_reduce_case(fixture, garbage_name):
    def run(impl, p):
        allow_buffer_fixture(p)
        p.allow(9.0)
        good = BUFFERS[fixture](impl)
        fn, args = good.__reduce__()
        if _attr_value(impl, REDUCE_GARBAGE[garbage_name], p) is REFUSED:
            return
        for i in range(len(args)):
            args2 = list(args)
            args2[i] = _attr_value(impl, REDUCE_GARBAGE[garbage_name], p)
            at_lookback = type(args[i]) is int and args[i] == good.lookback
            ok = [ValueError] if at_lookback and refused_lookback(args2[i]) else None
            buf = p.run(f"restore[{i}]", lambda: fn(*args2), ok=ok, data=False)
            if buf is not None and hasattr(buf, "get"):
                probe_buffer(p, f"buf[{i}]", buf, impl, heavy=True)

    return run


for _fixture in BUFFERS:
    for _name in REDUCE_GARBAGE:
        add("buffer_pickle", f"{_fixture}:{_name}", buffer_reduce_case(_fixture, _name))


class Reduced:
    """Pickles as `fn(*args)`: a pickle edited by hand."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _replaced(x, old, new, done):
    """`x` (nested tuples, lists and dicts) with the object `old` replaced by
    `new`; each replacement appends to `done`."""
    if x is old:
        done.append(new)
        return new
    if type(x) in (tuple, list):
        return type(x)(_replaced(v, old, new, done) for v in x)
    if type(x) is dict:
        return {k: _replaced(v, old, new, done) for k, v in x.items()}
    return x


def episode_pickle_lookback_case(fixture, track, lb):
    """An episode's pickle whose `track` buffer pickles with lookback `lb`:
    loading it refuses a lookback no buffer takes (ValueError)."""

    def run(impl, p):
        allow_episode_fixture(p)
        ep = EPISODES[fixture](impl)
        buf = getattr(ep, track) if track != "vf" else ep.extra_model_outputs["vf"]
        fn, args = ep.__reduce__()
        buf_fn, buf_args = buf.__reduce__()
        pos = [i for i, a in enumerate(buf_args) if type(a) is int and a == buf.lookback]
        if len(pos) != 1:
            p.problem(f"cannot find the lookback in the buffer's reduce args {buf_args!r}")
            return
        bad = Reduced(buf_fn, buf_args[: pos[0]] + (lb,) + buf_args[pos[0] + 1 :])
        done = []
        edited = _replaced(args, buf, bad, done)
        if len(done) != 1:
            p.problem(f"cannot find the {track} buffer in the episode's reduce args")
            return
        data = pickle.dumps(Reduced(fn, edited))
        ok = [ValueError] if refused_lookback(lb) else None
        loaded = p.run("loads", lambda: pickle.loads(data), ok=ok, data=False)
        if loaded is not None:
            probe_episode(p, "loaded", loaded, impl, heavy=False)

    return run


for _fixture in EPISODES:
    for _track in ("observations", "actions", "infos", "vf"):
        for _lb in (-1, -(2**63), 1, LOOKBACK_MAX + 1, 2**63):
            add(
                "episode_pickle",
                f"{_fixture}:{_track}.lookback={_lb}",
                episode_pickle_lookback_case(_fixture, _track, _lb),
            )


def corrupted_pickle_bytes_case(fixture, protocol):
    """Real pickles with bytes flipped: loading may fail, never crash."""

    def run(impl, p):
        p.check_data = False  # flipped data bytes are data, not heap garbage
        ep = EPISODES[fixture](impl)
        data = pickle.dumps(ep, protocol=protocol)
        positions = flippable(data)
        rng = np.random.default_rng(protocol)
        for k in range(40):
            bad = flipped(data, positions, rng, 3)
            loaded = p.run(f"loads#{k}", lambda: pickle.loads(bad), data=False)
            if loaded is not None and hasattr(loaded, "get_observations"):
                probe_episode(p, f"loaded#{k}", loaded, impl, heavy=False)

    return run


for _fixture in EPISODES:
    for _protocol in (2, 5):
        add(
            "episode_pickle",
            f"flipped_bytes:{_fixture}:p{_protocol}",
            corrupted_pickle_bytes_case(_fixture, _protocol),
        )


# -- multi-agent episodes: the one pickled state, corrupted ----------------------------------
#
# A MultiAgentEpisode pickles as _restore_multi_agent(version, cls, state),
# the state a tree of tuples (fields, agents' episodes, buffers, Columns).
# Each case puts garbage into every slot of that tree, one at a time: the
# restore must refuse it or give an episode that reads, steps and pickles
# without a crash.


def ma_episode(kind):
    from episode import MultiAgentEpisode

    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a0": obs(0), "a1": obs(1)})
    if kind == "turns":
        # a1 skips steps and has a hanging action, list mode, extra outputs
        ep.add_env_step({"a0": obs(1)}, {"a0": 2, "a1": 1}, {"a0": 1.25},
                        extra_model_outputs={"a0": {"vf": 11.0}, "a1": {"vf": 1.0}})
        for t in range(2, 4):
            ep.add_env_step({"a0": obs(t)}, {"a0": t % 3 + 1}, {"a0": t + 0.25, "a1": 1.0},
                            extra_model_outputs={"a0": {"vf": 10.0 + t}})
        return ep
    for t in range(1, 5):
        ep.add_env_step({"a0": obs(t), "a1": obs(t)}, {"a0": t % 3 + 1, "a1": t % 3 + 1},
                        {"a0": t + 0.25, "a1": t + 0.25},
                        extra_model_outputs={"a0": {"vf": 10.0 + t}, "a1": {"vf": 10.0 + t}})
    return ep.to_numpy() if kind == "numpy" else ep


MA_EPISODES = ("numpy", "list", "turns")


def allow_ma_fixture(p):
    allow_episode_fixture(p)
    p.allow(1.0, "S", "a0", "a1", 0, 2, 3, 4)


def probe_ma(p, tag, ep):
    """Reads, a step and a pickle of a restored multi-agent episode."""
    if not hasattr(ep, "get_observations"):
        return
    p.run(f"{tag}.len", lambda: len(ep), data=False)
    p.run(f"{tag}.validate", lambda: ep.validate(), data=False)
    for name in ("observations", "actions", "rewards", "infos"):
        getter = getattr(ep, f"get_{name}")
        p.run(f"{tag}.get_{name}()", lambda: getter(), data=False)
        p.run(f"{tag}.get_{name}(-1)", lambda: getter(-1), data=False)
        p.run(f"{tag}.get_{name}(fill)", lambda: getter(slice(-3, 2), fill=F), data=False)
        p.run(f"{tag}.get_{name}(agent)", lambda: getter(env_steps=False), data=False)
    p.run(f"{tag}.get_extra_model_outputs", lambda: ep.get_extra_model_outputs("vf"),
          data=False)
    p.run(f"{tag}.mapping", lambda: [s.data for s in ep.env_t_to_agent_t.values()],
          data=False)
    p.run(f"{tag}.pickle", lambda: pickle.loads(pickle.dumps(ep, protocol=5)), data=False)
    p.run(f"{tag}.cut", lambda: ep.cut(), data=False)
    p.run(f"{tag}.to_numpy", lambda: ep.to_numpy(), data=False)
    p.run(f"{tag}.step", lambda: ep.add_env_step(
        {"a0": obs(50), "a1": obs(50)}, {"a0": 1, "a1": 1}, {"a0": 51.0, "a1": 51.0}),
        data=False)


def _slots(x, path=()):
    """The paths of every item inside the nested tuples of `x`."""
    out = []
    if type(x) is tuple:
        for i, v in enumerate(x):
            out.append(path + (i,))
            out += _slots(v, path + (i,))
    return out


def _edited(x, path, value):
    """`x` (nested tuples) with the item at `path` replaced by `value`."""
    if not path:
        return value
    items = list(x)
    items[path[0]] = _edited(items[path[0]], path[1:], value)
    return tuple(items)


def ma_state_case(fixture, garbage_name):
    def run(impl, p):
        if not impl.ours:
            return
        allow_ma_fixture(p)
        p.allow(9.0)
        p.check_data = False  # garbage in a data slot is data
        fn, args = ma_episode(fixture).__reduce_ex__(5)
        if _attr_value(impl, REDUCE_GARBAGE[garbage_name], p) is REFUSED:
            return
        for path in _slots(args):
            garbage = _attr_value(impl, REDUCE_GARBAGE[garbage_name], p)
            edited = _edited(args, path, garbage)
            ep = p.run(f"restore{list(path)}", lambda: fn(*edited), data=False)
            if ep is not None:
                probe_ma(p, f"ep{list(path)}", ep)

    return run


for _fixture in MA_EPISODES:
    for _name in REDUCE_GARBAGE:
        add("ma_pickle", f"{_fixture}:{_name}", ma_state_case(_fixture, _name))


def flipped_bytes_case(make, probe, protocol):
    """Real pickles of `make()` with bytes flipped: loading may fail, never
    crash; what loads is probed (`probe(p, tag, loaded)`)."""

    def run(impl, p):
        if not impl.ours:
            return
        p.check_data = False  # flipped data bytes are data, not heap garbage
        data = pickle.dumps(make(), protocol=protocol)
        positions = flippable(data)
        rng = np.random.default_rng(protocol)
        for k in range(25):
            bad = flipped(data, positions, rng, 3)
            loaded = p.run(f"loads#{k}", lambda: pickle.loads(bad), data=False)
            if loaded is not None:
                probe(p, f"loaded#{k}", loaded)

    return run


for _fixture in MA_EPISODES:
    for _protocol in (2, 5):
        add("ma_pickle", f"flipped_bytes:{_fixture}:p{_protocol}",
            flipped_bytes_case(functools.partial(ma_episode, _fixture), probe_ma, _protocol))


def vector_with_waiting():
    """VectorEpisodes of 3 sub-envs whose record_step() calls left two
    ended episodes waiting for take_ended() (and rows pending)."""
    from episode.sampling import VectorEpisodes

    vec = VectorEpisodes(3)
    vec.add_reset(np.full((3, 2), 1.0, np.float32))
    flags = np.zeros(3, bool)
    for t in range(4):
        vec.record_step(np.full((3, 2), t + 2.0, np.float32), np.zeros(3, np.int64),
                        np.ones(3), np.array([t == 1, False, t == 2]), flags)
    return vec


def probe_vector(p, tag, vec):
    """take_ended(), a step, the episodes, a cut and a pickle of a restored
    VectorEpisodes."""
    if not hasattr(vec, "take_ended"):
        return
    p.run(f"{tag}.take_ended", lambda: [len(e) for e in vec.take_ended()[0]], data=False)
    flags = np.zeros(3, bool)
    p.run(f"{tag}.record_step", lambda: vec.record_step(
        np.full((3, 2), 9.0, np.float32), np.zeros(3, np.int64), np.ones(3),
        np.array([True, False, False]), flags), data=False)
    p.run(f"{tag}.episodes", lambda: [len(e) for e in vec.episodes], data=False)
    p.run(f"{tag}.take_ended_again",
          lambda: [e.get_observations() for e in vec.take_ended()[0]], data=False)
    p.run(f"{tag}.cut", lambda: [e.get_rewards() for e in vec.cut()], data=False)
    p.run(f"{tag}.pickle", lambda: pickle.loads(pickle.dumps(vec, protocol=5)), data=False)


def vector_state_case(garbage_name):
    """The waiting episodes' state of a pickled VectorEpisodes (its
    PendingRows' list of (sub-env, episode)) with garbage in each slot:
    refused with ValueError or restored, never a crash."""

    def run(impl, p):
        if not impl.ours:
            return
        p.check_data = False  # garbage in a data slot is data
        garbage = _attr_value(impl, REDUCE_GARBAGE[garbage_name], p)
        if garbage is REFUSED:
            return
        vec = vector_with_waiting()
        vec.episodes            # the rows written: the block pickles
        fn, args, state = vec._pending.__reduce__()
        edits = [garbage, [garbage], [(garbage, state[0][1])], [(0, garbage)],
                 [state[0], (1, state[1][1], garbage)]]
        for i, edited in enumerate(edits):
            def restore(edited=edited):
                pending = fn(*args)
                pending.__setstate__(edited)
                vec._pending = pending
                return vec
            got = p.run(f"restore#{i}", restore, data=False)
            if got is not None:
                probe_vector(p, f"vec#{i}", got)

    return run


for _name in REDUCE_GARBAGE:
    add("vector_pickle", f"state:{_name}", vector_state_case(_name))


for _protocol in (2, 5):
    add("vector_pickle", f"flipped_bytes:p{_protocol}",
        flipped_bytes_case(vector_with_waiting, probe_vector, _protocol))


SET_GARBAGE = {
    "None": None,
    "str": "x",
    "row3": np.full(3, 9.0, np.float32),
    "row_f64": np.full(2, 9.0),
    "row_str": np.array(["q", "r"]),
    "dict": {"a": 9.0},
    "list_short": [np.full(2, 9.0, np.float32)],
    "list_long": [np.full(2, 9.0, np.float32)] * 9,
    "batch_wrong": np.full((3, 3), 9.0),
    "big_int": 2**70,
    "object": object(),
    "str_long": "y" * 50,
}


def episode_set_case(fixture, setter, at, name):
    def run(impl, p):
        allow_episode_fixture(p)
        value = fresh(SET_GARBAGE[name])
        p.allow(value, 9, 9.0, "q", "r", "x", "y" * 50)
        ep = EPISODES[fixture](impl)
        kwargs = {"new_data": value, "at_indices": at}
        if setter == "set_extra_model_outputs":
            kwargs["key"] = "vf"
        p.run(setter, lambda: getattr(ep, setter)(**kwargs), state=ep, data=False)
        p.run(
            setter + "(neg)",
            lambda: getattr(ep, setter)(neg_index_as_lookback=True, **kwargs),
            state=ep,
            data=False,
        )
        probe_episode(p, "ep", ep, impl, heavy=False)

    return run


for _fixture in EPISODES:
    for _setter in ("set_observations", "set_actions", "set_rewards", "set_extra_model_outputs"):
        for _at_name, _at in (("0", 0), ("[0,1]", [0, 1]), ("slice(0,3)", slice(0, 3))):
            for _name in SET_GARBAGE:
                add(
                    "episode_set",
                    f"{_fixture}:{_setter}:at={_at_name}:{_name}",
                    episode_set_case(_fixture, _setter, _at, _name),
                )


STEP_GARBAGE = {
    "obs_row3": dict(observation=np.full(3, 9.0, np.float32)),
    "obs_f64": dict(observation=np.full(2, 9.0)),
    "obs_i8": dict(observation=np.full(2, 9, np.int8)),
    "obs_str": dict(observation="q"),
    "obs_None": dict(observation=None),
    "obs_dict": dict(observation={"a": 9.0}),
    "obs_2d": dict(observation=np.full((2, 2), 9.0)),
    "obs_0d_str": dict(observation=np.array("q")),
    "action_str": dict(action="q"),
    "action_big": dict(action=2**70),
    "action_row": dict(action=np.full(2, 9)),
    "reward_str": dict(reward="q"),
    "reward_row": dict(reward=np.full(2, 9.0)),
    "reward_None": dict(reward=None),
    "extra_new_key": dict(extra_model_outputs={"new": 9.0}),
    "extra_row": dict(extra_model_outputs={"vf": np.full(2, 9.0)}),
    "extra_str": dict(extra_model_outputs={"vf": "q"}),
    "extra_not_dict": dict(extra_model_outputs=[("vf", 9.0)]),
    "infos_list": dict(infos=[1, 2]),
    "infos_str": dict(infos="q"),
}


def add_env_step_case(fixture, name):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9, 9.0, "q", 2**70)
        ep = EPISODES[fixture](impl)
        kwargs = dict(
            observation=obs(9),
            action=2,
            reward=9.0,
            infos={"t": 9},
            extra_model_outputs={"vf": 9.0},
        )
        kwargs.update(fresh(STEP_GARBAGE[name]))
        p.allow(obs(9))
        p.run("add_env_step", lambda: ep.add_env_step(**kwargs), state=ep, data=False)
        probe_episode(p, "ep", ep, impl)

    return run


for _fixture in EPISODES:
    for _name in STEP_GARBAGE:
        add("episode_set", f"{_fixture}:add_env_step:{_name}", add_env_step_case(_fixture, _name))


RESET_GARBAGE = {
    "None": (None, None),
    "str_obs": ("q", None),
    "infos_str": (obs(0), "q"),
    "infos_list": (obs(0), [1, 2]),
    "dict_obs": ({"a": np.full(2, 9.0)}, None),
    "big_int_obs": (2**70, None),
}


def add_env_reset_case(name, numpy, twice):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0, "q", 2**70, 1, 2)
        observation, infos = fresh(RESET_GARBAGE[name])
        ep = impl.Episode()
        if numpy:
            p.run("to_numpy empty", lambda: ep.to_numpy(), data=False)
        p.run("add_env_reset", lambda: ep.add_env_reset(observation, infos), data=False)
        if twice:
            p.run("add_env_reset again", lambda: ep.add_env_reset(obs(0)), state=ep, data=False)
        p.run("add_env_step", lambda: ep.add_env_step(obs(1), 1, 1.25), data=False)
        probe_episode(p, "ep", ep, impl)

    return run


for _name in RESET_GARBAGE:
    for _numpy in (False, True):
        for _twice in (False, True):
            add(
                "episode_set",
                f"add_env_reset:{_name}:numpy={_numpy}:twice={_twice}",
                add_env_reset_case(_name, _numpy, _twice),
            )


EPISODE_SLICES = {
    "None": None,
    "int": 1,
    "str": "x",
    "huge": slice(0, 2**63),
    "huge_start": slice(2**63, None),
    "neg_huge": slice(-(2**63), None),
    "step0": slice(0, 3, 0),
    "step2": slice(0, 5, 2),
    "backwards": slice(4, 1),
    "reversed": slice(None, None, -1),
    "floats": slice(0.5, 2.5),
    "wide": slice(-100, 100),
}


def episode_slice_case(fixture, name, lookback):
    def run(impl, p):
        allow_episode_fixture(p)
        ep = EPISODES[fixture](impl)
        piece = p.run(
            "slice",
            lambda: ep.slice(fresh(EPISODE_SLICES[name]), len_lookback_buffer=lookback),
            state=ep,
            data=False,
        )
        if piece is not None:
            probe_episode(p, "piece", piece, impl)
        probe_episode(p, "ep", ep, impl, heavy=False)

    return run


for _fixture in EPISODES:
    for _name in EPISODE_SLICES:
        for _lookback in (None, 0, 2, 100):
            add(
                "episode_set",
                f"slice:{_fixture}:{_name}:len_lookback_buffer={_lookback}",
                episode_slice_case(_fixture, _name, _lookback),
            )


def concat_episode_case(fixture, other_name):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(9.0, 9, "q")
        ep = EPISODES[fixture](impl)
        other = {
            "None": lambda: None,
            "int": lambda: 5,
            "buffer": lambda: buf_list(impl),
            "self": lambda: ep,
            "other_id": lambda: make_episode(impl),
            "cut_numpy": lambda: make_episode(impl).cut(2).to_numpy(),
            "cut_neg_lookback": lambda: _cut_with_lookback(p, ep, -100_000_000),
            "cut_huge_lookback": lambda: _cut_with_lookback(p, ep, 2**62),
            "cut_str_obs": lambda: _cut_str(impl, ep),
        }[other_name]()
        p.run("concat_episode", lambda: ep.concat_episode(other), state=ep, data=False)
        probe_episode(p, "ep", ep, impl)

    return run


def _cut_with_lookback(p, ep, lb):
    """A chunk of `ep` whose tracks are given lookback `lb` (below 0 or above
    LOOKBACK_MAX): each refused with ValueError, the chunk unchanged (and
    then concatenated as it is)."""
    chunk = ep.cut(len_lookback_buffer=1)
    chunk.add_env_step(obs(9), 2, 9.0, extra_model_outputs={"vf": 9.0})
    p.allow(obs(9))
    for name in ("observations", "actions", "rewards", "infos"):
        p.run(
            f"chunk.{name}.lookback={lb}",
            lambda: setattr(getattr(chunk, name), "lookback", lb),
            ok=[ValueError],
            state=chunk,
            data=False,
        )
    return chunk


def _cut_str(impl, ep):
    return impl.Episode(
        id_=ep.id_,
        observations=["q", "q"],
        actions=[2],
        rewards=[9.0],
        extra_model_outputs={"vf": [9.0]},
        t_started=ep.t,
        len_lookback_buffer=0,
    )


for _fixture in EPISODES:
    for _other in (
        "None",
        "int",
        "buffer",
        "self",
        "other_id",
        "cut_numpy",
        "cut_neg_lookback",
        "cut_huge_lookback",
        "cut_str_obs",
    ):
        add(
            "episode_set",
            f"{_fixture}:concat_episode:{_other}",
            concat_episode_case(_fixture, _other),
        )


EPISODE_CONSTRUCTOR = {
    "obs_int": dict(observations=5),
    "obs_str": dict(observations="abc"),
    "obs_short": dict(observations=[obs(0)], actions=[1, 2], rewards=[1.0, 2.0]),
    "rewards_long": dict(observations=[obs(0), obs(1)], actions=[1], rewards=[1.0] * 5),
    "infos_short": dict(observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], infos=[{}]),
    "infos_str": dict(observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], infos="ab"),
    "extra_short": dict(
        observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], extra_model_outputs={"vf": []}
    ),
    "extra_garbage": dict(
        observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], extra_model_outputs={"vf": 5}
    ),
    "t_started_neg": dict(observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], t_started=-5),
    "t_started_huge": dict(
        observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], t_started=2**63 - 1
    ),
    "t_started_too_big": dict(
        observations=[obs(0), obs(1)], actions=[1], rewards=[1.0], t_started=2**63
    ),
    "t_started_str": dict(t_started="x"),
    "space_garbage": dict(observation_space="x", action_space=5),
    "space_mismatch": dict(
        observations=[obs(0), obs(1)],
        actions=[1],
        rewards=[1.0],
        observation_space=gym.spaces.Discrete(2),
    ),
    "numpy_arrays": dict(
        observations=np.stack([obs(0), obs(1), obs(2)]),
        actions=np.array([1, 2]),
        rewards=np.array([1.0, 2.0]),
        len_lookback_buffer=1,
    ),
    "numpy_ragged": dict(
        observations=np.stack([obs(0), obs(1)]),
        actions=np.array([1, 2, 3]),
        rewards=np.array([1.0]),
    ),
    "buffers_neg": dict(observations="neg_lookback_buffer"),
    "len_lookback_str": dict(len_lookback_buffer="x"),
    "terminated_array": dict(terminated=np.array([True, True])),
}


def episode_constructor_case(name):
    def run(impl, p):
        allow_episode_fixture(p)
        p.allow(1.0, 2.0, 1, 2, 3, "a", "b", "c")
        kwargs = {k: _attr_value(impl, fresh(v), p) for k, v in EPISODE_CONSTRUCTOR[name].items()}
        if any(v is REFUSED for v in kwargs.values()):
            return
        ok = _counter_ok("t_started", kwargs.get("t_started"))
        ep = p.run("construct", lambda: impl.Episode(**kwargs), ok=ok, data=False)
        if ep is not None:
            probe_episode(p, "ep", ep, impl)

    return run


for _name in EPISODE_CONSTRUCTOR:
    add("episode_attrs", f"constructor:{_name}", episode_constructor_case(_name))


def brief_len_case(impl, p):
    """The issue's reproducer: len() after from_state with t < t_started."""
    state = make_episode(impl).get_state()
    state["t"], state["t_started"] = 2, 4
    ep = p.run("from_state", lambda: impl.Episode.from_state(state), data=False)
    if ep is not None:
        p.run("len", lambda: len(ep), ok=[ValueError], data=False)


add("episode_state", "issue_reproducer_len", brief_len_case)


# -- fixed-width strings, bytes, structured, object and datetime rows ----------------------

ODD_KINDS = {
    "str": ["ab", "cdefg", "h"],
    "bytes": [b"ab", b"cdefg", b"h"],
    "struct": list(np.array([(1.5, 2), (3.5, 4), (5.5, 6)], dtype=[("a", "<f4"), ("b", "<i8")])),
    "object": [2**70, 2**71, 2**72],
    "datetime": [
        np.datetime64("2020-01-01"),
        np.datetime64("2021-01-01"),
        np.datetime64("2022-01-01"),
    ],
    "datetime_ns": [np.datetime64(1, "ns"), np.datetime64(2, "ns"), np.datetime64(3, "ns")],
    "timedelta": [np.timedelta64(1, "D"), np.timedelta64(2, "D"), np.timedelta64(3, "D")],
    "str_rows": [np.array(["a", "bb"]), np.array(["ccc", "d"]), np.array(["e", "ffff"])],
    "complex": [1 + 2j, 3 + 4j, 5 + 6j],
    "float16": [np.float16(1.5), np.float16(2.5), np.float16(3.5)],
}
ODD_FILLS = {
    "0.0": 0.0,
    "0": 0,
    "-7.0": F,
    "True": True,
    "long_str": "zzzzzzzzzz",
    "bytes": b"yy",
    "f32": np.float32(F),
    "i32": np.int32(-7),
}


def numpy_fill(rows, left, right, fill):
    """What numpy gives for `left` fill rows, `rows`, `right` fill rows with no
    space: np.array([fill] * k) pieces joined by np.concatenate (RLlib's
    rule). Rows of more than one dimension get the fill broadcast to a row
    (where RLlib fails; a documented difference)."""

    def pad(k):
        batch = np.array([fill] * k)
        if rows.ndim > 1 and batch.shape != (k,) + rows.shape[1:]:
            batch = np.broadcast_to(np.asarray(fill), (k,) + rows.shape[1:]).copy()
        return batch

    out = rows if len(rows) else None
    if left:
        out = pad(left) if out is None else np.concatenate([pad(left), out])
    if right:
        out = pad(right) if out is None else np.concatenate([out, pad(right)])
    return out


def _numpy_outcome(fn):
    try:
        return [Value(fn())]
    except Exception as e:
        return [type(e)]


# (label, slice, rows taken from the 3 data rows, left fill, right fill)
FILL_REQUESTS = [
    ("[-5:]", slice(-5, None), slice(0, 3), 2, 0),
    ("[0:5]", slice(0, 5), slice(0, 3), 0, 2),
    ("[5:7]", slice(5, 7), slice(0, 0), 0, 2),
    ("[-7:-5]", slice(-7, -5), slice(0, 0), 2, 0),
    ("[-4:-1]", slice(-4, -1), slice(0, 2), 1, 0),
    ("[1:4]", slice(1, 4), slice(1, 3), 0, 1),
]


def allow_numpy(p, fn):
    """Marks the values of `fn()` (a numpy computation) as written, if numpy can make it."""
    try:
        p.allow(fn())
    except Exception:
        pass


def odd_fill_case(kind, fill_name):
    def run(impl, p):
        items = ODD_KINDS[kind]
        fill = ODD_FILLS[fill_name]
        rows = np.array(items)
        p.allow(items, fill, rows)
        for label, sl, taken, left, right in FILL_REQUESTS:
            allow_numpy(p, lambda: numpy_fill(rows[taken], left, right, fill))
        cmp = kind != "str_rows"  # RLlib cannot fill rows of more than one dimension
        buf = impl.Buffer(list(items), lookback=0)
        buf.finalize()
        for label, sl, taken, left, right in FILL_REQUESTS:
            want = _numpy_outcome(lambda: numpy_fill(rows[taken], left, right, fill))
            p.run(f"get{label}", lambda: buf.get(sl, fill=fill), ok=want, state=buf, cmp=cmp)
        p.run("get(-9,fill)", lambda: buf.get(-9, fill=fill), ok=[Value(fill)], cmp=True)
        p.run("get([0,-9],fill)", lambda: buf.get([0, -9], fill=fill), cmp=cmp)
        p.run(
            "get(slice(-5,5),neg,fill)",
            lambda: buf.get(slice(-5, 5), neg_index_as_lookback=True, fill=fill),
            cmp=cmp,
        )
        # Again after the rows got wider: what was worked out for the old
        # width must not be reused.
        wider = _wider(kind)
        p.allow(wider)
        p.run("append(wider)", lambda: buf.append(wider), data=False)
        rows2 = _numpy_outcome(lambda: np.concatenate([rows, np.asarray(wider)[None]]))
        if isinstance(rows2[0], Value):
            rows2 = rows2[0].value
            for left, right, sl in ((2, 0, slice(-6, None)), (0, 2, slice(0, 6))):
                allow_numpy(p, lambda: numpy_fill(rows2, left, right, fill))
                p.run(
                    f"get{token(sl)} after append",
                    lambda: buf.get(sl, fill=fill),
                    ok=_numpy_outcome(lambda: numpy_fill(rows2, left, right, fill)),
                    cmp=cmp,
                )

    return run


def _numpy_ok(fn):
    try:
        fn()
        return True
    except Exception:
        return False


def _wider(kind):
    return {
        "str": np.str_("wwwwwwwwwwwwwwwwwwww"),
        "bytes": np.bytes_(b"vvvvvvvvvvvvvvvvvvvv"),
        "struct": np.array((9.5, 9), dtype=[("a", "<f8"), ("b", "<i8")])[()],
        "object": 2**73,
        "datetime": np.datetime64("2023-01-01T00:00:01"),
        "datetime_ns": np.datetime64(4, "ns"),
        "timedelta": np.timedelta64(4, "s"),
        "str_rows": np.array(["gggggggggggg", "h"]),
        "complex": 7 + 8j,
        "float16": np.float16(4.5),
    }[kind]


def _narrower(kind):
    return {
        "str": np.array("i"),
        "bytes": np.array(b"j"),
        "struct": np.array((9, 9), dtype=[("a", "<i1"), ("b", "<i1")]),
        "object": np.array(9, dtype=object),
        "datetime": np.array(np.datetime64("2024")),
        "datetime_ns": np.array(np.datetime64(5, "ns")),
        "timedelta": np.array(np.timedelta64(5, "D")),
        "str_rows": np.array(["k", "l"]),
        "complex": np.array(9 + 9j, np.complex64),
        "float16": np.array(9.5, np.float16),
    }[kind]


for _kind in ODD_KINDS:
    for _fill in ODD_FILLS:
        add("itemsize", f"fill:{_kind}:{_fill}", odd_fill_case(_kind, _fill), rllib=True)


def odd_append_case(kind, how):
    """Rows of another width (or unit) than the stored ones, each way in; the
    data must then be what numpy's concatenate (or assignment) gives."""

    def run(impl, p):
        items = ODD_KINDS[kind]
        p.allow(items, _wider(kind), _narrower(kind), 1.0)
        rows = np.array(items)
        # RLlib's finalize() casts rows of several str widths to the first
        # one's (a documented difference): their data is not compared.
        cmp = kind != "str_rows"
        buf = impl.Buffer(list(items), lookback=1)
        buf.finalize()
        ep = None
        if how == "episode":
            ep = impl.Episode()
            ep.add_env_reset(items[0])
            for it in items[1:]:
                ep.add_env_step(it, it, 1.0, extra_model_outputs={"x": it})
            ep.to_numpy()
        for name, item in (("narrower", _narrower(kind)), ("wider", _wider(kind))):
            if how == "append":
                new = _numpy_outcome(lambda: np.concatenate([rows, np.asarray(item)[None]]))
                p.run(
                    f"append({name})",
                    lambda: buf.append(item),
                    state=buf,
                    data=False,
                    ok=None if isinstance(new[0], Value) else new,
                    cmp=cmp,
                )
            elif how == "extend":
                new = _numpy_outcome(lambda: np.concatenate([rows, np.array([item, item])]))
                p.run(
                    f"extend({name})",
                    lambda: buf.extend([item, item]),
                    state=buf,
                    data=False,
                    ok=None if isinstance(new[0], Value) else new,
                    cmp=cmp,
                )
            elif how == "set":

                def assign(value, at):
                    out = rows.copy()
                    out[at] = value
                    return out

                new = _numpy_outcome(lambda: assign(item, 1))
                p.run(
                    f"set({name})",
                    lambda: buf.set(item, at_indices=0),
                    state=buf,
                    data=False,
                    ok=None if isinstance(new[0], Value) else new,
                    cmp=cmp,
                )
            elif how == "concat":
                other = impl.Buffer([item, item], lookback=0)
                new = _numpy_outcome(lambda: np.concatenate([rows, np.array([item, item])]))
                p.run(f"concat({name})", lambda: buf.concat(other), state=buf, data=False)
            else:
                new = _numpy_outcome(lambda: np.concatenate([rows, np.asarray(item)[None]]))
                p.run(
                    f"add_env_step({name})",
                    lambda: ep.add_env_step(item, item, 1.0, extra_model_outputs={"x": item}),
                    state=ep,
                    data=False,
                    ok=None if isinstance(new[0], Value) else new,
                    cmp=cmp,
                )
            if isinstance(new[0], Value):
                rows = new[0].value
                p.allow(rows)
            if ep is not None:
                p.run(
                    f"observations after {name}",
                    lambda: ep.get_observations(),
                    ok=[Value(rows)],
                    cmp=cmp,
                )
            else:
                # RLlib's concat fails on numpy'ized data: nothing to mirror, so
                # only the written values are checked there.
                concat = how == "concat"
                p.run(
                    f"data after {name}",
                    lambda: buf.data,
                    ok=None if concat else [Value(rows)],
                    cmp=cmp and not concat,
                )
        if ep is None:
            probe_buffer(p, "buf", buf, impl, heavy=False)

    return run


for _kind in ODD_KINDS:
    for _how in ("append", "extend", "set", "concat", "episode"):
        add("itemsize", f"{_how}:{_kind}", odd_append_case(_kind, _how), rllib=True)


def odd_episode_fill_case(kind, fill_name):
    """Every getter of a numpy'ized episode whose tracks hold `kind` rows,
    with fill past both ends, and after a cut (a chunk of one observation)."""

    def run(impl, p):
        items = ODD_KINDS[kind]
        fill = ODD_FILLS[fill_name]
        p.allow(
            items,
            fill,
            np.array(items),
            1.0,
            2.0,
            np.float32(fill) if not isinstance(fill, (str, bytes)) else fill,
        )
        for taken, left, right in (
            (slice(0, 3), 2, 2),
            (slice(0, 2), 2, 2),
            (slice(2, 3), 0, 4),
            (slice(0, 0), 0, 2),
            (slice(0, 0), 2, 0),
        ):
            if _numpy_ok(lambda: numpy_fill(np.array(items)[taken], left, right, fill)):
                p.allow(numpy_fill(np.array(items)[taken], left, right, fill))
        ep = impl.Episode()
        ep.add_env_reset(items[0])
        ep.add_env_step(items[1], items[0], 1.0, extra_model_outputs={"x": items[0]})
        ep.add_env_step(items[2], items[1], 2.0, extra_model_outputs={"x": items[1]})
        chunk = ep.cut(len_lookback_buffer=0)
        ep.to_numpy()
        chunk.to_numpy()
        rows = np.array(items)
        cmp = kind != "str_rows"  # RLlib cannot fill rows of more than one dimension
        for label, e in (("ep", ep), ("chunk", chunk)):
            p.run(
                f"{label}.get_observations[-5:5]",
                lambda: e.get_observations(slice(-5, 5), fill=fill),
                cmp=cmp,
            )
            p.run(
                f"{label}.get_observations[:5]",
                lambda: e.get_observations(slice(None, 5), fill=fill),
                cmp=cmp,
                ok=_numpy_outcome(
                    lambda: numpy_fill(
                        rows if e is ep else np.array(items[2:]),
                        0,
                        5 - (3 if e is ep else 1),
                        fill,
                    )
                ),
            )
            p.run(
                f"{label}.get_observations[-7:-5]",
                lambda: e.get_observations(slice(-7, -5), fill=fill),
                cmp=cmp,
            )
            p.run(
                f"{label}.get_observations(neg)",
                lambda: e.get_observations(slice(-4, 4), neg_index_as_lookback=True, fill=fill),
                cmp=cmp,
            )
            p.run(
                f"{label}.get_actions[-4:4]",
                lambda: e.get_actions(slice(-4, 4), fill=fill),
                cmp=cmp,
            )
            p.run(
                f"{label}.get_actions[5:7]", lambda: e.get_actions(slice(5, 7), fill=fill), cmp=cmp
            )
            p.run(
                f"{label}.get_extra[-4:4]",
                lambda: e.get_extra_model_outputs("x", slice(-4, 4), fill=fill),
                cmp=cmp,
            )
            p.run(
                f"{label}.get_rewards[-4:4]",
                lambda: e.get_rewards(slice(-4, 4), fill=fill),
                data=False,
                cmp=cmp,
            )
            p.run(
                f"{label}.get_infos[-4:4]", lambda: e.get_infos(slice(-4, 4), fill=fill), cmp=cmp
            )

    return run


for _kind in ODD_KINDS:
    for _fill in ("0.0", "0", "long_str", "bytes"):
        add(
            "itemsize",
            f"episode_fill:{_kind}:{_fill}",
            odd_episode_fill_case(_kind, _fill),
            rllib=True,
        )


def brief_str_fill_case(impl, p):
    """The issue's reproducer, with the value RLlib returns."""
    ep = impl.Episode()
    ep.add_env_step(observation="obs_1", action=44, reward=6)
    chunk = ep.cut(len_lookback_buffer=0)
    chunk.to_numpy()
    p.allow("obs_1", "0.0")
    p.run(
        "get_observations(slice(None,5),fill=0.0)",
        lambda: chunk.get_observations(slice(None, 5), fill=0.0),
        ok=[Value(np.array(["obs_1", "0.0", "0.0", "0.0", "0.0"], dtype="<U32"))],
        cmp=True,
    )


add("itemsize", "issue_reproducer", brief_str_fill_case, rllib=True)


# -- pickling round trips of every storage kind (a correctness check) -----------------------


def roundtrip_case(kind, how):
    def run(impl, p):
        items = ODD_KINDS[kind]
        p.allow(items, 1.0, 2.0, [{}], np.array(items))
        if how.startswith("buffer"):
            obj = impl.Buffer(list(items), lookback=1)
            if how == "buffer_numpy":
                obj.finalize()
            want = obj.get_state()
            read = lambda o: o.get_state()  # noqa: E731
        else:
            obj = impl.Episode()
            obj.add_env_reset(items[0])
            obj.add_env_step(items[1], items[0], 1.0, extra_model_outputs={"x": items[0]})
            obj.add_env_step(items[2], items[1], 2.0, extra_model_outputs={"x": items[1]})
            if how == "episode_numpy":
                obj.to_numpy()
            want = {
                k: obj.get_state()[k] for k in ("observations", "actions", "extra_model_outputs")
            }
            read = lambda o: {k: o.get_state()[k] for k in want}  # noqa: E731
        for protocol in (2, 4, 5):
            p.run(
                f"pickle p{protocol}",
                lambda: read(pickle.loads(pickle.dumps(obj, protocol=protocol))),
                ok=[Value(want)],
                data=False,
            )
        buffers = []
        p.run(
            "pickle p5 out-of-band",
            lambda: read(
                pickle.loads(
                    pickle.dumps(obj, protocol=5, buffer_callback=buffers.append), buffers=buffers
                )
            ),
            ok=[Value(want)],
            data=False,
        )
        p.run("deepcopy", lambda: read(copy.deepcopy(obj)), ok=[Value(want)], data=False)

    return run


for _kind in ODD_KINDS:
    for _how in ("buffer_list", "buffer_numpy", "episode_list", "episode_numpy"):
        add("roundtrip", f"{_kind}:{_how}", roundtrip_case(_kind, _how))


# -- the private Column: restoring corrupted pickles, bad ranges ---------------------------


def _column_fixtures():
    """name -> (make(Column), an item of the same kind to push)."""
    return {
        "float": (lambda C: C.from_list([1.0, 2.0, 3.0]), 4.0),
        "f32_scalar": (
            lambda C: C.from_list([np.float32(1), np.float32(2), np.float32(3)]),
            np.float32(4),
        ),
        "rows": (
            lambda C: C.from_list(
                [
                    np.full(2, 1.0, np.float32),
                    np.full(2, 2.0, np.float32),
                    np.full(2, 3.0, np.float32),
                ]
            ),
            np.full(2, 4.0, np.float32),
        ),
        "objects": (lambda C: C.from_list(["a", "b", "c"]), "d"),
        "empty_dicts": (lambda C: C.from_list([{}, {}, {}]), {}),
        "empty": (lambda C: C.from_list([]), 4.0),
        "finalized": (lambda C: C.from_array(np.array([1.0, 2.0, 3.0])), 4.0),
        "finalized_str": (lambda C: C.from_array(np.array(["a", "bb", "c"])), "dd"),
        "finalized_object": (lambda C: C.from_array(np.array([1, 2, 3], dtype=object)), 4),
    }


COLUMN_VALUES = [
    1.0,
    2.0,
    3.0,
    4.0,
    1,
    2,
    3,
    4,
    True,
    False,
    "a",
    "b",
    "c",
    "d",
    "bb",
    "dd",
    None,
    {},
]


def _column_class():
    from episode._column import Column

    return Column


def probe_column(p, tag, col, item, heavy=True):
    """Reads, writes and block moves on a (possibly corrupted) Column."""
    C = _column_class()
    n = p.run(f"{tag}.len", lambda: len(col), data=False)
    if not isinstance(n, int) or n > PLAUSIBLE_ROWS:
        if isinstance(n, int):
            p.steps[-1]["problems"].append(f"implausible length {n}")
        return
    p.run(f"{tag}.to_list", lambda: col.to_list())
    for i in list(range(min(n, 8))) + [-1]:
        p.run(f"{tag}.get({i})", lambda: col.get(i))
    p.run(f"{tag}.view", lambda: col.view())
    p.run(f"{tag}.writable_view", lambda: col.writable_view(), data=False)
    p.run(f"{tag}.take", lambda: col.take(np.arange(n, dtype=np.intp)))
    p.run(f"{tag}.dtype", lambda: col.dtype, data=False)
    p.run(f"{tag}.pickle5", lambda: pickle.loads(pickle.dumps(col, protocol=5)).to_list())
    p.run(f"{tag}.pickle2", lambda: pickle.loads(pickle.dumps(col, protocol=2)).to_list())
    if not heavy:
        return
    fresh = C.from_list([1.0, 2.0])
    p.run(f"fresh.extend_from({tag})", lambda: (fresh.extend_from(col, 0, n), fresh.to_list())[1])
    fresh = C.from_array(np.array([1.0, 2.0]))
    p.run(
        f"finalized.extend_from({tag})", lambda: (fresh.extend_from(col, 0, n), fresh.to_list())[1]
    )
    p.run(
        f"{tag}.extend_from(fresh)",
        lambda: col.extend_from(C.from_list([1.0, 2.0]), 0, 2),
        data=False,
    )
    for k in range(20):  # past any spare capacity
        p.run(f"{tag}.append#{k}", lambda: col.append(item), data=False)
    p.run(f"{tag}.set(0)", lambda: col.set(0, item), data=False)
    p.run(f"{tag}.pop(0)", lambda: col.pop(0), data=False)
    p.run(f"{tag}.to_list after writes", lambda: col.to_list())
    p.run(f"{tag}.finalize", lambda: col.finalize(), data=False)
    p.run(f"{tag}.view after finalize", lambda: col.view())
    p.run(f"{tag}.writable_view after finalize", lambda: col.writable_view())
    p.run(f"{tag}.append after finalize", lambda: col.append(item), data=False)
    p.run(f"{tag}.to_list at end", lambda: col.to_list())
    p.run(f"{tag}.live_list", lambda: col.live_list())


# A pickled Column is _restore_column(version, kind, finalized, row_type_open,
# payload). The fields are counted from the end, as a format that adds one
# at the front (the version did) would still put them there.
FIELDS = {"version": -5, "kind": -4, "finalized": -3, "row_type_open": -2, "payload": -1}
COUNT_MAX = 2**60  # the most empty dicts a Column counts
LIST_KIND_DTYPES = {1: np.float64, 2: np.int64, 3: np.bool_}  # Python float, int, bool


def _plain(dtype):
    """Numbers whose bytes can be copied and read back: the only rows a
    buffer payload or a list-mode Column may hold."""
    return dtype.kind in "biufc" and dtype.isnative


def _payload_rows(payload):
    """The rows an array payload describes: an ndarray with a leading axis, or
    raw bytes with a plain dtype and a shape that they fill exactly (None if
    it describes none)."""
    if type(payload) is tuple:
        if len(payload) != 3:
            return None
        data, dtype, shape = payload
        try:
            dtype = np.dtype(dtype)
            flat = np.frombuffer(data, dtype) if _plain(dtype) else None
        except (TypeError, ValueError):
            return None
        if flat is None or type(shape) is not tuple or not shape:
            return None
        if any(type(d) is not int or d < 0 for d in shape) or math.prod(shape) != flat.size:
            return None
        return flat.reshape(shape)
    if type(payload) is np.ndarray and payload.ndim > 0:
        return payload
    return None


def column_state_rows(kind, finalized, row_type_open, payload):
    """How many rows a Column restored from this state holds, or None if no
    Column can hold it (the restore must refuse it): the object kind holds a
    list, the empty kinds a count, the typed kinds rows; list mode only plain
    rows of the kind's own dtype; an open row type no rows."""
    if type(finalized) is not bool or type(row_type_open) is not bool or type(kind) is not int:
        return None
    if kind == 6:
        ok = type(payload) is list and not finalized and not row_type_open
        return len(payload) if ok else None
    if kind in (0, 7):
        top = 0 if kind == 0 else COUNT_MAX
        ok = type(payload) is int and 0 <= payload <= top and not finalized and not row_type_open
        return payload if ok else None
    rows = _payload_rows(payload) if 1 <= kind <= 5 else None
    if rows is None:
        return None
    if finalized:
        return None if row_type_open and len(rows) else len(rows)
    if row_type_open or not _plain(rows.dtype):
        return None
    if kind != 5 and (rows.ndim != 1 or rows.dtype != LIST_KIND_DTYPES.get(kind, rows.dtype)):
        return None
    return len(rows)


def restored(rows):
    """`ok` for a restore: a Column of `rows` rows, or (None) refused."""
    if rows is None:
        return [ValueError, TypeError]
    return [
        Check(
            lambda col: (
                None
                if type(col).__name__ == "Column" and len(col) == rows
                else f"{short(col, 80)} is not a Column of {rows} rows"
            ),
            f"a Column of {rows} rows",
        )
    ]


def column_restore_case(fixture, protocol, field, value):
    def run(impl, p):
        C = _column_class()
        make, item = _column_fixtures()[fixture]
        p.allow(COLUMN_VALUES, item)
        col = make(C)
        fn, args = col.__reduce_ex__(protocol)
        args = list(args)
        if len(args) != len(FIELDS):
            p.problem(f"a Column pickles {len(args)} fields, not {list(FIELDS)}: {short(args)}")
            return
        if field == "drop_last":
            args = args[:-1]
            ok = [TypeError]
        elif field == "extra":
            args = args + [None]
            ok = [TypeError]
        else:
            new = value
            if field == "payload" and callable(value):
                new = value(args[FIELDS[field]])
                if new is _SKIP:
                    p.skip(f"the edit does not apply to the payload {short(args[-1], 80)}")
                    return
            args[FIELDS[field]] = new
            if field == "payload":
                p.allow(_payload_values(new))
            if field == "version":
                ok = [ValueError]  # a format this version does not read
            else:
                ok = restored(column_state_rows(*args[-4:]))
        got = p.run("restore", lambda: fn(*args), ok=ok, data=False)
        if got is not None:
            probe_column(p, "col", got, item)

    return run


_SKIP = object()


def _payload_values(payload):
    """The values a payload holds, read as its own dtype says (or nothing)."""
    try:
        if type(payload) is tuple:
            return np.frombuffer(payload[0], payload[1]).reshape(payload[2])
        return payload
    except Exception:
        return []


def _payload_buffer(data=None, dtype=None, shape=None):
    """A payload edit for the (buffer, dtype string, shape) form (skipped for others)."""

    def edit(payload):
        if type(payload) is not tuple or len(payload) != 3:
            return _SKIP
        old_data, old_dtype, old_shape = payload
        return (
            old_data if data is None else data,
            old_dtype if dtype is None else dtype,
            old_shape if shape is None else shape,
        )

    return edit


def _payload_array(fn):
    """A payload edit that replaces the array payload (of any form) by fn(rows)."""

    def edit(payload):
        if type(payload) is tuple and len(payload) == 3:
            rows = np.frombuffer(payload[0], payload[1]).reshape(payload[2])
        elif isinstance(payload, np.ndarray):
            rows = payload
        else:
            return _SKIP
        return fn(rows)

    return edit


PAYLOADS = {
    "bytes_short": _payload_buffer(data=b"\x01" * 7),
    "bytes_long": _payload_buffer(data=b"\x01" * 1000),
    "bytes_not_buffer": _payload_buffer(data=5),
    "dtype_i1": _payload_buffer(dtype="|i1"),
    "dtype_f8": _payload_buffer(dtype="<f8"),
    "dtype_c16": _payload_buffer(dtype="<c16"),
    "dtype_b1": _payload_buffer(dtype="|b1"),
    "dtype_U1": _payload_buffer(dtype="<U1"),
    "dtype_O": _payload_buffer(dtype="|O"),
    "dtype_V8": _payload_buffer(dtype="|V8"),
    "dtype_M8": _payload_buffer(dtype="<M8[D]"),
    "dtype_bigendian": _payload_buffer(dtype=">f8"),
    "dtype_garbage": _payload_buffer(dtype="zz"),
    "dtype_int": _payload_buffer(dtype=5),
    "shape_0d": _payload_buffer(shape=()),
    "shape_-1": _payload_buffer(shape=(-1,)),
    "shape_0": _payload_buffer(shape=(0,)),
    "shape_3x0": _payload_buffer(shape=(3, 0)),
    "shape_1x3": _payload_buffer(shape=(1, 3)),
    "shape_huge": _payload_buffer(shape=(2**62,)),
    "shape_negative": _payload_buffer(shape=(-3,)),
    "shape_str": _payload_buffer(shape="x"),
    "shape_64d": _payload_buffer(shape=(1,) * 63 + (-1,)),
    "tuple_short": lambda payload: payload[:2] if type(payload) is tuple else _SKIP,
    "as_i1": _payload_array(lambda r: r.astype(np.int8)),
    "as_f8": _payload_array(lambda r: r.astype(np.float64)),
    "as_u2": _payload_array(lambda r: r.astype(np.uint16)),
    "as_object": _payload_array(lambda r: r.astype(object)),
    "as_str": _payload_array(lambda r: r.astype(str)),
    "as_struct": _payload_array(lambda r: np.zeros(len(r), dtype=[("a", "<i2"), ("b", "<f8")])),
    "as_datetime": _payload_array(lambda r: np.full(len(r), np.datetime64("2020-01-01"))),
    "as_0d": _payload_array(lambda r: np.asarray(r.ravel()[0])),
    "as_2d": _payload_array(lambda r: np.repeat(r.reshape(len(r), -1), 3, axis=1)),
    "as_zero_width": _payload_array(lambda r: np.empty((len(r), 0), r.dtype)),
    "as_noncontig": _payload_array(lambda r: np.repeat(r, 2, axis=0)[::2]),
    "as_fortran": _payload_array(
        lambda r: np.asfortranarray(np.repeat(r.reshape(len(r), -1), 3, axis=1))
    ),
    "as_readonly": _payload_array(lambda r: np.broadcast_to(r, r.shape)),
    "as_swapped": _payload_array(lambda r: r.astype(r.dtype.newbyteorder())),
    "as_empty": _payload_array(lambda r: r[:0]),
    "as_list": _payload_array(lambda r: r.tolist()),
    "list": lambda payload: [4.0, "z"] if isinstance(payload, list) else _SKIP,
    "list_to_tuple": lambda payload: tuple(payload) if isinstance(payload, list) else _SKIP,
    "list_to_str": lambda payload: "abc" if isinstance(payload, list) else _SKIP,
    "count_neg": lambda payload: -1 if type(payload) is int else _SKIP,
    "count_huge": lambda payload: 2**62 if type(payload) is int else _SKIP,
    "count_too_big": lambda payload: 2**63 if type(payload) is int else _SKIP,
    "count_str": lambda payload: "3" if type(payload) is int else _SKIP,
    "count_float": lambda payload: 3.5 if type(payload) is int else _SKIP,
    "None": None,
    "int": 3,
    "str": "abc",
    "array_f8": np.array([1.0, 2.0]),
    "array_object": np.array([None, 1.0], dtype=object),
}
KINDS = list(range(8)) + [-1, 8, 255, 2**31, 2**63, "1", None, 1.5]
VERSIONS = {"0": 0, "2": 2, "huge": 10**6, "str": "1", "None": None}
# The two flags: bools, and nothing else (not even ints or numpy bools).
FLAGS = {
    "True": True,
    "False": False,
    "2": 2,
    "1": 1,
    "str": "x",
    "None": None,
    "np.bool_": np.bool_(True),
    "type": float,
}

# Which payload edits fit which fixture: the fixture's pickle holds raw rows
# (protocol 5, rows without object references), an array (protocol 2, or
# object rows), the item list, or a count.
TUPLE_EDITS = [n for n in PAYLOADS if n.startswith(("bytes_", "dtype_", "shape_", "tuple_"))]
ARRAY_EDITS = [n for n in PAYLOADS if n.startswith("as_")]
LIST_EDITS = ["list", "list_to_tuple", "list_to_str"]
COUNT_EDITS = [n for n in PAYLOADS if n.startswith("count_")]
ANY_EDITS = ["None", "int", "str", "array_f8", "array_object"]
RESTORE_PLAN = {
    "float": {5: TUPLE_EDITS, 2: ARRAY_EDITS},
    "f32_scalar": {5: TUPLE_EDITS},
    "rows": {5: TUPLE_EDITS, 2: ARRAY_EDITS},
    "objects": {5: LIST_EDITS},
    "empty_dicts": {5: COUNT_EDITS},
    "empty": {5: COUNT_EDITS},
    "finalized": {5: TUPLE_EDITS, 2: ARRAY_EDITS},
    # str rows are pickled as an array (and do not cast to numbers)
    "finalized_str": {5: [n for n in ARRAY_EDITS if n not in ("as_i1", "as_f8", "as_u2")]},
    "finalized_object": {5: ARRAY_EDITS},
}
for _fixture, _plan in RESTORE_PLAN.items():
    _cases = [("drop_last", "", None), ("extra", "", None)]
    _cases += [("version", n, v) for n, v in VERSIONS.items()]
    _cases += [("kind", repr(k), k) for k in KINDS]
    _cases += [("finalized", n, v) for n, v in FLAGS.items()]
    _cases += [("row_type_open", n, v) for n, v in FLAGS.items()]
    _cases += [("payload", n, PAYLOADS[n]) for n in ANY_EDITS]
    for _field, _name, _value in _cases:
        add(
            "column_restore",
            f"{_fixture}:p5:{_field}{'=' if _name else ''}{_name}",
            column_restore_case(_fixture, 5, _field, _value),
        )
    for _protocol, _edits in _plan.items():
        for _name in _edits:
            add(
                "column_restore",
                f"{_fixture}:p{_protocol}:payload={_name}",
                column_restore_case(_fixture, _protocol, "payload", PAYLOADS[_name]),
            )


def column_kind_payload_case(kind, dtype):
    """Every kind with payload rows of every storage dtype, in both modes,
    with the row type open or not: a restore must refuse a kind that does
    not describe its rows."""

    def run(impl, p):
        C = _column_class()
        rows = np.arange(1, 4).astype(dtype)
        p.allow(COLUMN_VALUES, rows, rows.tolist())
        fn, args = C.from_list([1.0, 2.0, 3.0]).__reduce_ex__(2)
        args = list(args)
        args[FIELDS["kind"]], args[FIELDS["payload"]] = kind, rows
        for finalized in (False, True):
            args[FIELDS["finalized"]] = finalized
            for row_type_open in (False, True):
                args[FIELDS["row_type_open"]] = row_type_open
                col = p.run(
                    f"restore(finalized={finalized},row_type_open={row_type_open})",
                    lambda: fn(*args),
                    ok=restored(column_state_rows(kind, finalized, row_type_open, rows)),
                    data=False,
                )
                if col is not None:
                    probe_column(p, f"col({finalized},{row_type_open})", col, rows[0])

    return run


for _kind in range(8):
    for _dtype in (
        "f8",
        "f4",
        "i8",
        "i1",
        "u2",
        "b1",
        "c16",
        "U3",
        "S2",
        "M8[D]",
        "O",
        [("a", "<i2"), ("b", "<f8")],
    ):
        add(
            "column_restore",
            f"kind={_kind}:rows={token(_dtype)}",
            column_kind_payload_case(_kind, _dtype),
        )


def column_api_case(name, fn):
    def run(impl, p):
        C = _column_class()
        p.allow(COLUMN_VALUES, 9.0, 9, "q")
        fn(C, p)

    return run


def _api_extend_from(start, stop, other="float", target="float"):
    def fn(C, p):
        col = _column_fixtures()[target][0](C)
        src = _column_fixtures()[other][0](C) if other is not None else None
        p.run("extend_from", lambda: col.extend_from(src, start, stop), state=col, data=False)
        probe_column(p, "col", col, _column_fixtures()[target][1])

    return fn


def _api_call(target, method, *args):
    def fn(C, p):
        col = _column_fixtures()[target][0](C)
        p.run(method, lambda: getattr(col, method)(*args), state=col)
        probe_column(p, "col", col, _column_fixtures()[target][1])

    return fn


def _api_static(method, *args):
    def fn(C, p):
        p.allow(*args)
        col = p.run(method, lambda: getattr(C, method)(*args), data=False)
        if col is not None:
            probe_column(p, "col", col, 9.0)

    return fn


def _api_row_type_open(target):
    def fn(C, p):
        col = _column_fixtures()[target][0](C)
        before = col.to_list()
        p.run(
            "row_type_open=True",
            lambda: setattr(col, "row_type_open", True),
            ok=[AttributeError],  # read-only: only the Column itself opens its row type
            state=col,
            data=False,
        )
        item = _column_fixtures()[target][1]
        p.run("append", lambda: col.append(item), data=False)
        after = p.run("to_list", lambda: col.to_list())
        if (
            after is not None
            and not all(same(summary(a), summary(b)) for a, b in zip(before, after[: len(before)]))
            or after is not None
            and len(after) < len(before)
        ):
            p.steps[-1]["problems"].append(
                f"rows written before were lost: {short(before)} -> {short(after)}"
            )

    return fn


def _api_live_list_then(target):
    def fn(C, p):
        col = _column_fixtures()[target][0](C)
        p.run("live_list", lambda: col.live_list())
        probe_column(p, "col", col, _column_fixtures()[target][1])

    return fn


COLUMN_API = {}
for _t in ("float", "rows", "objects", "empty_dicts", "finalized", "finalized_str"):
    for _other in ("float", "rows", "objects", "empty_dicts", "finalized_str", None):
        for _start, _stop in (
            (-5, 3),
            (0, 100),
            (10**6, 10**6 + 2),
            (-(2**62), 0),
            (0, 2**62),
            (2**63 - 1, -(2**63)),
        ):
            COLUMN_API[f"{_t}.extend_from({_other},{_start},{_stop})"] = _api_extend_from(
                _start, _stop, _other, _t
            )
    for _pos in (-4, 3, 2**62, -(2**63)):
        COLUMN_API[f"{_t}.get({_pos})"] = _api_call(_t, "get", _pos)
        COLUMN_API[f"{_t}.set({_pos})"] = _api_call(_t, "set", _pos, 9.0)
        COLUMN_API[f"{_t}.pop({_pos})"] = _api_call(_t, "pop", _pos)
    for _name, _pos in (
        ("out_of_range", np.array([0, 7], np.intp)),
        ("negative", np.array([-1], np.intp)),
        ("huge", np.array([2**62], np.intp)),
        ("None", None),
        ("noncontig", np.arange(6, dtype=np.intp)[::2]),
        ("int32", np.array([0], np.int32)),
        ("2d", np.zeros((1, 1), np.intp)),
    ):
        COLUMN_API[f"{_t}.take({_name})"] = _api_call(_t, "take", _pos)
    for _name, _batch in (
        ("None", None),
        ("0d", np.array(9.0)),
        ("wrong_shape", np.full((2, 5), 9.0)),
        ("str", np.array(["q"])),
        ("object", np.array([None], dtype=object)),
        ("empty", np.empty((0,))),
        ("list", [9.0, 9.0]),
    ):
        COLUMN_API[f"{_t}.extend_rows({_name})"] = _api_call(_t, "extend_rows", _batch)
        COLUMN_API[f"{_t}.check_row({_name})"] = _api_call(_t, "check_row", _batch)
    for _name, _arr in (
        ("None", None),
        ("0d", np.array(9.0)),
        ("list", [9.0]),
        ("str", np.array(["q"])),
    ):
        COLUMN_API[f"{_t}._adopt({_name})"] = _api_call(_t, "_adopt", _arr)
    COLUMN_API[f"{_t}.row_type_open"] = _api_row_type_open(_t)
    COLUMN_API[f"{_t}.live_list"] = _api_live_list_then(_t)

for _name, _arr in (
    ("None", None),
    ("int", 5),
    ("str", "abc"),
    ("0d", np.array(9.0)),
    ("64d", np.full((1,) * 64, 9.0)),
    ("zero_width", np.empty((3, 0))),
    ("object", np.array([None, 9.0], dtype=object)),
    ("struct", np.zeros(3, dtype=[("a", "<i2"), ("b", "<f8")])),
    ("struct_object", np.zeros(3, dtype=[("a", "O"), ("b", "<f8")])),
    ("readonly", np.broadcast_to(9.0, (3,))),
    ("swapped", np.full(3, 9.0, ">f8")),
    ("noncontig", np.full((3, 4), 9.0)[:, ::2]),
    ("datetime", np.full(3, np.datetime64("2020-01-01"))),
    ("empty", np.empty((0, 2))),
    ("huge_zero_rows", np.empty((0,) + (2**15,) * 3)),
):
    COLUMN_API[f"from_array({_name})"] = _api_static("from_array", _arr)
for _name, _items in (
    ("None", None),
    ("tuple", (9.0,)),
    ("str", "abc"),
    ("mixed", [9.0, "q", None, np.full(2, 9.0), 2**70, {}, {"a": 1}]),
    ("64d_row", [np.full((1,) * 64, 9.0)]),
    ("zero_width", [np.empty((0,))] * 3),
    ("big_rows", [np.full(10**4, 9.0)] * 2),
    ("str_arrays", [np.array(["q"])] * 2),
    ("swapped", [np.full(2, 9.0, ">f8")] * 2),
    ("noncontig", [np.full(4, 9.0)[::2]] * 2),
    ("subclass", [np.ma.masked_array([9.0, 9.0])] * 2),
):
    COLUMN_API[f"from_list({_name})"] = _api_static("from_list", _items)

for _name, _fn in COLUMN_API.items():
    add("column_api", _name, column_api_case(_name, _fn))


# -- the compiled types used directly ------------------------------------------------------


def core_case(name):
    def run(impl, p):
        from episode import _buffer, _episode, _index

        p.allow(9.0, 1.0, 2.0, 3.0)
        if name == "BufferCore":
            # A bare core is an empty list-mode buffer: 0 items, not finalized.
            p.allow(0, False)
            core = _buffer.BufferCore()
            for label, fn in (
                ("len", lambda: len(core)),
                ("get", lambda: core.get()),
                ("get(0)", lambda: core.get(0)),
                ("[0]", lambda: core[0]),
                ("append", lambda: core.append(9.0)),
                ("check_append", lambda: core.check_append(9.0)),
                ("sub_buffer", lambda: core.sub_buffer(slice(0, 1), False, 0, None)),
                ("finalized", lambda: core.finalized),
                ("len_incl_lookback", lambda: core.len_incl_lookback()),
            ):
                p.run(label, fn)
        elif name == "EpisodeCore":
            core = _episode.EpisodeCore()
            for label, fn in (
                ("len", lambda: len(core)),
                ("add_env_step", lambda: core.add_env_step(9.0, 1, 1.0)),
                ("get_observations", lambda: core.get_observations()),
                ("get_extra_model_outputs", lambda: core.get_extra_model_outputs("x")),
                ("cut", lambda: core.cut()),
                ("slice", lambda: core.slice(slice(0, 1))),
                ("validate", lambda: core.validate()),
            ):
                p.run(label, fn, data=False)
        elif name == "assemble":
            buf = _buffer_like(impl)
            # No buffer takes a lookback below 0 or above LOOKBACK_MAX (so none
            # reaches assemble); the largest one it takes, over all its rows, does.
            for lb in (-3, 2**62):
                p.run(
                    f"lookback={lb}",
                    lambda: setattr(buf, "lookback", lb),
                    ok=[ValueError],
                    state=buf,
                    data=False,
                )
            for cls in (int, _buffer.BufferCore, _episode.EpisodeCore, impl.Episode, impl.Buffer):
                for lb in (0, 4, LOOKBACK_MAX):
                    b = _buffer_like(impl, lb)
                    ep = p.run(
                        f"assemble({cls.__name__},lookback={lb})",
                        lambda: _episode.assemble(
                            cls,
                            "x",
                            b,
                            _buffer_like(impl, 0, [{}] * 4),
                            _buffer_like(impl, 0, [1] * 3),
                            _buffer_like(impl, 0, [1.0] * 3),
                            {"vf": buf},
                            False,
                            False,
                            0,
                        ),
                        data=False,
                    )
                    if ep is not None and hasattr(ep, "get_observations"):
                        probe_episode(p, "ep", ep, impl, heavy=False)
        elif name == "index":
            for args in (
                (slice(0, 2**63 - 1), False, 2**62, 5),
                (slice(-(2**63), 2**63 - 1), True, 5, 5),
                (slice(None, None, -(2**63)), False, 0, 5),
                (slice(0, 3), False, -5, 5),
                (slice(0, 3), False, 2, -5),
                (slice(2**63 - 1, None, 2**63 - 1), True, 2**62, 2**62),
                ("x", False, 0, 0),
                (slice("a", None), False, 0, 5),
            ):
                p.run(
                    f"resolve_slice{token(args, 80)}",
                    lambda: _index.resolve_slice(*args),
                    data=False,
                )
            for args in (
                (2**63 - 1, False, 2**62, 5, 5),
                (-(2**63), True, 5, 5, 2**62),
                (-(2**63), False, 0, 5, 0),
                (0, False, -5, 5, 5),
            ):
                p.run(
                    f"resolve_int{token(args, 80)}", lambda: _index.resolve_int(*args), data=False
                )
        elif name == "Memory":
            from episode._column import Memory

            p.run("Memory()", lambda: Memory(), data=False)
            p.run("Memory() dealloc", lambda: [Memory() for _ in range(3)] and None, data=False)

    return run


def _buffer_like(impl, lookback=0, data=None):
    buf = impl.Buffer(data if data is not None else [9.0, 9.0, 9.0, 9.0], lookback=0)
    buf.lookback = lookback
    return buf


for _name in ("BufferCore", "EpisodeCore", "assemble", "index", "Memory"):
    add("core", _name, core_case(_name))


# -- replay: the compiled store, its priority trees and draws ------------------------------


def _replay_modules():
    from episode import _priority, _replay, replay

    return _replay, _priority, replay


def _gather_module():
    from episode import _gather

    return _gather


def _picks_module():
    from episode import _picks

    return _picks


def new_draws(rng):
    from episode._draws import Draws

    return Draws(rng)


def _plain_rows(x):
    # rows_of's Columns (nested as the track is) as lists.
    if hasattr(x, "to_list"):
        return x.to_list()
    if isinstance(x, dict):
        return {k: _plain_rows(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_plain_rows(v) for v in x)
    return x


def trees_state(trees):
    return (trees.sum_values(), trees.min_values(), trees.free_nodes(), trees.max_idx,
            trees.used_leaves())


class TreesView:
    """PriorityTrees as get_state() (for Probe.run(state=...))."""

    def __init__(self, trees):
        self.trees = trees

    def get_state(self):
        return trees_state(self.trees)


class StoreView:
    """A Store's data as get_state() (for Probe.run(state=...)): its
    counters, its steps in order, each stored episode's fields and rows,
    its trees."""

    def __init__(self, store):
        self.store = store

    def rows(self):
        """Each stored episode's rows (lookback included), by slot."""
        _replay, _, _ = _replay_modules()
        s = self.store
        out = {}
        for slot in _replay.live_slots(s):
            _, meta, _, length, lookback = _replay.episode_fields(s, slot)[:5]
            rows = out[slot] = {}
            for track in ["obs", "infos", "actions", "rewards"] + [("extras", k)
                                                                  for k in meta.extra_keys]:
                stop = length + 1 if track in ("obs", "infos") else length
                rows[str(track)] = _plain_rows(
                    _replay.rows_of(s, slot, track, -lookback, stop, False))
        return out

    def get_state(self):
        _replay, _, _ = _replay_modules()
        s = self.store
        out = {"live": s.live_steps, "episodes": s.num_episodes, "evicted": s.num_evicted,
               "layout": s.layout, "order": _replay.step_order(s), "rows": self.rows(),
               "fields": [_replay.episode_fields(s, slot)[:1] + _replay.episode_fields(
                   s, slot)[2:] for slot in _replay.live_slots(s)]}
        if s.priorities is not None:
            out["trees"] = trees_state(s.priorities)
        return out


def _rstep(t):
    # A replay episode's per-step values (none of them 0, nor the fill F).
    return dict(obs=obs(t), act=t % 3 + 1, rew=t + 0.25, vf=10.0 + t)


def _replay_episode(impl, kind, steps=4, id_=None):
    """An episode of `kind` (its observations, rewards... of odd sorts)."""
    E = impl.Episode
    ts = range(steps + 1)
    obs_of = {
        "box": obs,
        "dict": lambda t: {"a": obs(t), "b": t + 1},
        "tuple": lambda t: (obs(t), np.int64(t + 1)),
        "str": lambda t: f"o{t}",
        "ragged": lambda t: np.full(t + 1, t + 1.5),
        "mixed": lambda t: [None, "x", obs(t), {"a": 1}][t % 4],
        "nan": lambda t: np.array([np.nan, t + 1.5], np.float32),
        "bytes": lambda t: f"b{t}".encode(),
        "huge_row": lambda t: np.full(2**12, t + 1.5, np.float32),
    }.get(kind, obs)
    observations = [obs_of(t) for t in ts]
    actions = [_rstep(t)["act"] for t in ts[:-1]]
    rewards = [_rstep(t)["rew"] for t in ts[:-1]]
    infos = [{"t": t} for t in ts]
    extras = {"vf": [_rstep(t)["vf"] for t in ts[:-1]]}
    lookback = 0
    if kind == "zero_steps":
        observations, actions, rewards, infos = observations[:1], [], [], infos[:1]
        extras = {"vf": []}
    elif kind == "huge_lookback":
        lookback = 500
        observations = [obs(1)] * lookback + observations
        actions = [1] * lookback + actions
        rewards = [1.25] * lookback + rewards
        infos = [{"t": 1}] * lookback + infos
        extras = {"vf": [11.0] * lookback + extras["vf"]}
    elif kind == "str_rewards":
        rewards = ["r"] * steps
    elif kind == "bool_rewards":
        rewards = [True, False] * (steps // 2)
    elif kind == "object_actions":
        actions = [None, "a", 1, (2,)][:steps]
    elif kind == "dict_extras":
        extras = {"vf": [{"x": 10.0 + t} for t in ts[:-1]]}
    elif kind == "infos_not_dicts":
        infos = [None, [1], "t", 3, {}][: steps + 1]
    ep = E(id_=id_ or f"r-{kind}", observations=observations, actions=actions, rewards=rewards,
           infos=infos, extra_model_outputs=extras, len_lookback_buffer=lookback)
    return ep


REPLAY_KINDS = ["box", "box_numpy", "dict", "tuple", "str", "ragged", "mixed", "nan", "bytes",
                "huge_row", "zero_steps", "huge_lookback", "str_rewards", "bool_rewards",
                "object_actions", "dict_extras", "infos_not_dicts"]


def _allow_replay(p, kind="box"):
    """The values the replay episodes hold (False, which equals 0, only where
    an episode of `kind` holds it: zeroed memory is what the checks catch)."""
    allow_episode_fixture(p, steps=7)
    p.allow([f"r-{kind}" for kind in REPLAY_KINDS], "r-box-2", "second", float("nan"),
            ["o0", "o1", "o2", "o3", "o4", "x", b"b0", b"b1", b"b2", b"b3", b"b4", "r", "a"],
            [t + 1.5 for t in range(6)], [t + 1 for t in range(6)], {"a": 1}, {"x": 1}, [1],
            "t")
    if kind == "bool_rewards":
        p.allow(True, False)


def _make_replay_episode(impl, kind):
    ep = _replay_episode(impl, "box" if kind == "box_numpy" else kind)
    if kind == "box_numpy":
        ep.to_numpy()
    return ep


def probe_store(p, tag, store):
    """Draws, gathers and reads on `store`; none may crash or hand out
    memory nobody wrote."""
    _gather = _gather_module()
    _picks = _picks_module()
    _replay, _, _ = _replay_modules()
    view = StoreView(store)
    p.run(f"{tag}.view", view.get_state, data=False)
    p.run(f"{tag}.rows", view.rows)
    if not isinstance(store.live_steps, int) or not store.live_steps:
        return
    draws = new_draws(np.random.default_rng(0))
    p.run(f"{tag}.uniform_step", lambda: _picks.uniform_step(store, draws), data=False)
    picks = [p.run(f"{tag}.draw_uniform", lambda: _picks.draw_uniform(store, draws, 4, 0, 1, 0),
                   data=False),
             p.run(f"{tag}.draw_uniform(T=3)", lambda: _picks.draw_uniform(store, draws, 4, 3, 1, 0),
                   data=False),
             p.run(f"{tag}.draw_transitions", lambda: _picks.draw_transitions(store, draws, 4, 1),
                   data=False)]
    if store.priorities is not None:
        picks.append(p.run(f"{tag}.draw_prioritized",
                           lambda: _picks.draw_prioritized(store, draws, 4, 1, 0.5), data=False))
    for k, pick in enumerate(picks):
        if pick is None:
            continue
        p.run(f"{tag}.pick_fields#{k}", lambda: _gather.pick_fields(store, pick), data=False)
        p.run(f"{tag}.locate_ends#{k}", lambda: _gather.locate_ends(store, pick), data=False)
        for leaf in range(store.nleaves):
            p.run(f"{tag}.gather#{k}({leaf})", lambda: _gather.gather(store, pick, leaf))
        for leaf in _leaf_numbers(store.layout["obs"]):
            # (The rows after a transition's last step: observations only.)
            p.run(f"{tag}.gather#{k}({leaf},end)", lambda: _gather.gather(store, pick, leaf, True))
        for leaf in (-1, store.nleaves, 2**62):
            p.run(f"{tag}.gather#{k}({leaf})", lambda: _gather.gather(store, pick, leaf),
                  ok=[IndexError, OverflowError])
        p.run(f"{tag}.gather_infos#{k}", lambda: _gather.gather_infos(store, pick, True))
        p.run(f"{tag}.returns#{k}", lambda: _gather.returns(store, pick, 0.9), data=False)
    p.run(f"{tag}.evict_oldest(1)", lambda: store.evict_oldest(1), data=False)
    p.run(f"{tag}.view after evict", view.get_state, data=False)
    p.run(f"{tag}.rows after evict", view.rows)


def _leaf_numbers(structure):
    if isinstance(structure, int):
        return [structure]
    values = structure.values() if isinstance(structure, dict) else structure or ()
    return [leaf for v in values for leaf in _leaf_numbers(v)]


def replay_gather_at_end_case(track):
    """gather(at_end=True) reads the row after a pick's end: a track that
    has no such row (only observations have) is refused, never read."""

    def run(impl, p):
        _replay, _, _ = _replay_modules()
        _gather = _gather_module()
        _allow_replay(p)
        store = _replay.Store(64)
        store.add(_replay_episode(impl, "box"))
        picks = _picks_module().draw_transitions(store, new_draws(np.random.default_rng(0)), 4, 1)
        _gather.locate_ends(store, picks)
        for leaf in _leaf_numbers(store.layout["extras"]["vf"] if track == "vf"
                                  else store.layout[track]):
            p.run(f"gather({leaf},end)", lambda: _gather.gather(store, picks, leaf, True))

    return run


for _track in ("obs", "actions", "rewards", "vf"):
    add("replay_store", f"gather_at_end:{_track}", replay_gather_at_end_case(_track))


def replay_store_add_case(kind, into, prioritized, **frames):
    """An episode of `kind` checked and added to a Store (empty, or holding
    a box episode; `frames`: frame-stacked): refused with the store
    unchanged, or stored and then drawn from and read."""

    def run(impl, p):
        _replay, _, _ = _replay_modules()
        _allow_replay(p, kind)
        store = _replay.Store(64, prioritized=prioritized, tree_size=128 if prioritized else 0,
                              **frames)
        weight = 1.0 if prioritized else None
        if into == "box":
            p.run("add box", lambda: store.add(_replay_episode(impl, "box"), weight), data=False)
        ep = p.run("episode", lambda: _make_replay_episode(impl, kind), data=False)
        if ep is None:
            return
        view = StoreView(store)
        p.run("check", lambda: store.check(ep, {}), state=view, data=False)
        p.run("add", lambda: store.add(ep, weight), state=view, data=False)
        p.run("add again (a chunk of a done or not continued episode)",
              lambda: store.add(ep, weight), state=view, data=False)
        probe_store(p, "store", store)

    return run


for _kind in REPLAY_KINDS:
    for _into in ("empty", "box"):
        for _prioritized in (False, True):
            add("replay_store", f"add:{_kind}:into={_into}:prioritized={_prioritized}",
                replay_store_add_case(_kind, _into, _prioritized))


STORE_ARGS = {
    "capacity=0": (0,), "capacity=-1": (-1,), "capacity=2**62": (2**62,),
    "capacity=2**63": (2**63,), "capacity=str": ("x",), "capacity=None": (None,),
    "capacity=1.5": (1.5,), "tree_size=0": (10, True, 0), "tree_size=3": (10, True, 3),
    "tree_size=-4": (10, True, -4), "tree_size=2**62": (10, True, 2**62),
    "tree_size=2**63": (10, True, 2**63), "tree_size=2": (10, True, 2),
    "storage=missing": (10, False, 0, "/nonexistent/replay-blocks"),
    "storage=int": (10, False, 0, 123), "storage=file": (10, False, 0, "FILE"),
    "storage=bytes": (10, False, 0, b"/nonexistent"),
}


def replay_store_new_case(name):
    """Store(...) with odd arguments: refused, or a store that takes a box
    episode (or refuses it unchanged) and is drawn from."""

    def run(impl, p):
        _replay, _, _ = _replay_modules()
        _allow_replay(p)
        args = STORE_ARGS[name]
        with tempfile.NamedTemporaryFile() as f:
            args = tuple(f.name if a == "FILE" else a for a in args)
            ok = [ValueError] if name in ("capacity=0", "capacity=-1") else None
            store = p.run("Store", lambda: _replay.Store(*args), ok=ok, data=False)
            if store is None:
                return
            weight = 1.0 if store.priorities is not None else None
            for k in range(3):
                p.run(f"add#{k}", lambda: store.add(_replay_episode(impl, "box", steps=2 + k),
                                                    weight),
                      state=StoreView(store), data=False)
            probe_store(p, "store", store)

    return run


for _name in STORE_ARGS:
    add("replay_store", f"new:{_name}", replay_store_new_case(_name))


def _steps_args(n=3):
    """Store.add_steps() arguments for n envs' steps of a box store (its
    obs float32 (2,), actions int64, rewards float64), new episodes s0..."""
    keys = [f"s{i}" for i in range(n)]
    rows = np.array([obs(t) for t in range(n)], np.float32)
    return dict(keys=keys, ids=list(keys), t_started=np.zeros(n, np.int64), obs=[rows],
                next_obs=[rows + 1], actions=[np.arange(1, n + 1, dtype=np.int64)],
                rewards=[np.arange(n, dtype=np.float64) + 1.25],
                terminated=np.zeros(n, np.bool_), truncated=np.zeros(n, np.bool_), infos=None,
                envs=np.arange(n, dtype=np.int64))


STEPS_GARBAGE = {
    "obs_f64": {"obs": [np.ones((3, 2))]},
    "obs_shape": {"obs": [np.ones((3, 3), np.float32)]},
    "obs_rows": {"obs": [np.ones((2, 2), np.float32)]},
    "obs_strided": {"obs": [np.ones((3, 4), np.float32)[:, ::2]]},
    "obs_fortran": {"obs": [np.asfortranarray(np.ones((3, 2), np.float32))]},
    "obs_list": {"obs": [[[1.0, 2.0]] * 3]},
    "obs_none": {"obs": [None]},
    "obs_two_leaves": {"obs": [np.ones((3, 2), np.float32)] * 2},
    "obs_no_leaves": {"obs": []},
    "next_obs_shape": {"next_obs": [np.ones((3, 1), np.float32)]},
    "next_obs_0d": {"next_obs": [np.float32(1.0)]},
    "actions_f32": {"actions": [np.ones(3, np.float32)]},
    "actions_2d": {"actions": [np.ones((3, 1), np.int64)]},
    "rewards_obj": {"rewards": [np.array([1.0, "x", None], dtype=object)]},
    "rewards_short": {"rewards": [np.ones(1)]},
    "rewards_empty": {"rewards": [np.ones(0)]},
    "keys_short": {"keys": ["a"]},
    "ids_short": {"ids": ["a"]},
    "keys_unhashable": {"keys": [[1], [2], [3]]},
    "keys_not_list": {"keys": ("a", "b", "c")},
    "t_f64": {"t_started": np.zeros(3)},
    "t_short": {"t_started": np.zeros(1, np.int64)},
    "t_list": {"t_started": [0, 0, 0]},
    "terminated_int": {"terminated": np.zeros(3, np.int64)},
    "terminated_short": {"terminated": np.zeros(2, np.bool_)},
    "truncated_2d": {"truncated": np.zeros((3, 1), np.bool_)},
    "infos_short": {"infos": [{}]},
    "infos_tuple": {"infos": ({}, {}, {})},
    "infos_not_dicts": {"infos": [1, "x", None]},
    "envs_neg": {"envs": np.array([-1], np.int64)},
    "envs_past": {"envs": np.array([3], np.int64)},
    "envs_huge": {"envs": np.array([2**62], np.int64)},
    "envs_twice": {"envs": np.array([1, 1], np.int64)},
    "envs_f64": {"envs": np.array([0.0])},
    "envs_2d": {"envs": np.zeros((1, 1), np.int64)},
    "envs_none": {"envs": None},
    "join_box_wrong_t": {"keys": ["r-box", "s1", "s2"], "ids": ["r-box", "s1", "s2"]},
    "join_box_with_extras": {"keys": ["r-box", "s1", "s2"], "ids": ["r-box", "s1", "s2"],
                             "t_started": np.array([4, 0, 0], np.int64)},
    "zero_envs": {"keys": [], "ids": [], "t_started": np.zeros(0, np.int64),
                  "obs": [np.zeros((0, 2), np.float32)], "next_obs": [np.zeros((0, 2), np.float32)],
                  "actions": [np.zeros(0, np.int64)], "rewards": [np.zeros(0)],
                  "terminated": np.zeros(0, np.bool_), "truncated": np.zeros(0, np.bool_),
                  "envs": np.zeros(0, np.int64)},
    "valid": {},
}


def replay_store_add_steps_case(name, prioritized):
    """Store.add_steps() (add_transition()'s compiled path) with one bad
    argument: refused with the store unchanged, or stored (the valid
    calls), then drawn from and read; on an empty store, refused."""

    def run(impl, p):
        _replay, _, _ = _replay_modules()
        _allow_replay(p)
        p.allow([f"s{i}" for i in range(3)], [obs(t) + 1 for t in range(3)], 1.25, 2.25, 3.25)
        store = _replay.Store(64, prioritized=prioritized, tree_size=128 if prioritized else 0)
        args = dict(_steps_args(), **STEPS_GARBAGE[name])
        weight = 1.0 if prioritized else None
        view = StoreView(store)
        p.run("add_steps (empty store)", lambda: store.add_steps(**args, weight=weight),
              state=view, data=False, ok=[TypeError, ValueError])
        p.run("add box", lambda: store.add(_replay_episode(impl, "box"), weight), data=False)
        # (Infos of any kind are kept, as add() keeps them.)
        ok = None if name in ("valid", "zero_envs", "infos_not_dicts") else \
            [TypeError, ValueError, AssertionError]
        p.run("add_steps", lambda: store.add_steps(**args, weight=weight), state=view,
              data=False, ok=ok)
        p.run("add_steps again (each joins its episode: its t is off)",
              lambda: store.add_steps(**args, weight=weight), state=view, data=False)
        if prioritized:
            for bad in ("x", None, float("nan"), -1.0, [1.0]):
                p.run(f"add_steps weight={bad!r}",
                      lambda: store.add_steps(**dict(args, keys=["w0", "w1", "w2"],
                                                     ids=["w0", "w1", "w2"]), weight=bad),
                      state=view, data=False)
        probe_store(p, "store", store)

    return run


for _name in STEPS_GARBAGE:
    for _prioritized in (False, True):
        add("replay_store", f"add_steps:{_name}:prioritized={_prioritized}",
            replay_store_add_steps_case(_name, _prioritized))


TRANSITION_GARBAGE = {
    "obs_str": lambda o, a, r, f: ("x", "y", a, r, f, f),
    "obs_ragged": lambda o, a, r, f: ([[1.0], [1.0, 2.0], [3.0]], o, a, r, f, f),
    "obs_huge_axis": lambda o, a, r, f: (np.zeros((3, 2**20), np.float32), o, a, r, f, f),
    "obs_0d": lambda o, a, r, f: (np.float32(1.0), o, a, r, f, f),
    "obs_f16": lambda o, a, r, f: (o.astype(np.float16), o.astype(np.float16), a, r, f, f),
    "obs_dict": lambda o, a, r, f: ({"a": o}, {"a": o}, a, r, f, f),
    "obs_tuple": lambda o, a, r, f: ((o,), (o,), a, r, f, f),
    "obs_not_last_next_obs": lambda o, a, r, f: (o + 1, o, a, r, f, f),
    "action_none": lambda o, a, r, f: (o, o, None, r, f, f),
    "action_objects": lambda o, a, r, f: (o, o, [object()] * 3, r, f, f),
    "reward_none": lambda o, a, r, f: (o, o, a, None, f, f),
    "reward_str": lambda o, a, r, f: (o, o, a, "r", f, f),
    "reward_2d": lambda o, a, r, f: (o, o, a, r[:, None], f, f),
    "reward_empty": lambda o, a, r, f: (o, o, a, r[:0], f, f),
    "reward_nan": lambda o, a, r, f: (o, o, a, r * np.nan, f, f),
    "reward_f32": lambda o, a, r, f: (o, o, a, r.astype(np.float32), f, f),
    "reward_complex": lambda o, a, r, f: (o, o, a, r + 1j, f, f),
    "flags_none": lambda o, a, r, f: (o, o, a, r, None, f),
    "flags_big": lambda o, a, r, f: (o, o, a, r, np.array([7, 0, 0]), f),
    "flags_float": lambda o, a, r, f: (o, o, a, r, f + 0.5, f),
    "flags_2d": lambda o, a, r, f: (o, o, a, r, f[:, None], f),
    "infos_bad": lambda o, a, r, f: (o, o, a, r, f, f, "infos"),
    "infos_short": lambda o, a, r, f: (o, o, a, r, f, f, [{}]),
    "infos_big": lambda o, a, r, f: (o, o, a, r, f, f, [{"x": np.zeros(4)}] * 3),
    "valid_done": lambda o, a, r, f: (o, o, a, r, ~f, f),
    "valid": lambda o, a, r, f: (o, o, a, r, f, f),
}


def replay_add_transition_case(name, prioritized):
    """add_transition() on a buffer holding three envs' open episodes with
    one bad argument: refused with the stored data unchanged (the open
    episodes go on), or stored and then sampled."""

    def run(impl, p):
        _, _, replay = _replay_modules()
        _allow_replay(p)
        p.allow([1.0, 2.0], [0, 1, 2], 0.5, 1.5, 2.5, "x", "y")
        cls = replay.PrioritizedEpisodeReplayBuffer if prioritized else \
            replay.EpisodeReplayBuffer
        buffer = cls(capacity=64, seed=0)
        o = np.array([[1.0, 2.0]] * 3, np.float32)
        a, r, f = np.array([0, 1, 2]), np.array([0.5, 1.5, 2.5]), np.zeros(3, np.bool_)
        p.run("first", lambda: buffer.add_transition(o, o, a, r, f, f), data=False)
        view = StoreView(buffer._store)
        ok = None if name.startswith("valid") or name in ("reward_nan", "infos_big") else \
            [TypeError, ValueError]
        p.run("add_transition", lambda: buffer.add_transition(*TRANSITION_GARBAGE[name](o, a, r, f)),
              state=view, data=False, ok=ok)
        p.run("next", lambda: buffer.add_transition(o, o, a, r, f, f), state=view, data=False)
        p.run("sample_batch", lambda: buffer.sample_batch(4, n_step=2), data=False)
        probe_store(p, "store", buffer._store)

    return run


for _name in TRANSITION_GARBAGE:
    for _prioritized in (False, True):
        add("replay_buffer", f"add_transition:{_name}:prioritized={_prioritized}",
            replay_add_transition_case(_name, _prioritized))

# Frame-stacked stores: every kind of episode into a store whose box rows
# (two floats) stack two one-float frames, and odd frame arguments.
for _kind in REPLAY_KINDS:
    for _into in ("empty", "box"):
        for _prioritized in (False, True):
            add("replay_frames", f"add:{_kind}:into={_into}:prioritized={_prioritized}",
                replay_store_add_case(_kind, _into, _prioritized, frame_stack=2, frame_axis=0))

FRAME_ARGS = {
    "stack=1": (1, 0), "stack=-2": (-2, 0), "stack=2**62": (2**62, 0), "stack=2**63": (2**63, 0),
    "stack=str": ("2", 0), "stack=None": (None, 0), "stack=1.5": (1.5, 0),
    "stack=3": (3, 0), "stack=1024": (1024, 0), "axis=str": (2, "0"), "axis=1.5": (2, 1.5),
    "axis=5": (2, 5), "axis=-9": (2, -9), "axis=2**63": (2, 2**63), "axis=None": (2, None),
    "axis=-1": (2, -1),
}
for _name, (_stack, _axis) in FRAME_ARGS.items():
    STORE_ARGS[f"frames:{_name}"] = (10, False, 0, None, _stack, _axis)
    STORE_ARGS[f"frames:{_name}:prioritized"] = (10, True, 16, None, _stack, _axis)
    add("replay_frames", f"new:{_name}", replay_store_new_case(f"frames:{_name}"))
    add("replay_frames", f"new:{_name}:prioritized",
        replay_store_new_case(f"frames:{_name}:prioritized"))


TREE_VALUES = {
    "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "neg": -1.0, "zero": 0.0,
    "huge": 1e308, "tiny": 1e-320, "f32_nan": np.float32("nan"), "f32": np.float32(2.5),
    "f64": np.float64(2.5), "f16": np.float16(2.5), "int": 3, "bigint": 2**70,
    "hugeint": 2**1100, "bool": True, "str": "x", "None": None, "complex": 1j,
    "array": np.array([1.0]),
}
TREE_LEAVES = {"used": 0, "free": 5, "last": 7, "size": 8, "neg": -1, "huge": 2**62,
               "too_big": 2**63, "str": "x", "None": None, "float": 1.0}


def _small_trees():
    _, _priority, _ = _replay_modules()
    trees = _priority.PriorityTrees(8)
    for key, value in enumerate((1.0, np.float32(2.0), np.float64(3.0))):
        trees.assign(value, key)
    return trees


def probe_trees(p, tag, trees):
    """The trees' reductions, a draw at half the sum, every leaf."""
    p.run(f"{tag}.state", lambda: trees_state(trees), data=False)
    total = p.run(f"{tag}.sum", trees.sum, data=False)
    p.run(f"{tag}.min", trees.min, data=False)
    if isinstance(total, (float, np.floating)):
        p.run(f"{tag}.find_prefixsum_idx(sum/2)",
              lambda: trees.find_prefixsum_idx(total * 0.5), data=False)
    size = trees.size
    if isinstance(size, int) and size <= 1024:
        p.run(f"{tag}.leaves", lambda: [trees.leaf_value(j) for j in range(size)], data=False)
        p.run(f"{tag}.keys", lambda: [trees.key(j) for j in range(size)], data=False)
    p.run(f"{tag}.assign", lambda: trees.assign(1.5, 99), state=TreesView(trees), data=False)


def _tree_calls(trees, op, arg):
    """The calls of case op(arg) on `trees`: (label, call) pairs."""
    if op == "update":
        return [(f"update({leaf})", lambda leaf=leaf: trees.update(TREE_LEAVES[leaf], arg))
                for leaf in ("used", "free", "size", "neg")]
    if op == "free":   # the second time the leaf is free
        return [(f"free#{k}", lambda: trees.free(arg)) for k in range(2)]
    if op == "assign":
        return [("assign", lambda: trees.assign(arg, 9))]
    return [(op, lambda: getattr(trees, op)(arg))]


def replay_trees_op_case(op, arg):
    def run(impl, p):
        trees = _small_trees()
        view = TreesView(trees)
        for label, call in _tree_calls(trees, op, arg):
            p.run(label, call, state=view, data=False)
        probe_trees(p, "trees", trees)

    return run


for _op, _args in (("assign", TREE_VALUES), ("update", TREE_VALUES),
                   ("find_prefixsum_idx", TREE_VALUES), ("free", TREE_LEAVES),
                   ("key", TREE_LEAVES), ("leaf_value", TREE_LEAVES)):
    for _name, _arg in _args.items():
        add("replay_trees", f"{_op}:{_name}", replay_trees_op_case(_op, _arg))


def replay_trees_new_case(size):
    def run(impl, p):
        _, _priority, _ = _replay_modules()
        trees = p.run("PriorityTrees", lambda: _priority.PriorityTrees(size), data=False)
        if trees is None:
            return
        view = TreesView(trees)
        for k in range(10):   # more than a small tree's leaves
            p.run(f"assign#{k}", lambda: trees.assign(1.0 + k, k), state=view, data=False)
        probe_trees(p, "trees", trees)

    return run


for _leaves in (0, 1, 3, -2, 8, 2**62, 2**63, "x", None, 4.0):
    add("replay_trees", f"new:{token(_leaves)}", replay_trees_new_case(_leaves))


def _restore_args(trees):
    sums, mins, free, max_idx, used = trees_state(trees)
    return dict(sum_values=sums, min_values=mins, free_nodes=free, max_idx=max_idx,
                assigned=used)


def _set_leaf(values, leaf, value):
    values = list(values)
    values[len(values) // 2 + leaf] = value
    return values


TREE_RESTORES = {
    "as_is": lambda a: a,
    "sums_short": lambda a: dict(a, sum_values=a["sum_values"][:-1]),
    "sums_tuple": lambda a: dict(a, sum_values=tuple(a["sum_values"])),
    "sums_None": lambda a: dict(a, sum_values=None),
    "mins_str": lambda a: dict(a, min_values="x" * len(a["min_values"])),
    "leaf_nan": lambda a: dict(a, sum_values=_set_leaf(a["sum_values"], 0, float("nan")),
                               min_values=_set_leaf(a["min_values"], 0, float("nan"))),
    "leaf_neg": lambda a: dict(a, sum_values=_set_leaf(a["sum_values"], 0, -1.0),
                               min_values=_set_leaf(a["min_values"], 0, -1.0)),
    "leaf_inf": lambda a: dict(a, sum_values=_set_leaf(a["sum_values"], 0, float("inf")),
                               min_values=_set_leaf(a["min_values"], 0, float("inf"))),
    "leaf_str": lambda a: dict(a, sum_values=_set_leaf(a["sum_values"], 0, "1.0")),
    "leaf_None": lambda a: dict(a, min_values=_set_leaf(a["min_values"], 1, None)),
    "free_leaf_valued": lambda a: dict(a, sum_values=_set_leaf(a["sum_values"], 5, 1.0)),
    "free_twice": lambda a: dict(a, free_nodes=a["free_nodes"][:1] + a["free_nodes"][:-1]),
    "free_missing": lambda a: dict(a, free_nodes=a["free_nodes"][1:]),
    "free_overlap": lambda a: dict(a, free_nodes=[0] + a["free_nodes"][1:]),
    "free_np_int": lambda a: dict(a, free_nodes=[np.int64(x) for x in a["free_nodes"]]),
    "free_huge": lambda a: dict(a, free_nodes=[2**70] + a["free_nodes"][1:]),
    "free_None": lambda a: dict(a, free_nodes=None),
    "assigned_out_of_range": lambda a: dict(a, assigned=[(8, 0)] + a["assigned"][1:]),
    "assigned_neg": lambda a: dict(a, assigned=[(-1, 0)] + a["assigned"][1:]),
    "assigned_twice": lambda a: dict(a, assigned=a["assigned"][:1] * 2 + a["assigned"][2:]),
    "assigned_key_huge": lambda a: dict(a, assigned=[(0, 2**70)] + a["assigned"][1:]),
    "assigned_not_pairs": lambda a: dict(a, assigned=[0, 1, 2]),
    "max_idx_str": lambda a: dict(a, max_idx="x"),
    "max_idx_None": lambda a: dict(a, max_idx=None),
    "max_idx_huge": lambda a: dict(a, max_idx=2**70),
    "max_idx_neg": lambda a: dict(a, max_idx=-5),
}


def replay_trees_restore_case(name):
    """restore() of a corrupted state: refused with the trees unchanged, or
    trees that stay consistent under assign/free/draws."""

    def run(impl, p):
        args = TREE_RESTORES[name](_restore_args(_small_trees()))
        target = _small_trees()
        target.free(1)
        view = TreesView(target)
        p.run("restore", lambda: target.restore(**args), state=view, data=False)
        probe_trees(p, "trees", target)
        for k in range(6):
            p.run(f"assign#{k}", lambda: target.assign(2.0, 50 + k), state=view, data=False)
        for leaf in (0, 2):
            p.run(f"free({leaf})", lambda: target.free(leaf), state=view, data=False)
        probe_trees(p, "trees after", target)

    return run


for _name in TREE_RESTORES:
    add("replay_trees", f"restore:{_name}", replay_trees_restore_case(_name))


RANGES = [(0, 1), (0, 2), (0, 7), (0, 2**32 - 1), (0, 2**32), (0, 2**32 + 1), (-5, 5),
          (-(2**62), 2**62), (-(2**63), 2**63 - 1), (0, 2**63 - 1), (2**63 - 2, 2**63 - 1)]
BAD_RANGES = [((5, 5), ValueError), ((6, 5), ValueError), ((0, 0), ValueError),
              ((0, 2**63), OverflowError), ((-(2**63) - 1, 0), OverflowError),
              (("a", 2), TypeError), ((None, 2), TypeError)]
BIT_GENERATORS = ["PCG64", "MT19937", "Philox", "SFC64", "PCG64DXSM"]


def replay_draws_case(bit_generator):
    """Draws over a Generator of each bit generator: integers(low, high) and
    random() as numpy's own, bit for bit; bad ranges refused."""

    def run(impl, p):
        _replay, _, _ = _replay_modules()
        make = getattr(np.random, bit_generator)
        ours, theirs = np.random.Generator(make(7)), np.random.Generator(make(7))
        draws = new_draws(ours)
        for low, high in RANGES * 3:
            want = int(theirs.integers(low, high))
            p.run(f"integers({low},{high})", lambda: draws.draw_integers(low, high),
                  ok=[Value(want)], data=False)
            want = float(theirs.random())
            p.run(f"random after ({low},{high})", lambda: draws.draw_random(),
                  ok=[Value(want)], data=False)
        for (low, high), error in BAD_RANGES:
            p.run(f"integers({token(low)},{token(high)})", lambda: draws.draw_integers(low, high),
                  ok=[error], data=False)
        p.run("in step after the refusals", lambda: draws.draw_random(),
              ok=[Value(float(theirs.random()))], data=False)

    return run


for _bg in BIT_GENERATORS:
    add("replay_draws", f"generator:{_bg}", replay_draws_case(_bg))


class _GeneratorSubclass(np.random.Generator):
    pass


NOT_GENERATORS = {
    "None": lambda: None, "RandomState": lambda: np.random.RandomState(0),
    "bit_generator": lambda: np.random.PCG64(0), "int": lambda: 42,
    "subclass": lambda: _GeneratorSubclass(np.random.PCG64(0)), "str": lambda: "rng",
    "module": lambda: np.random,
}


def replay_draws_rng_case(name):
    def run(impl, p):
        _replay, _, _ = _replay_modules()
        ok = None if name == "subclass" else [TypeError]
        draws = p.run("Draws", lambda: new_draws(NOT_GENERATORS[name]()), ok=ok, data=False)
        if draws is not None:
            p.run("draw_integers", lambda: draws.draw_integers(0, 10), data=False)
            p.run("draw_random", lambda: draws.draw_random(), data=False)
        buffer = _replay_buffer(impl, "EpisodeReplayBuffer")
        buffer.rng = NOT_GENERATORS[name]()
        p.run("buffer.sample", lambda: buffer.sample(2), ok=ok, state=buffer, data=False)

    return run


for _name in NOT_GENERATORS:
    add("replay_draws", f"rng:{_name}", replay_draws_rng_case(_name))


ROWS_SLOTS = {"first": 0, "neg": -1, "free": 2, "evicted": "EVICTED", "cap": 16,
              "int32_max": 2**31 - 1,
              "huge": 2**62, "too_big": 2**63, "str": "0", "None": None}
ROWS_TRACKS = {"obs": "obs", "infos": "infos", "actions": "actions", "rewards": "rewards",
               "vf": ("extras", "vf"), "missing_extra": ("extras", "nope"),
               "extras_alone": ("extras",), "extras_long": ("extras", "vf", 1),
               "unknown": "foo", "None": None, "int": 5, "list": ["obs"]}
ROWS_SPANS = {"all": (0, 4), "with_lookback": (-1, 4), "past_lookback": (-3, 2),
              "past_end": (0, 7), "final": (4, 5), "reversed": (3, 1), "empty": (2, 2),
              "huge": (-(2**62), 2**62), "int64_ends": (-(2**63), 2**63 - 1),
              "too_big": (0, 2**63)}


def _rows_store(impl):
    _replay, _, _ = _replay_modules()
    store = _replay.Store(64)
    ep = _replay_episode(impl, "box")
    store.add(ep)
    chunk = ep.cut(len_lookback_buffer=1)
    for t in range(4, 6):
        chunk.add_env_step(obs(t + 1), 1, t + 0.25, infos={"t": t + 1},
                           extra_model_outputs={"vf": 10.0 + t})
    store.add(chunk)
    store.add(_replay_episode(impl, "box", steps=2), key="second")
    return store


def replay_rows_case(slot_name, track_name, span_name, numpy):
    def run(impl, p):
        _replay, _, _ = _replay_modules()
        _allow_replay(p)
        store = _rows_store(impl)
        slot = ROWS_SLOTS[slot_name]
        if slot == "EVICTED":
            slot = store.oldest(0)
            store.evict([slot])
        start, stop = ROWS_SPANS[span_name]
        rows = p.run("rows_of", lambda: _replay.rows_of(store, slot, ROWS_TRACKS[track_name],
                                                        start, stop, numpy), data=False)
        if rows is not None:
            p.run("rows", lambda: _plain_rows(rows))
        p.run("episode_fields", lambda: _replay.episode_fields(store, slot), data=False)
        probe_store(p, "store", store)

    return run


for _slot in ROWS_SLOTS:
    add("replay_rows", f"slot={_slot}", replay_rows_case(_slot, "obs", "all", False))
for _track in ROWS_TRACKS:
    for _numpy in (False, True):
        add("replay_rows", f"track={_track}:numpy={_numpy}",
            replay_rows_case("first", _track, "with_lookback", _numpy))
for _span in ROWS_SPANS:
    for _track in ("obs", "rewards"):
        add("replay_rows", f"span={_span}:track={_track}",
            replay_rows_case("first", _track, _span, True))


def _replay_buffer(impl, name, capacity=40, **frames):
    _, _, replay = _replay_modules()
    buffer = getattr(replay, name)(capacity=capacity, **frames)
    second = _replay_episode(impl, "box", steps=3)
    second.id_ = "r-box-2"
    buffer.add([_replay_episode(impl, "box"), second])
    buffer.rng = np.random.default_rng(0)
    return buffer


def _obs_and_actions(episodes):
    return [(e.get_observations(), e.get_actions()) for e in episodes]


def probe_replay_buffer(p, tag, buffer, impl):
    """Every way to draw from `buffer`, a checkpoint round trip, one more add."""
    _, _, replay = _replay_modules()
    prioritized = isinstance(buffer, replay.PrioritizedEpisodeReplayBuffer)
    p.run(f"{tag}.state", buffer.get_state, data=False)
    steps = p.run(f"{tag}.timesteps", buffer.get_num_timesteps, data=False)
    if isinstance(steps, int) and steps:
        buffer.rng = np.random.default_rng(1)
        if prioritized:
            batch = p.run(f"{tag}.sample", lambda: _obs_and_actions(
                buffer.sample(4, n_step=1, beta=0.5, include_infos=True,
                              include_extra_model_outputs=True)))
            if batch is not None:
                p.run(f"{tag}.update_priorities",
                      lambda: buffer.update_priorities(np.full(len(batch), 2.0)), data=False)
        else:
            p.run(f"{tag}.sample(n_step=2)", lambda: _obs_and_actions(
                buffer.sample(4, sample_episodes=True, n_step=2,
                              include_extra_model_outputs=True)))
            p.run(f"{tag}.sample(T=3)", lambda: _obs_and_actions(
                buffer.sample(4, sample_episodes=True, n_step=1, batch_length_T=3,
                              lookback=2)), data=False)
            p.run(f"{tag}.sample(B x T)", lambda: buffer.sample(2, batch_length_T=3),
                  data=False)
        if hasattr(buffer, "sample_batch"):
            p.run(f"{tag}.sample_batch", lambda: buffer.sample_batch(4, n_step=(1, 3)),
                  data=False)
            p.run(f"{tag}.sample_batch(T=3)", lambda: buffer.sample_batch(
                2, batch_length_T=3, lookback=2, include_extra_model_outputs=True),
                data=False)
    state = p.run(f"{tag}.get_state", buffer.get_state, data=False)
    if state is not None:
        copy_ = type(buffer)(capacity=buffer.capacity)
        p.run(f"{tag}.set_state(pickled)", lambda: copy_.set_state(
            pickle.loads(pickle.dumps(state))), data=False)
    p.run(f"{tag}.add", lambda: buffer.add(_replay_episode(impl, "box")), state=buffer,
          data=False)


def take_then_probe(p, impl, tag, buffer, take):
    """take() (an add() or set_state() of `buffer`): refused with the buffer
    unchanged, or taken; then every draw, a checkpoint, one more add."""
    p.run(f"{tag}.take", take, state=buffer, data=False)
    probe_replay_buffer(p, tag, buffer, impl)


REPLAY_BUFFERS = ["EpisodeReplayBuffer", "PrioritizedEpisodeReplayBuffer"]


def replay_buffer_add_case(kind, name, **frames):
    """A buffer holding box episodes takes an episode of `kind` (or refuses
    it unchanged); then it is drawn from, checkpointed, added to.
    `frames`: the buffers' frame-stacking arguments."""

    def run(impl, p):
        _allow_replay(p, kind)
        buffer = _replay_buffer(impl, name, **frames)
        ep = p.run("episode", lambda: _make_replay_episode(impl, kind), data=False)
        if ep is None:
            return
        take_then_probe(p, impl, "buffer", buffer, lambda: buffer.add(ep))
        alone = getattr(_replay_modules()[2], name)(capacity=40, **frames)
        take_then_probe(p, impl, "alone", alone, lambda: alone.add(ep))

    return run


for _kind in REPLAY_KINDS:
    for _name in REPLAY_BUFFERS:
        add("replay_buffer", f"add:{_kind}:{_name}", replay_buffer_add_case(_kind, _name))
        add("replay_frames", f"buffer_add:{_kind}:{_name}",
            replay_buffer_add_case(_kind, _name, frame_stack=2, frame_stack_axis=0))


def _state_edit(key, fn):
    def edit(state):
        state = dict(state)
        state[key] = fn(state[key]) if callable(fn) else fn
        return state

    return edit


REPLAY_STATES = {
    "evicted_2**63": _state_edit("_num_episodes_evicted", 2**63),
    "evicted_2**62": _state_edit("_num_episodes_evicted", 2**62),
    "indices_huge_step": _state_edit("_indices", lambda v: [v[0][:1] + (2**63,) + v[0][2:]]
                                     + v[1:]),
    "indices_float_step": _state_edit("_indices", lambda v: [v[0][:1] + (0.0,) + v[0][2:]]
                                      + v[1:]),
    "indices_arrays": _state_edit("_indices", lambda v: [np.array(x) for x in v]),
    "indices_strings": _state_edit("_indices", lambda v: ["ab" for _ in v]),
    "indices_empty": _state_edit("_indices", []),
    "leaf_2**31": _state_edit("_indices", lambda v: [v[0][:2] + (2**31,)] + v[1:]
                              if len(v[0]) == 3 else v),
    "leaf_np_int": _state_edit("_indices", lambda v: [x[:2] + (np.int64(x[2]),) for x in v]
                               if len(v[0]) == 3 else v),
    "episode_longer": lambda s: dict(s, episodes=[dict(s["episodes"][0], t=s["episodes"][0]["t"]
                                                       + 3)] + s["episodes"][1:]),
    "episode_t_huge": lambda s: dict(s, episodes=[dict(s["episodes"][0], t=2**62)]
                                     + s["episodes"][1:]),
    "episodes_swapped": lambda s: dict(s, episodes=s["episodes"][::-1]),
    "episode_not_a_state": lambda s: dict(s, episodes=["x"] + s["episodes"][1:]),
    "sum_tree_nan": lambda s: dict(s, _sum_segment=[float("nan")] * len(s["_sum_segment"]))
    if "_sum_segment" in s else s,
    "sum_tree_inf_leaf": lambda s: dict(
        s, _sum_segment=_set_leaf(s["_sum_segment"], s["_indices"][0][2], float("inf")),
        _min_segment=_set_leaf(s["_min_segment"], s["_indices"][0][2], float("inf")))
    if "_sum_segment" in s else s,
    "max_idx_str": lambda s: dict(s, _max_idx="x") if "_max_idx" in s else s,
    "max_priority_str": lambda s: dict(s, _max_priority="x") if "_max_priority" in s else s,
    "last_sampled_huge": lambda s: dict(s, _last_sampled_indices=[2**70])
    if "_last_sampled_indices" in s else s,
    "not_a_dict": lambda s: [s],
}


def replay_state_case(name, buffer_name):
    """set_state() of a corrupted checkpoint: refused with the buffer
    unchanged, or a buffer that draws, checkpoints and adds."""

    def run(impl, p):
        _allow_replay(p)
        source = _replay_buffer(impl, buffer_name)
        source.add(_replay_episode(impl, "box", steps=2, id_="r-box-3"))
        if buffer_name.startswith("Prioritized"):
            source.sample(3)
        target = _replay_buffer(impl, buffer_name)
        state = p.run("corrupt", lambda: REPLAY_STATES[name](source.get_state()), data=False)
        take_then_probe(p, impl, "buffer", target, lambda: target.set_state(state))

    return run


for _name in REPLAY_STATES:
    for _buffer in REPLAY_BUFFERS:
        add("replay_state", f"{_name}:{_buffer}", replay_state_case(_name, _buffer))


# Packed checkpoints of the priority trees: unpack_values()/unpack_runs()
# read raw int64/float64/uint8 arrays and make lists of the lengths they
# are given, so garbage there (and flipped bytes in a packed pickle) must be
# refused before a list is made, or load as numbers that set_state() checks.
def _packed_args(kind):
    i64, f64, u8 = np.int64, np.float64, np.uint8
    good = dict(n=8, n_again=8, neutral=0.0, positions=np.array([1, 4], i64),
                numbers=np.array([2.5, 3.0], f64), tags=np.array([0, 3], u8))
    edits = {
        "good": {},
        "n_mismatch": dict(n_again=9),
        "n_negative": dict(n=-1, n_again=-1),
        "n_huge": dict(n=2**40, n_again=2**40),
        "n_2**62": dict(n=2**62, n_again=2**62),
        "position_past_n": dict(positions=np.array([1, 8], i64)),
        "position_negative": dict(positions=np.array([-1, 4], i64)),
        "positions_unordered": dict(positions=np.array([4, 1], i64)),
        "positions_twice": dict(positions=np.array([4, 4], i64)),
        "lengths_differ": dict(numbers=np.array([2.5], f64)),
        "tag_unknown": dict(tags=np.array([0, 200], u8)),
        "int_not_integral": dict(tags=np.array([1, 1], u8)),
        "int_huge": dict(tags=np.array([1, 1], u8), numbers=np.array([1e300, 2.0])),
        "f32_not_float32": dict(numbers=np.array([2.5, 0.1], f64)),
        "nan_inf": dict(numbers=np.array([np.nan, np.inf], f64)),
        "2-d": dict(positions=np.array([[1, 4]], i64)),
        "strings": dict(positions=np.array(["a", "b"])),
        "objects": dict(numbers=np.array([object(), object()])),
        "none": dict(tags=None),
    }
    return dict(good, **edits[kind])


PACKED_VALUES = [
    "good", "n_mismatch", "n_negative", "n_huge", "n_2**62", "position_past_n",
    "position_negative", "positions_unordered", "positions_twice", "lengths_differ",
    "tag_unknown", "int_not_integral", "int_huge", "f32_not_float32", "nan_inf", "2-d",
    "strings", "objects", "none"]
PACKED_RUNS = {
    "good": (5, 5, [0, 7], [3, 2]),
    "n_mismatch": (5, 6, [0, 7], [3, 2]),
    "n_huge": (2**40, 2**40, [0], [2**40]),
    "n_negative": (-5, -5, [0], [1]),
    "lengths_short": (9, 9, [0, 7], [3, 2]),
    "length_zero": (3, 3, [0, 7], [3, 0]),
    "length_negative": (1, 1, [0, 7], [3, -2]),
    "run_past_int64": (2, 2, [2**63 - 1], [2]),
    "lengths_differ": (3, 3, [0, 7], [3]),
    "2-d": (3, 3, [[0]], [[3]]),
    "floats": (3, 3, [0.5], [3.0]),
    "strings": (3, 3, ["a"], ["b"]),
}


def replay_packed_values_case(kind):
    def run(impl, p):
        _, _priority, _ = _replay_modules()
        a = _packed_args(kind)
        p.allow(2.5, 3.0, 2.0, 0.1, 1e300, float("nan"), float("inf"))
        p.run("unpack_values", lambda: _priority.unpack_values(
            a["n"], a["n_again"], a["neutral"], a["positions"], a["numbers"], a["tags"]),
            data=False)

    return run


def replay_packed_runs_case(kind):
    def run(impl, p):
        _, _priority, _ = _replay_modules()
        n, n_again, starts, lengths = PACKED_RUNS[kind]
        p.run("unpack_runs", lambda: _priority.unpack_runs(n, n_again, np.array(starts),
                                                          np.array(lengths)), data=False)

    return run


def replay_packed_pickle_case(buffer_name):
    """A prioritized buffer's pickle (its checkpoint packed) with flipped
    bytes: refused, or a buffer whose checkpoint reads; never a crash."""

    def run(impl, p):
        _allow_replay(p)
        p.check_data = False      # (flipped bytes of numbers are numbers)
        source = _replay_buffer(impl, buffer_name)
        source.sample(3)
        source.update_priorities(np.array([0.5, 2.0, 4.0], np.float32))
        # (A buffer's pickle holds its checkpoint packed; loading it runs
        # unpack_values()/unpack_runs() and set_state().)
        data = pickle.dumps(source, protocol=5)
        rng = np.random.default_rng(len(data))
        for k in range(12):
            bad = bytearray(data)
            for pos in rng.integers(0, len(bad), size=2):
                bad[pos] = int(rng.integers(0, 256))
            loaded = p.run(f"loads#{k}", lambda: pickle.loads(bytes(bad)), data=False)
            if hasattr(loaded, "get_state"):
                p.run(f"loaded#{k}.get_state", loaded.get_state, data=False)

    return run


for _kind in PACKED_VALUES:
    add("replay_packed", f"values:{_kind}", replay_packed_values_case(_kind))
for _kind in PACKED_RUNS:
    add("replay_packed", f"runs:{_kind}", replay_packed_runs_case(_kind))
add("replay_packed", "pickle:PrioritizedEpisodeReplayBuffer",
    replay_packed_pickle_case("PrioritizedEpisodeReplayBuffer"))

# update_priorities() of what a learner might hand over: the priorities and
# the sample_batch() indices checked before a tree leaf changes (the store's
# set_priorities() reads raw int64 keys and float values).
REPLAY_PRIORITIES = {
    "nan": lambda n: [float("nan")] * n,
    "object_array": lambda n: np.array([object()] * n),
    "strings": lambda n: ["1.0"] * n,
    "none": lambda n: None,
    "2-d": lambda n: np.ones((n, 2)),
    "3-d": lambda n: np.ones((n, 1, 1)),
    "0-d": lambda n: np.float64(1.0),
    "complex": lambda n: np.ones(n, np.complex128),
    "big_endian": lambda n: np.ones(n, ">f4"),
    "strided": lambda n: np.ones(2 * n)[::2],
    "huge_int": lambda n: [2**2000] * n,
    "too_many": lambda n: np.ones(n + 1000),
    "empty": lambda n: np.ones(0),
}
REPLAY_INDICES = {
    "own": lambda b: b,
    "made_up": lambda b: np.array([10**15, -5] * (len(b) // 2) + [0] * (len(b) % 2)),
    "int64_max": lambda b: np.full(len(b), 2**63 - 1),
    "int64_min": lambda b: np.full(len(b), -2**63),
    "uint64_max": lambda b: np.full(len(b), 2**64 - 1, np.uint64),
    "floats": lambda b: b.astype(np.float64),
    "strings": lambda b: ["0"] * len(b),
    "2-d": lambda b: np.stack([b, b], axis=1),
    "empty": lambda b: [],
    "one_step_off": lambda b: b + 1,
    "runs_off": lambda b: b + (1 << 40),
}


def replay_update_case(priorities, indices):
    """A prioritized buffer's update_priorities(priorities, indices=...)
    after a sample_batch(): taken, or refused with the buffer unchanged;
    then it draws, checkpoints and adds."""

    def run(impl, p):
        _allow_replay(p)
        p.allow(5.0, 2.0, 1.0)
        buffer = _replay_buffer(impl, "PrioritizedEpisodeReplayBuffer")
        batch = p.run("sample_batch", lambda: buffer.sample_batch(4), data=False)
        if batch is None:
            return
        keys = REPLAY_INDICES[indices](batch["indices"])
        given = REPLAY_PRIORITIES[priorities](len(batch["indices"]))
        p.run("update(indices)", lambda: buffer.update_priorities(given, indices=keys),
              state=buffer, data=False)
        buffer.sample_batch(4)
        p.run("update(last)", lambda: buffer.update_priorities(given), state=buffer,
              data=False)
        probe_replay_buffer(p, "buffer", buffer, impl)

    return run


for _priorities in REPLAY_PRIORITIES:
    add("replay_update", f"priorities={_priorities}:indices=own",
        replay_update_case(_priorities, "own"))
for _indices in REPLAY_INDICES:
    add("replay_update", f"priorities=fives:indices={_indices}",
        replay_update_case("fives", _indices))
REPLAY_PRIORITIES["fives"] = lambda n: np.full(n, 5.0)


def replay_pickle_case(fixture, how, buffer_name):
    """Episodes through pickles (intact, with flipped bytes, with garbage in
    their reduce fields) added to a buffer: stored as they load, or refused
    with the buffer unchanged."""

    def run(impl, p):
        _allow_replay(p)
        p.allow(9.0)
        buffer = _replay_buffer(impl, buffer_name)
        ep = EPISODES[fixture](impl)
        loaded = []
        if how == "intact":
            for protocol in (2, 5):
                loaded.append(pickle.loads(pickle.dumps(ep, protocol=protocol)))
        elif how == "flipped":
            p.check_data = False   # flipped data bytes are data, not heap garbage
            data = pickle.dumps(ep, protocol=5)
            positions = flippable(data)
            rng = np.random.default_rng(len(data))
            for _ in range(12):
                try:
                    loaded.append(pickle.loads(flipped(data, positions, rng, 2)))
                except Exception:   # noqa: BLE001 - refused loads are the pickle cases' matter
                    pass
        else:
            fn, args = ep.__reduce__()
            for i in range(len(args)):
                args2 = list(args)
                args2[i] = REDUCE_GARBAGE[how]
                try:
                    loaded.append(fn(*args2))
                except Exception:   # noqa: BLE001
                    pass
        for k, episode in enumerate(loaded):
            try:   # each its own episode, not a chunk of the one before
                episode.id_ = f"loaded-{k}"
            except Exception:   # noqa: BLE001
                pass
            p.run(f"add#{k}", lambda: buffer.add(episode), state=buffer, data=False)
        probe_replay_buffer(p, "buffer", buffer, impl)

    return run


for _fixture in EPISODES:
    for _how in ["intact", "flipped"] + [n for n in REDUCE_GARBAGE
                                         if n not in ("short_buffer", "neg_lookback_buffer",
                                                      "dict")]:
        for _buffer in REPLAY_BUFFERS:
            add("replay_pickle", f"{_fixture}:{_how}:{_buffer}",
                replay_pickle_case(_fixture, _how, _buffer))


# -- replay buffers kept in a folder (save() / open()) ------------------------------------

KEPT_DAMAGE = ["intact", "block:truncated", "block:overlong", "block:flipped", "block:missing",
               "meta:flipped", "meta:truncated", "meta:resigned-flips"]


def replay_kept_case(damage, buffer_name):
    """A buffer saved to a folder whose files are then damaged: open()
    refuses (an OSError or ValueError) or gives a buffer that draws, takes
    a checkpoint and adds; never a crash. Flipped bits in a metadata file
    whose checksum is made to match test the checks behind the checksum."""

    def run(impl, p):
        if not impl.ours:
            return
        import hashlib
        import tempfile

        from episode.replay import kept

        _allow_replay(p)
        buffer = _replay_buffer(impl, buffer_name)
        folder = tempfile.mkdtemp()
        try:
            buffer.save(folder)
            meta = os.path.join(folder, kept.META_NAME)
            blocks = sorted(n for n in os.listdir(folder) if n.startswith("rows-"))
            target = os.path.join(folder, blocks[0]) if damage.startswith("block") else meta
            with open(target, "rb") as f:
                data = f.read()
            rng = np.random.default_rng(len(data))
            attempts = [data]
            if damage.endswith("truncated"):
                attempts = [data[:-1], data[:len(data) // 2]]
            elif damage.endswith("overlong"):
                attempts = [data + b"\0"]
            elif damage in ("block:flipped", "meta:flipped"):
                p.check_data = False      # flipped rows are data, not heap garbage
                attempts = [flipped(data, np.arange(len(data)), rng, 2) for _ in range(6)]
            elif damage == "meta:resigned-flips":
                p.check_data = False
                payload = data[kept.HEADER_BYTES:]
                attempts = []
                for _ in range(12):
                    bad = flipped(payload, np.arange(len(payload)), rng, 1)
                    attempts.append(kept.MAGIC + kept._HEADER.pack(
                        kept.FORMAT_VERSION, len(bad), hashlib.sha256(bad).digest()) + bad)
            cls = type(buffer)
            for k, attempt in enumerate(attempts):
                if damage == "block:missing":
                    os.unlink(target)
                else:
                    with open(target, "wb") as f:
                        f.write(attempt)
                ok = None if damage in ("intact", "block:flipped", "meta:resigned-flips") \
                    else [OSError, ValueError]
                opened = p.run(f"open#{k}", lambda: cls.open(folder), ok=ok, data=False)
                if opened is not None:
                    probe_replay_buffer(p, f"opened#{k}", opened, impl)
        finally:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)

    return run


for _damage in KEPT_DAMAGE:
    for _buffer in REPLAY_BUFFERS:
        add("replay_kept", f"{_damage}:{_buffer}", replay_kept_case(_damage, _buffer))


# -- the child's main loop -------------------------------------------------------

# A case's time (SIGALRM ends it) in a fork shared with other cases: the
# slowest takes ~0.4 s on an idle machine. One that runs over it runs again
# in a fork of its own with ALONE_SECONDS (a loaded machine is slow, not
# hung); only a case that runs over that too is a hang.
CASE_SECONDS = 2
ALONE_SECONDS = 60


def run_case(name, impl):
    """The report of case `name` (run in this process)."""
    p = Probe()
    p.trace = True
    try:
        if name not in CASES:
            raise KeyError(f"no case {name!r} in this process")
        CASES[name].fn(impl, p)
    except Exception as e:
        p.problem(
            f"the case itself raised {type(e).__name__}: {e}\n"
            + "".join(traceback.format_exc(limit=-4))
        )
    return p.report()


def failed(report):
    """True if the report has any problem."""
    return bool(report.get("problems")) or any(step["problems"] for step in report["steps"])


def _fork_run(names, impl, seconds):
    """Runs `names` one after the other in a fork of this process, `seconds`
    for each, so that a crash or a hang ends only the fork: the reports of
    the cases that finished, the fork's exit status and its output."""
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile() as log:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            with os.fdopen(write_end, "wb") as out:
                for name in names:
                    signal.alarm(seconds)
                    try:
                        report = run_case(name, impl)
                        # Free what the case made while the debug allocator
                        # can still notice a write past a block's end.
                        gc.collect()
                        data = pickle.dumps(report, protocol=4)
                    except BaseException:
                        problem = "the report could not be made:\n" + traceback.format_exc()
                        data = pickle.dumps({"steps": [], "problems": [problem]})
                    out.write(len(data).to_bytes(8, "little") + data)
                    out.flush()
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as inp:
            data = inp.read()
        _, status = os.waitpid(pid, 0)
        log.seek(0)
        output = log.read().decode(errors="replace")
    reports, pos = {}, 0
    for name in names:
        size = int.from_bytes(data[pos : pos + 8], "little")
        if pos + 8 + size > len(data) or size == 0:
            break
        try:
            reports[name] = pickle.loads(data[pos + 8 : pos + 8 + size])
        except Exception as e:  # the fork's memory was too corrupted to report
            output += f"\n(the report of {name} was unreadable: {type(e).__name__}: {e})"
            break
        pos += 8 + size
    return reports, status, output


def _crash(status, output):
    return {
        "crash": {
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "status": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "output": output[-4000:],
        }
    }


def run_alone(name, impl):
    """The report of case `name` run in a fork of its own (ALONE_SECONDS),
    or {"crash": ...} with the fork's signal or exit status and its output."""
    reports, status, output = _fork_run([name], impl, ALONE_SECONDS)
    if name in reports and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return reports[name]
    return _crash(status, output)


CHUNK = 16  # cases per fork; a case that fails there is run again alone


def main():
    np.set_printoptions(threshold=sys.maxsize)
    impl = ours()
    gc.freeze()  # forks then share the imported modules' pages
    names = [line.strip() for line in sys.stdin if line.strip()]
    for i in range(0, len(names), CHUNK):
        chunk = names[i : i + CHUNK]
        reports, _, _ = _fork_run(chunk, impl, CASE_SECONDS)
        for name in chunk:
            report = reports.get(name)
            # A crash, a time-out or a failure in a shared fork may be an
            # earlier case's doing or a busy machine's: the report of record
            # is the one from a fork of its own, with ALONE_SECONDS.
            if report is None or failed(report):
                report = run_alone(name, impl)
            data = base64.b64encode(pickle.dumps(report, protocol=4)).decode()
            print("RESULT", name, data, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
