"""EpisodeCore: the compiled half of SingleAgentEpisode.

It holds the episode's fields and the per-step methods (add_env_step, the
getters, len, validate) so that a sampler's calls go straight to C and from
there to the buffers' C methods. The facade (episode/single_agent_episode.py)
subclasses it and adds the rest of RLlib's API.
"""
import copy
import os
import sys
from collections import defaultdict
from functools import partial

import gymnasium as gym
import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_GetItemWithError, PyDict_Next, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.math cimport NAN, isnan
from libc.string cimport memcmp, memcpy

cimport numpy as cnp

from episode._buffer cimport (BufferCore, StateReader, StateWriter, buffer_from_state,
                             buffer_state, empty_buffer, space_struct)
from episode._column cimport (KIND_EMPTY, KIND_EMPTY_DICT, KIND_FLOAT, KIND_OBJECT, Column,
                             array_bytes)
from episode._index cimport checked_lookback

from episode._buffer import _describe_once
from episode.spaces import space_from_dict, space_to_dict

# The Columns' inline push (inlined here) calls numpy's C-API.
cnp.import_array()


# RLlib gives every rewards buffer this space (it shapes `fill` values).
REWARDS_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)
_describe_once(REWARDS_SPACE)


cdef object Box = gym.spaces.Box
cdef object Discrete = gym.spaces.Discrete

# The classes of the buffers and episodes the core makes: the facade's
# InfiniteLookbackBuffer and SingleAgentEpisode, registered by their modules
# once defined (the core imports nothing above it). An agent's episode of
# the registered class pickles without naming it.
cdef type Buffer = BufferCore
cdef type Episode = EpisodeCore


def _register_facade_class(cls):
    """Tells the core the facade's class of its buffers or of its episodes
    (whichever core class `cls` subclasses)."""
    global Buffer, Episode
    if isinstance(cls, type) and issubclass(cls, BufferCore):
        Buffer = cls
    elif isinstance(cls, type) and issubclass(cls, EpisodeCore):
        Episode = cls
    else:
        raise TypeError(f"expected a subclass of BufferCore or EpisodeCore, got {cls!r}")


cdef type buffer_class():
    return Buffer


# -- episode ids ------------------------------------------------------------------
#
# uuid.uuid4().hex costs about 1.5 us: an os.urandom call and a UUID object
# per id. The same ids (random bytes from os.urandom, version and variant bits
# set, 32 lowercase hex digits) come from bytes read a block at a time. A
# forked child must not hand out the ids left in its parent's block, so it
# drops the block.

cdef object FLOAT64 = np.float64
cdef Py_ssize_t ID_BLOCK_BYTES = 16 * 256
cdef bytes id_block = b""
cdef Py_ssize_t id_pos = 0
cdef const char* HEX_DIGITS = b"0123456789abcdef"
cdef object urandom = os.urandom


cdef str new_id():
    """A fresh id in the format of uuid.uuid4().hex."""
    global id_block, id_pos
    cdef const unsigned char* raw
    cdef char text[32]
    cdef unsigned char b
    cdef int i
    if id_pos > PyBytes_GET_SIZE(id_block) - 16:
        block = urandom(ID_BLOCK_BYTES)
        # No Python call from here to the end: no other thread runs in between.
        id_block = block
        id_pos = 0
    raw = <const unsigned char*>PyBytes_AS_STRING(id_block) + id_pos
    id_pos += 16
    for i in range(16):
        b = raw[i]
        if i == 6:
            b = (b & 0x0F) | 0x40       # version 4
        elif i == 8:
            b = (b & 0x3F) | 0x80       # the RFC 4122 variant
        text[2 * i] = HEX_DIGITS[b >> 4]
        text[2 * i + 1] = HEX_DIGITS[b & 0x0F]
    return PyUnicode_DecodeASCII(text, 32, NULL)


def episode_id():
    """A new episode id: a random hex string formatted as uuid.uuid4().hex."""
    return new_id()


def _drop_id_block():
    global id_block, id_pos
    id_block = b""
    id_pos = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_id_block)


ctypedef fused real:
    float
    double


cdef inline bint within(real* x, real* low, real* high, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        # Written so that NaN is outside, as numpy's comparisons say.
        if not (x[i] >= low[i] and x[i] <= high[i]):
            return False
    return True


cdef inline bint same_layout(cnp.ndarray a, cnp.ndarray b):
    # Same dtype, same shape, both C-contiguous in native byte order.
    cdef int i
    if (cnp.PyArray_TYPE(a) != cnp.PyArray_TYPE(b) or cnp.PyArray_NDIM(a) != cnp.PyArray_NDIM(b)
            or not cnp.PyArray_IS_C_CONTIGUOUS(a) or not cnp.PyArray_IS_C_CONTIGUOUS(b)
            or not cnp.PyArray_ISNOTSWAPPED(a) or not cnp.PyArray_ISNOTSWAPPED(b)):
        return False
    for i in range(cnp.PyArray_NDIM(a)):
        if cnp.PyArray_DIMS(a)[i] != cnp.PyArray_DIMS(b)[i]:
            return False
    return True


cdef bint space_contains(object space, object x) except -1:
    """space.contains(x), with the answer computed in C for the per-step cases:
    a Box and an ndarray of its dtype and shape, a Discrete and a Python int.
    Anything else asks gymnasium."""
    cdef cnp.ndarray arr, low, high
    cdef Py_ssize_t n, nbytes
    cdef long long value
    cdef int overflow = 0
    cdef object t = type(space)
    if t is Box and type(x) is cnp.ndarray:
        arr, low, high = <cnp.ndarray>x, space.low, space.high
        n = cnp.PyArray_SIZE(arr)
        if same_layout(arr, low) and same_layout(arr, high):
            # Same layout: each holds n elements (array_bytes proves it when checked).
            nbytes = n * cnp.PyArray_ITEMSIZE(arr)
            if cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT32:
                return within(<float*>array_bytes(arr, nbytes), <float*>array_bytes(low, nbytes),
                              <float*>array_bytes(high, nbytes), n)
            if cnp.PyArray_TYPE(arr) == cnp.NPY_FLOAT64:
                return within(<double*>array_bytes(arr, nbytes), <double*>array_bytes(low, nbytes),
                              <double*>array_bytes(high, nbytes), n)
    elif t is Discrete and type(x) is int:
        value = PyLong_AsLongLongAndOverflow(x, &overflow)
        if not overflow:
            return space.start <= value < space.start + space.n
    return space.contains(x)


cdef inline BufferCore as_buffer(object obj):
    # Checked: a C method call on anything else (None included) would crash.
    if not isinstance(obj, BufferCore):
        not_a_buffer(obj)
    return <BufferCore>obj


class BufferTypeError(TypeError, AssertionError):
    """A buffer was expected (in extra_model_outputs, say) and something
    else was found. Also an AssertionError: RLlib's getters assert there."""


cdef int not_a_buffer(object obj) except -1:
    # Out of line, so that as_buffer stays small enough to inline.
    raise BufferTypeError(f"expected an episode.InfiniteLookbackBuffer, got "
                          f"{type(obj).__module__}.{type(obj).__qualname__}")


cdef object own_extras(EpisodeCore episode):
    # The extra outputs, each of RLlib's own buffers among them replaced by
    # ours (same state) the first time it is met: RLlib's replay buffers put
    # theirs into episodes of any class (extra_model_outputs["n_step"]).
    cdef object extras = episode._extras
    cdef Py_ssize_t pos = 0
    cdef PyObject* key_ptr
    cdef PyObject* value_ptr
    if type(extras) is not dict and not isinstance(extras, dict):
        return extras
    while PyDict_Next(extras, &pos, &key_ptr, &value_ptr):
        if not isinstance(<object>value_ptr, BufferCore) and is_rllib_buffer(<object>value_ptr):
            for key, value in list(extras.items()):
                if is_rllib_buffer(value):
                    extras[key] = Buffer.from_state(value.get_state())
            break
    return extras


cdef int check_targets(EpisodeCore episode, object incoming) except -1:
    # Where a step's extra output goes into a buffer already there, that is a
    # buffer (TypeError otherwise): checked before the step adds anything.
    # RLlib's own buffers met here are taken over (own_extras) first.
    # `incoming`: a dict, or a list of (key, value) pairs.
    cdef Py_ssize_t pos = 0
    cdef PyObject* key_ptr
    cdef PyObject* value_ptr
    cdef PyObject* found
    cdef object outputs = episode._extras
    if type(incoming) is dict and isinstance(outputs, dict):
        while PyDict_Next(incoming, &pos, &key_ptr, &value_ptr):
            found = PyDict_GetItemWithError(outputs, <object>key_ptr)
            if found is not NULL and not isinstance(<object>found, BufferCore):
                own_extras(episode)       # in place: `outputs` is still the dict
                as_buffer(outputs[<object>key_ptr])
        return 0
    outputs = own_extras(episode)
    for key, _ in (incoming.items() if type(incoming) is dict else incoming):
        if key in outputs:
            as_buffer(outputs[key])
    return 0


cdef bint is_rllib_buffer(object obj) except -1:
    # An InfiniteLookbackBuffer of RLlib's (only where RLlib is loaded).
    module = sys.modules.get("ray.rllib.env.utils.infinite_lookback_buffer")
    cls = getattr(module, "InfiniteLookbackBuffer", None) if module is not None else None
    return cls is not None and isinstance(cls, type) and isinstance(obj, cls)


cdef inline int require_buffers(EpisodeCore episode) except -1:
    # An episode made with __new__ and no __init__ has no buffers yet; calling
    # a C method on a missing one would crash, so fail as RLlib does.
    if (episode.observations is None or episode.actions is None
            or episode.rewards is None or episode.infos is None):
        raise AttributeError(
            f"'{type(episode).__name__}' object has no buffers yet: it was created "
            f"without __init__ (use the constructor or from_state())"
        )
    return 0


cdef Py_ssize_t steps(EpisodeCore episode) except -1:
    """t - t_started, as len() gives it for RLlib's episode: ValueError when
    it is negative (a state with t before t_started), OverflowError when it
    does not fit an index."""
    cdef Py_ssize_t t = episode.t, t_started = episode.t_started
    if t < t_started:
        raise ValueError(f"__len__() should return >= 0: t={t} is before "
                         f"t_started={t_started}")
    if t_started < 0 and t > PY_SSIZE_T_MAX + t_started:
        raise OverflowError(f"cannot fit 'int' into an index-sized integer: "
                            f"t - t_started = {int(t) - int(t_started)}")
    return t - t_started


cdef int inconsistent(str expected) except -1:
    raise AssertionError(f"The episode's data is inconsistent: expected {expected} "
                         f"(after the lookback).")


cdef inline Py_ssize_t rows_after_lookback(BufferCore buf) except -1:
    # len(buf), without a Python call.
    cdef Py_ssize_t n = buf.first().nrows()
    return n - buf._lookback if n > buf._lookback else 0


cdef str outputs_misfit(EpisodeCore episode, object outputs):
    """extras_misfit (see _episode.pxd) past its inline test. Plain dicts of
    our buffers are checked in C (the sampler's step); anything else, and
    every misfit's reason, in misfit_reason."""
    cdef object extras = episode._extras
    cdef object given, key, buf
    cdef Py_ssize_t n, pos = 0, unmatched
    cdef PyObject* key_ptr
    cdef PyObject* value_ptr
    if episode.observations is None or type(extras) is not dict \
            or not (outputs is None or type(outputs) is dict):
        return misfit_reason(episode, outputs)
    given = EMPTY_OUTPUTS if outputs is None else outputs
    n = rows_after_lookback(episode.observations)
    unmatched = PyDict_Size(given)     # its keys not among the stored ones
    while PyDict_Next(extras, &pos, &key_ptr, &value_ptr):
        key, buf = <object>key_ptr, <object>value_ptr      # (held: a key's == runs below)
        if type(buf) is not Buffer and not isinstance(buf, BufferCore):
            return misfit_reason(episode, outputs)
        found = PyDict_GetItemWithError(given, key) is not NULL
        unmatched -= found
        if rows_after_lookback(<BufferCore>buf) + found != n:
            return misfit_reason(episode, outputs)
    if unmatched and n != 1:
        return misfit_reason(episode, outputs)
    return None


cdef dict EMPTY_OUTPUTS = {}   # read only: a step without outputs


cdef str misfit_reason(EpisodeCore episode, object outputs):
    # extras_misfit's answer for any outputs and stored outputs.
    require_buffers(episode)
    if outputs is not None and not hasattr(outputs, "items"):
        return f"they are a {type(outputs).__name__}, not a dict"
    cdef Py_ssize_t n = len(episode.observations)
    cdef Py_ssize_t rows
    given = () if outputs is None else outputs.keys()
    extras = own_extras(episode)
    for key, buf in extras.items():
        rows = len(as_buffer(buf))
        if rows + (key in given) != n:
            return (f"{key!r} has {rows} value(s) for {n - 1} earlier step(s), and the step "
                    f"{'gives' if key in given else 'does not give'} one")
    for key in given:
        if key not in extras and n != 1:
            return f"{key!r} is new, but the {n - 1} earlier step(s) gave none"
    return None


def check_step_extras(EpisodeCore episode, outputs, agent_id):
    """Raises AssertionError, the class RLlib's multi-agent episode raises
    when it validates after a step, if a step of agent `agent_id` with the
    extra model outputs `outputs` would break `episode`'s rule of one extra
    output per action under every key (see extras_misfit in _episode.pxd)."""
    if outputs is not None and not hasattr(outputs, "items"):
        # (RLlib's class: the step reads outputs.items().)
        raise AttributeError(f"the extra model outputs of agent {agent_id!r} must be a dict, "
                             f"got {type(outputs).__name__}")
    reason = extras_misfit(episode, outputs)
    if reason is not None:
        raise AssertionError(f"the step of agent {agent_id!r} would misalign its extra "
                             f"model outputs: {reason}. Each step gives the same keys.")


cdef class EpisodeCore:

    def __cinit__(self):
        self.is_terminated = False
        self.is_truncated = False
        self.t = 0
        self.t_started = 0
        self.start_time = NAN
        self.last_step_time = NAN

    # Times are kept as C doubles (perf_counter's clock); None reads as unset.
    @property
    def _start_time(self):
        return time_or_none(self.start_time)

    @_start_time.setter
    def _start_time(self, value):
        self.start_time = time_from(value)

    @property
    def _last_step_time(self):
        return time_or_none(self.last_step_time)

    @_last_step_time.setter
    def _last_step_time(self, value):
        self.last_step_time = time_from(value)

    @property
    def _last_added_observation(self):
        cdef Py_ssize_t n
        if self.last_row_observed:
            n = self.observations.len_incl_lookback() if self.observations is not None else 0
            return self.observations.item_at(n - 1) if n else None
        return self.last_observation

    @_last_added_observation.setter
    def _last_added_observation(self, value):
        self.last_observation = value
        self.last_row_observed = False

    @property
    def _last_added_infos(self):
        # Empty infos are not kept as objects (see add_env_step).
        return {} if self.last_infos is None else self.last_infos

    @_last_added_infos.setter
    def _last_added_infos(self, value):
        self.last_infos = value if value else None

    # Most episodes never get custom data: the dict is made on first use.
    @property
    def _custom_data(self):
        if self.custom_data_ is None:
            self.custom_data_ = {}
        return self.custom_data_

    @_custom_data.setter
    def _custom_data(self, value):
        self.custom_data_ = value

    @property
    def extra_model_outputs(self):
        """The model's extra outputs: a dict of key -> InfiniteLookbackBuffer."""
        return own_extras(self)

    @extra_model_outputs.setter
    def extra_model_outputs(self, value):
        self._extras = value

    # -- the step ---------------------------------------------------------------

    def add_env_step(self, observation, action, reward, infos=None, *,
                     terminated=False, truncated=False, extra_model_outputs=None):
        """Adds one environment step: the observation after `action`, the
        reward, infos, the done flags and the model's extra outputs."""
        self.append_step(observation, action, reward, infos, terminated, truncated,
                         extra_model_outputs)

    cdef int append_step(self, object observation, object action, object reward,
                         object infos, object terminated, object truncated,
                         object extra_model_outputs) except -1:
        # add_env_step without the Python call (the multi-agent step calls it).
        cdef BufferCore buf
        cdef Py_ssize_t pos
        cdef PyObject* key_ptr
        cdef PyObject* value_ptr
        cdef PyObject* found
        require_buffers(self)
        if self.is_terminated or self.is_truncated:
            raise AssertionError("The agent is already done: no data can be added to its episode.")
        if self.t == PY_SSIZE_T_MAX:
            raise OverflowError("t cannot count past 2**63 - 1 env steps")
        if self.rewards.is_finalized():
            # Numpy'ized: check everything before appending anything.
            self._check_step(observation, action, reward, extra_model_outputs)
        if extra_model_outputs is not None and type(extra_model_outputs) is not dict:
            # Another mapping: its items, read before anything is appended
            # (AttributeError, as RLlib's, for something without items()).
            extra_items = list(extra_model_outputs.items())
        outputs = None
        if extra_model_outputs is not None:
            check_targets(self, extra_model_outputs if type(extra_model_outputs) is dict
                          else extra_items)
            outputs = self._extras
        self.observations.push(observation)
        self.actions.push(action)
        self.rewards.push(reward)
        if infos:
            self.infos.push(infos)
            self.last_infos = infos
        else:
            self.infos.push_empty_dict()
            self.last_infos = None
        self.t += 1
        if extra_model_outputs is not None:
            if type(extra_model_outputs) is dict and isinstance(outputs, dict):
                # PyDict_Next and C lookups: no Python-level calls per key.
                pos = 0
                while PyDict_Next(extra_model_outputs, &pos, &key_ptr, &value_ptr):
                    found = PyDict_GetItemWithError(outputs, <object>key_ptr)
                    if found is NULL:
                        outputs[<object>key_ptr] = self._new_buffer([<object>value_ptr])
                    else:
                        as_buffer(<object>found).push(<object>value_ptr)
            else:
                for key, value in (extra_model_outputs.items() if type(extra_model_outputs) is dict
                                   else extra_items):
                    if key not in outputs:
                        outputs[key] = self._new_buffer([value])
                    else:
                        as_buffer(outputs[key]).push(value)
        self.end_step(observation, terminated, truncated, now())
        return 0

    cdef int _check_step(self, object observation, object action, object reward,
                         object extra_model_outputs) except -1:
        # RLlib's order: the appends' own errors (ValueError for a row of the
        # wrong shape) come before the space checks (AssertionError). A row a
        # finalized Column takes as it is (each step's usual case) needs no
        # call: what check_append would check, row_fits has said.
        cdef Py_ssize_t pos = 0
        cdef PyObject* key_ptr
        cdef PyObject* value_ptr
        cdef PyObject* found
        cdef Column col
        col = self.observations.flat()
        if col is None or col.finalized and not col.row_fits(observation):
            self.observations.check_append(observation)
        col = self.actions.flat()
        if col is None or col.finalized and not col.row_fits(action):
            self.actions.check_append(action)
        col = self.rewards.flat()
        if col is None or col.finalized and not col.row_fits(reward):
            self.rewards.check_append(reward)
        if extra_model_outputs is not None:
            outputs = own_extras(self)
            if type(extra_model_outputs) is dict and type(outputs) is dict:
                # PyDict_Next and C lookups: no Python-level calls per key.
                while PyDict_Next(extra_model_outputs, &pos, &key_ptr, &value_ptr):
                    found = PyDict_GetItemWithError(outputs, <object>key_ptr)
                    if found is NULL:
                        continue
                    if isinstance(<object>found, BufferCore):
                        col = (<BufferCore>found).flat()
                        if col is not None and (not col.finalized
                                                or col.row_fits(<object>value_ptr)):
                            continue
                    as_buffer(<object>found).check_append(<object>value_ptr)
            else:
                for key, value in extra_model_outputs.items():
                    if key in outputs:
                        as_buffer(outputs[key]).check_append(value)
        space = self._observation_space
        if space is not None and not space_contains(space, observation):
            raise AssertionError(
                f"`observation` {observation} does NOT fit SingleAgentEpisode's "
                f"observation_space: {space}!"
            )
        space = self._action_space
        if space is not None and not space_contains(space, action):
            raise AssertionError(
                f"`action` {action} does NOT fit SingleAgentEpisode's action_space: {space}!"
            )
        return 0

    cpdef validate(self):
        """Raises AssertionError unless the tracks have consistent lengths: one
        observation per info, and (once reset) one more observation than
        actions, rewards and each extra model output (none of any before)."""
        require_buffers(self)
        cdef Py_ssize_t n_obs = rows_after_lookback(self.observations)
        cdef Py_ssize_t n_infos = rows_after_lookback(self.infos)
        cdef Py_ssize_t n_actions = rows_after_lookback(self.actions)
        cdef Py_ssize_t n_rewards = rows_after_lookback(self.rewards)
        if n_obs != n_infos:
            inconsistent(f"one info per observation, got {n_obs} observations and "
                         f"{n_infos} infos")
        if n_obs == 0:
            if n_rewards != 0 or n_actions != 0:
                inconsistent(f"no actions or rewards without observations, got "
                             f"{n_actions} actions and {n_rewards} rewards")
            for key, buf in own_extras(self).items():
                if len(buf) != 0:
                    inconsistent(f"no extra model outputs without observations, got "
                                 f"{len(buf)} of {key!r}")
        else:
            if n_rewards + 1 != n_obs or n_actions + 1 != n_obs:
                inconsistent(f"one action and one reward per observation after the "
                             f"first, got {n_obs} observations, {n_actions} actions and "
                             f"{n_rewards} rewards")
            for key, buf in own_extras(self).items():
                if len(buf) != n_obs - 1:
                    inconsistent(f"one extra model output per action, got {len(buf)} "
                                 f"of {key!r} for {n_obs - 1} actions")

    def __len__(self):
        """Number of env steps in this episode chunk (lookback excluded)."""
        return steps(self)

    # -- reset and to_numpy ---------------------------------------------------------

    def add_env_reset(self, observation, infos=None):
        """Adds the reset observation (and infos) of a new episode."""
        require_buffers(self)
        if len(self.observations) > 0:
            raise AssertionError("add_env_reset() expects an episode without observations; "
                                 "this one is already reset")
        if self.is_terminated or self.is_truncated:
            raise AssertionError("add_env_reset() expects an episode that is not done")
        if not self.t == self.t_started == 0:
            raise AssertionError("add_env_reset() expects t == t_started == 0, got "
                                 f"t={self.t}, t_started={self.t_started}")
        self.store_reset(observation, infos)
        self.validate()

    cdef int store_reset(self, object observation, object infos) except -1:
        # add_env_reset's writes, into an episode without observations.
        self.observations.push(observation)
        if infos:
            self.infos.push(infos)
        else:
            self.infos.push_empty_dict()
        self.last_observation = observation
        self.last_row_observed = False
        self.last_infos = infos if infos else None
        self.start_time = now()
        return 0

    def get_return(self):
        """Sum of the chunk's rewards (lookback excluded)."""
        cdef BufferCore rewards = self.rewards
        cdef Column col
        cdef Py_ssize_t i, first, n
        cdef double total = 0.0
        cdef const double* row
        if rewards is not None and rewards.flat() is not None:
            col = rewards.flat()
            # float64 rows that sum() would add as numpy floats, one after
            # the other (list-mode Python floats are left to sum(): newer
            # Pythons compensate their rounding).
            if (col.descr is not None and col.descr.type_num == cnp.NPY_DOUBLE
                    and col.row_ndim == 0 and col.pod and not col.row_type_open
                    and (col.finalized or col.kind != KIND_FLOAT)
                    and col.kind != KIND_EMPTY_DICT):
                first = rewards._lookback
                n = col.size - first
                if n <= 0:
                    return 0
                row = <const double*>col.row_ptr(first, n)
                for i in range(n):
                    total += row[i]
                return FLOAT64(total)
        return sum(self.get_rewards())

    def to_numpy(self):
        """Turns observations, actions, rewards and extra model outputs into
        numpy arrays (infos stay a list). Returns self."""
        self.validate()
        # (Raises for a state with t before t_started: before any change.)
        cdef Py_ssize_t n = steps(self)
        if (n > 0 and flips_only(self.observations) and flips_only(self.actions)
                and flips_only(self.rewards) and outputs_flip_only(self._extras)):
            # The usual episode: each track one typed Column, which finalize()
            # only switches to numpy semantics (nothing can fail).
            flip(self.observations)
            flip(self.actions)
            flip(self.rewards)
            for buf in (<dict>self._extras).values():
                flip(<BufferCore>buf)
            return self
        buffers = [self.observations]
        if n > 0:
            buffers += [self.actions, self.rewards, *own_extras(self).values()]
        # Everything that can fail (batching items on the object path) first:
        # an episode whose data cannot be batched is left as it was.
        storages = [(<BufferCore>buf).prepare_finalize() if isinstance(buf, BufferCore)
                    else None for buf in buffers]
        for buf, storage in zip(buffers, storages):
            if isinstance(buf, BufferCore):
                (<BufferCore>buf).commit_finalize(storage)
            else:
                buf.finalize()
        return self

    # -- pieces -------------------------------------------------------------------

    def cut(self, len_lookback_buffer=0):
        """The next chunk of this episode: it starts at `t`, with the last
        observation (and `len_lookback_buffer` steps before it) as lookback.
        Numpy'ized data is shared, not copied."""
        cdef Py_ssize_t lb, n
        require_buffers(self)
        if self.is_terminated or self.is_truncated:
            raise AssertionError("cut() expects an episode that is not done")
        if not len_lookback_buffer >= 0:
            raise AssertionError(f"cut() expects len_lookback_buffer >= 0, got "
                                 f"{len_lookback_buffer!r}")
        # Beyond any buffer's length a lookback takes everything: capped, it
        # fits the C arithmetic.
        lb = min(len_lookback_buffer, 1 << 60)
        obs_slice = slice(-lb - 1, None)
        rest = slice(-lb, None) if lb > 0 else slice(None, 0)
        rewards = self.rewards.sub_buffer(rest, False, 0, REWARDS_SPACE)
        n = rewards.len_incl_lookback()          # len_lookback_buffer="auto"
        rewards._lookback = n                    # its own length: in range
        infos = self.infos.sub_buffer(obs_slice, False, n, None)
        if infos.len_incl_lookback() == 0:
            # The constructor's rule (RLlib's cut goes through it): no infos
            # given, one empty dict per observation given.
            infos = empty_dicts(len(self.get_observations(obs_slice)), n)
        episode = assemble(
            type(self), self.id_,
            self.observations.sub_buffer(obs_slice, False, n, self._observation_space),
            infos,
            self.actions.sub_buffer(rest, False, n, self._action_space),
            rewards,
            {k: as_buffer(v).sub_buffer(rest, False, n, None)
             for k, v in own_extras(self).items()},
            False, False, self.t,
        )
        episode._observation_space = self._observation_space
        episode._action_space = self._action_space
        if self.custom_data_:
            (<EpisodeCore>episode).custom_data_ = copy.deepcopy(self.custom_data_)
        return episode

    def slice(self, slice_, *, len_lookback_buffer=None):
        """A new episode with the steps in `slice_` and a lookback of
        `len_lookback_buffer` steps (default: this episode's). A piece of a
        numpy'ized episode shares memory with it."""
        require_buffers(self)
        cdef Py_ssize_t n = steps(self)
        start, stop = slice_.start, slice_.stop
        start = 0 if start is None else (n + start if start < 0 else start)
        stop = n if stop is None else (n + stop if stop < 0 else stop)
        step = slice_.step if slice_.step is not None else 1
        keep_done = stop == n
        obs_space, action_space = self._observation_space, self._action_space
        observations = _piece(self.observations, start, stop, step, 1, len_lookback_buffer,
                              obs_space)
        infos = _piece(self.infos, start, stop, step, 1, len_lookback_buffer, None)
        actions = _piece(self.actions, start, stop, step, 0, len_lookback_buffer, action_space)
        rewards = _piece(self.rewards, start, stop, step, 0, len_lookback_buffer, None)
        if len(infos) == 0:
            # The constructor's rule (RLlib's slice goes through it): no infos
            # after the lookback, one empty dict per observation after it.
            infos = empty_dicts(len(observations), len(rewards))
        episode = assemble(
            type(self), self.id_, observations, infos, actions, rewards,
            {k: _piece(v, start, stop, step, 0, len_lookback_buffer, None)
             for k, v in own_extras(self).items()},
            self.is_terminated if keep_done else False,
            self.is_truncated if keep_done else False,
            self.t_started + start,
        )
        episode._observation_space = obs_space
        episode._action_space = action_space
        return episode

    # -- getters ------------------------------------------------------------------

    def get_observations(self, indices=None, *, neg_index_as_lookback=False, fill=None,
                         one_hot_discrete=False):
        """Observations at `indices` (see InfiniteLookbackBuffer.get)."""
        require_buffers(self)
        return self.observations.cget(indices, neg_index_as_lookback, fill,
                                      one_hot_discrete, False, None)

    def get_infos(self, indices=None, *, neg_index_as_lookback=False, fill=None):
        """Infos at `indices` (see InfiniteLookbackBuffer.get)."""
        require_buffers(self)
        return self.infos.cget(indices, neg_index_as_lookback, fill, False, False, None)

    def get_actions(self, indices=None, *, neg_index_as_lookback=False, fill=None,
                    one_hot_discrete=False):
        """Actions at `indices` (see InfiniteLookbackBuffer.get)."""
        require_buffers(self)
        return self.actions.cget(indices, neg_index_as_lookback, fill,
                                 one_hot_discrete, False, None)

    def get_rewards(self, indices=None, *, neg_index_as_lookback=False, fill=None):
        """Rewards at `indices` (see InfiniteLookbackBuffer.get)."""
        require_buffers(self)
        return self.rewards.cget(indices, neg_index_as_lookback, fill, False, False, None)

    def get_extra_model_outputs(self, key, indices=None, *, neg_index_as_lookback=False,
                                fill=None):
        """The extra model output `key` at `indices` (KeyError for an unknown key)."""
        require_buffers(self)
        return as_buffer(own_extras(self)[key]).cget(indices, neg_index_as_lookback, fill, False, False, None)


cdef BufferCore _piece(object buf, start, stop, step, int extra,
                       len_lookback_buffer, space):
    """The part of `buf` that slice() keeps, with RLlib's lookback rule."""
    as_buffer(buf)
    cdef Py_ssize_t own = (<BufferCore>buf)._lookback
    lb = len_lookback_buffer if len_lookback_buffer is not None else own
    if start >= 0 and start - lb < 0 and own < lb - start:
        lb = own + start
    return (<BufferCore>buf).sub_buffer(slice(start - lb, stop + extra, step), True, lb, space)


def assemble(cls, id_, BufferCore observations, BufferCore infos, BufferCore actions,
             BufferCore rewards, dict extra_model_outputs, terminated, truncated,
             t_started):
    """A new episode of class `cls` from ready buffers, as the constructor
    would build it from them, without its Python-level work. (Where the
    constructor would replace empty infos, the caller passes the replacement.)"""
    cdef EpisodeCore episode = EpisodeCore.__new__(cls)
    episode.id_ = id_
    episode.observations = observations
    episode.infos = infos
    episode.actions = actions
    episode.rewards = rewards
    episode._extras = extra_model_outputs
    episode.is_terminated = terminated
    episode.is_truncated = truncated
    t_started = t_started or 0
    episode.t_started = t_started
    episode.t = len(rewards) + t_started      # Python ints: OverflowError, not a wrap
    episode.validate()
    return episode


# -- building episodes and buffers without the constructor ----------------------------


cpdef object last_added(EpisodeCore episode):
    """What the episode's last added observation and infos are, as a dataset
    keeps them: None (none: a constructed or restored episode), True (its
    observations' and infos' last rows, as add_env_step leaves them) or the
    pair (observation, infos)."""
    cdef Py_ssize_t n = episode.infos.len_incl_lookback()
    cdef Column infos_col
    observation, infos = episode.last_observation, episode.last_infos
    if not episode.last_row_observed and observation is None and infos is None:
        return None
    if n and (episode.last_row_observed or is_last_row(episode.observations, observation)):
        infos_col = episode.infos.flat()
        if infos is None and infos_col is not None and infos_col.kind == KIND_EMPTY_DICT:
            return True     # (the last infos are an empty dict: none made to see it)
        last = episode.infos.item_at(n - 1)
        if (infos is None and type(last) is dict and not last) or last is infos:
            return True
    return (episode._last_added_observation, episode._last_added_infos)


cdef int set_track(BufferCore buf, object tree, Py_ssize_t lookback, object key) except -1:
    # `tree` as the buffer's storage with `lookback` rows before step 0,
    # checked (`key`: the extra output's, None for the other tracks).
    buf.set_storage(tree)
    if lookback > buf.first().nrows():
        if key is None:
            raise ValueError(f"a lookback of {lookback} rows in a track of "
                             f"{buf.first().nrows()}")
        raise ValueError(f"a lookback of {lookback} rows in {key!r}, which has "
                         f"{buf.first().nrows()}")
    buf._lookback = lookback
    return 0


def make_episode(cls, id_, observations, infos, actions, rewards, dict extra_model_outputs,
                 tuple lookbacks, terminated, truncated, Py_ssize_t t_started,
                 observation_space, action_space, agent_id=None, module_id=None,
                 multi_agent_episode_id=None, start_time=None, last_step_time=None,
                 custom_data=None, bint defaultdict_extras=False, last_added=None):
    """An episode of class `cls` (an EpisodeCore subclass) over ready
    storage: each track a Column or a dict/tuple tree of Columns (infos one
    Column), `lookbacks` the rows before step 0 of (observations, infos,
    actions, rewards, every extra model output). What a dataset reader
    builds from a file's columns: nothing is copied or converted here, and
    everything is checked (the trees, the lookbacks, then validate()) before
    the episode is handed out: ValueError/TypeError/AssertionError. With
    `defaultdict_extras` the extra outputs are a defaultdict, as from_state()
    makes them; `last_added` is what last_added() said of the episode."""
    if not (isinstance(cls, type) and issubclass(cls, EpisodeCore)):
        raise TypeError(f"cannot make an episode of {cls!r:.100}")
    if len(lookbacks) != 5:
        raise ValueError("lookbacks are (observations, infos, actions, rewards, extras)")
    return build_episode(cls, id_, observations, infos, actions, rewards, extra_model_outputs,
                         checked_lookback(lookbacks[0]), checked_lookback(lookbacks[1]),
                         checked_lookback(lookbacks[2]), checked_lookback(lookbacks[3]),
                         checked_lookback(lookbacks[4]), terminated, truncated, t_started,
                         observation_space, action_space, agent_id, module_id,
                         multi_agent_episode_id, state_time(start_time, "start_time"),
                         state_time(last_step_time, "last_step_time"), custom_data,
                         defaultdict_extras, last_added)


cdef EpisodeCore build_episode(type cls, object id_, object observations, object infos,
                               object actions, object rewards, dict extra_model_outputs,
                               Py_ssize_t lb_obs, Py_ssize_t lb_infos, Py_ssize_t lb_actions,
                               Py_ssize_t lb_rewards, Py_ssize_t lb_extras, object terminated,
                               object truncated, Py_ssize_t t_started,
                               object observation_space, object action_space,
                               object agent_id, object module_id,
                               object multi_agent_episode_id, double start_time,
                               double last_step_time, object custom_data,
                               bint defaultdict_extras, object last_added):
    # The checked part of make_episode (its class and lookbacks checked by the caller).
    cdef EpisodeCore episode
    cdef BufferCore buf
    if type(infos) is not Column:
        raise TypeError(f"infos are one Column, not {type(infos).__name__}")
    episode = EpisodeCore.__new__(cls)
    init_empty(episode, id_, observation_space, action_space, terminated, truncated,
               t_started, agent_id, module_id, multi_agent_episode_id)
    set_track(episode.observations, observations, lb_obs, None)
    set_track(episode.infos, infos, lb_infos, None)
    set_track(episode.actions, actions, lb_actions, None)
    set_track(episode.rewards, rewards, lb_rewards, None)
    extras = {}
    for key, tree in extra_model_outputs.items():
        buf = empty_buffer(Buffer, None, None)
        set_track(buf, tree, lb_extras, key)
        extras[key] = buf
    if defaultdict_extras:
        extras = defaultdict(partial(Buffer, lookback=lb_obs), extras)
    episode._extras = extras
    # Python ints: OverflowError, not a wrap.
    episode.t = <object>t_started + (episode.rewards.len_incl_lookback() - lb_rewards)
    episode.start_time = start_time
    episode.last_step_time = last_step_time
    episode.custom_data_ = custom_data if custom_data else None
    episode.validate()
    if last_added is True:
        n = episode.infos.len_incl_lookback()
        if n:
            episode.last_row_observed = True
            last = episode.infos.item_at(n - 1)
            episode.last_infos = None if type(last) is dict and not last else last
    elif last_added is not None:
        if type(last_added) is not tuple or len(last_added) != 2:
            raise ValueError("last_added is None, True or (observation, infos)")
        episode._last_added_observation, episode._last_added_infos = last_added
    return episode


def init_without_data(EpisodeCore episode, id_, observations, observation_space, infos,
                      actions, action_space, rewards, terminated, truncated,
                      extra_model_outputs, t_started, len_lookback_buffer, agent_id,
                      module_id, multi_agent_episode_id):
    """Does what SingleAgentEpisode.__init__ does with these arguments when
    they hold no data (no observations, infos, actions, rewards or extra
    model outputs; a plain lookback length and start), and returns True.
    Returns False, having changed nothing, for any other arguments."""
    cdef Py_ssize_t start = 0
    if not (observations is None and infos is None and actions is None and rewards is None
            and extra_model_outputs is None):
        return False
    if not ((type(len_lookback_buffer) is int and len_lookback_buffer >= 0)
            or (type(len_lookback_buffer) is str and len_lookback_buffer == "auto")):
        return False
    if t_started is not None and type(t_started) is not int:
        return False
    if not id_:
        id_ = new_id()
    if t_started is not None:
        start = t_started           # OverflowError past 64 bits, as the constructor's
    init_empty(episode, id_, observation_space, action_space, terminated, truncated, start,
               agent_id, module_id, multi_agent_episode_id)
    return True


cdef int init_empty(EpisodeCore episode, object id_, object observation_space,
                    object action_space, object terminated, object truncated,
                    Py_ssize_t start, object agent_id, object module_id,
                    object multi_agent_episode_id) except -1:
    # The fields of an episode without data (see init_without_data).
    episode.id_ = id_
    episode.agent_id = agent_id
    episode.module_id = module_id
    episode.multi_agent_episode_id = multi_agent_episode_id
    episode.observations = empty_buffer(Buffer, observation_space,
                                        space_struct(observation_space))
    episode._observation_space = observation_space
    episode.infos = empty_buffer(Buffer, None, None)
    episode.actions = empty_buffer(Buffer, action_space, space_struct(action_space))
    episode._action_space = action_space
    episode.rewards = empty_buffer(Buffer, REWARDS_SPACE, REWARDS_SPACE)
    episode.is_terminated = terminated
    episode.is_truncated = truncated
    episode._extras = {}
    episode.t_started = start
    episode.t = start
    episode.start_time = NAN
    episode.last_step_time = NAN
    episode.last_observation = None
    episode.last_row_observed = False
    episode.last_infos = None
    return 0


cdef inline bint flips_only(BufferCore buf) noexcept:
    # buf.finalize() only switches its one typed Column to numpy semantics
    # (or nothing: finalized already), as prepare_finalize() finds it.
    cdef Column col = buf.flat() if buf is not None and buf._tree_leaves is None else None
    return col is not None and (col.finalized or (
        col.nrows() > 0 and col.kind != KIND_OBJECT and col.kind != KIND_EMPTY_DICT
        and col.kind != KIND_EMPTY))


cdef bint outputs_flip_only(object extras) except -1:
    # The same for every extra output (an exact dict of our buffers).
    if type(extras) is not dict:
        return False
    for buf in (<dict>extras).values():
        if not (isinstance(buf, BufferCore) and flips_only(<BufferCore>buf)):
            return False
    return True


cdef inline int flip(BufferCore buf) except -1:
    if not buf.flat().finalized:
        buf.flat().finalize_typed()
    return 0


def started_episode(cls, observation_space, action_space, observation, infos):
    """cls(observation_space=..., action_space=...) after
    add_env_reset(observation, infos), without the Python-level __init__."""
    return start_episode(cls, observation_space, action_space, observation, infos)


cdef EpisodeCore empty_episode(type cls, object observation_space, object action_space):
    cdef EpisodeCore episode = EpisodeCore.__new__(cls)
    init_empty(episode, new_id(), observation_space, action_space, False, False, 0, None,
               None, None)
    return episode


cdef EpisodeCore start_episode(type cls, object observation_space, object action_space,
                               object observation, object infos):
    cdef EpisodeCore episode = empty_episode(cls, observation_space, action_space)
    # What add_env_reset checks holds for a new episode, and one observation
    # and one info are consistent tracks.
    episode.store_reset(observation, infos)
    return episode


def new_episode(cls, id_):
    """An episode of class `cls` with id `id_` (a new one when `id_` is
    falsy) and nothing else set, for from_state() to fill in."""
    cdef EpisodeCore episode = EpisodeCore.__new__(cls)
    episode.id_ = id_ if id_ else new_id()
    return episode


def buffer_of(list items):
    """InfiniteLookbackBuffer(items), without the Python-level __init__."""
    cdef BufferCore buffer = empty_buffer(Buffer, None, None)
    for item in items:
        buffer.push(item)
    return buffer


cdef BufferCore empty_dicts(Py_ssize_t count, Py_ssize_t lookback):
    """InfiniteLookbackBuffer([{}] * count, lookback)."""
    cdef BufferCore buffer = empty_buffer(Buffer, None, None)
    cdef Py_ssize_t i
    for i in range(count):
        buffer.push_empty_dict()
    buffer._lookback = checked_lookback(min(lookback, count))
    return buffer


cdef bint all_empty_dicts(list items):
    cdef Py_ssize_t i
    cdef PyObject* item
    for i in range(PyList_GET_SIZE(items)):
        item = PyList_GET_ITEM(items, i)
        if type(<object>item) is not dict or PyDict_Size(<object>item) != 0:
            return False
    return True


def infos_state(infos):
    """infos.get_state(). While all infos are empty dicts (stored as a count),
    the data list holds one empty dict, shared: it pickles as references to
    one dict, not as thousands of dicts."""
    cdef Column col
    if not isinstance(infos, BufferCore):
        return infos.get_state()
    col = (<BufferCore>infos).flat()
    if col is None or col.kind != KIND_EMPTY_DICT or col.finalized:
        return infos.get_state()
    space = (<BufferCore>infos)._space
    return {
        "data": [{}] * col.nrows(),
        "lookback": (<BufferCore>infos)._lookback,
        "finalized": False,
        "space": space_to_dict(space) if space else None,
    }


def infos_from_state(state):
    """InfiniteLookbackBuffer.from_state(state), step by step, except that a
    list of empty dicts (the infos of an episode without any) is counted into
    the buffer instead of appended dict by dict."""
    cdef BufferCore buffer
    cdef Py_ssize_t i
    data = state["data"]
    if type(data) is not list or not all_empty_dicts(data):
        return Buffer.from_state(state)
    buffer = empty_buffer(Buffer, None, None)
    for i in range(PyList_GET_SIZE(data)):
        buffer.push_empty_dict()
    buffer.lookback = state["lookback"]
    space = state["space"]
    buffer.space = space_from_dict(space) if space else None
    if state["finalized"] and not buffer.finalized:
        buffer.finalize()
    return buffer


# -- an episode's pickled state ---------------------------------------------------------
#
# A multi-agent episode pickles as one state (see _multi.pyx), each agent's
# episode in it as a tuple of its fields with each buffer's state inline
# (buffer_state): no restore call per episode, buffer or Column, and no
# global (a class or a function) that the pickle would name, look up on
# dumping and import on loading, at about a microsecond each, where the
# usual one is implied: the facade's classes, the usual default factories.

cdef object defaultdict_type = defaultdict

# The default factories a pickled defaultdict names by their position here
# (FACTORY_OF_VALUES: the class of its values, an agent's mapping's).
cdef tuple FACTORIES = (int, float, dict)
cdef enum:
    FACTORY_PLAIN_DICT = -1
    FACTORY_OF_VALUES = 3


cdef object factory_code(object d, type value_cls):
    # How container_state names the container and its factory: -1 for an
    # exact dict, a position in FACTORIES, FACTORY_OF_VALUES, or (factory,).
    cdef Py_ssize_t i
    if type(d) is dict:
        return FACTORY_PLAIN_DICT
    factory = d.default_factory
    for i in range(len(FACTORIES)):
        if factory is FACTORIES[i]:
            return i
    if factory is not None and factory is value_cls:
        return FACTORY_OF_VALUES
    return (factory,)


cdef object empty_container(object code, type value_cls):
    # The empty dict or defaultdict factory_code() named, checked.
    if type(code) is int:
        if code == FACTORY_PLAIN_DICT:
            return {}
        if 0 <= code < len(FACTORIES):
            return defaultdict(FACTORIES[code])
        if code == FACTORY_OF_VALUES and value_cls is not None:
            return defaultdict(value_cls)
    elif type(code) is tuple and len(<tuple>code) == 1:
        return defaultdict(code[0])            # TypeError unless callable or None
    raise ValueError(f"corrupt episode state: no dict or defaultdict is named {code!r:.100}")


cdef object container_state(object d):
    """A field that is a dict or defaultdict (of any values) as (code,
    plain dict): no global for the container or the usual factories;
    anything else as (d,)."""
    if type(d) is dict:
        return (FACTORY_PLAIN_DICT, d)
    if type(d) is defaultdict_type:
        return (factory_code(d, None), dict(d))
    return (d,)


cdef object container_from_state(object state):
    """The field container_state() described, checked."""
    if type(state) is tuple and len(<tuple>state) == 1:
        return state[0]
    if type(state) is not tuple or len(<tuple>state) != 2 or type(state[1]) is not dict:
        raise ValueError(f"corrupt episode state: expected (code, dict) or (object,), got "
                         f"{state!r:.100}")
    code, items = state
    if type(code) is int and code == FACTORY_PLAIN_DICT:
        return items
    d = empty_container(code, None)
    d.update(items)
    return d


# The fields of an episode's state, in order.
cdef enum:
    ES_CLASS, ES_ID, ES_AGENT_ID, ES_MODULE_ID, ES_MA_ID, ES_TERMINATED, ES_TRUNCATED
    ES_T, ES_T_STARTED, ES_CUSTOM_DATA, ES_START_TIME, ES_LAST_STEP_TIME
    ES_LAST_OBSERVATION, ES_LAST_ROW_OBSERVED, ES_LAST_INFOS
    ES_OBSERVATION_SPACE, ES_ACTION_SPACE
    ES_OBSERVATIONS, ES_INFOS, ES_ACTIONS, ES_REWARDS, ES_EXTRAS
    ES_FIELDS


cdef object dict_state(object d, type value_cls, StateWriter writer):
    """An exact dict or defaultdict of episodes (value_cls EpisodeCore) or of
    buffers of exactly `value_cls` as (code, keys, states) (code: see
    factory_code); anything else as (d,): it pickles as itself."""
    cdef Py_ssize_t pos = 0
    cdef PyObject* key
    cdef PyObject* value
    cdef list keys = [], states = []
    if type(d) is not dict and type(d) is not defaultdict_type:
        return (d,)
    while PyDict_Next(d, &pos, &key, &value):
        keys.append(<object>key)
        if value_cls is EpisodeCore and isinstance(<object>value, EpisodeCore) \
                and (<EpisodeCore>value).observations is not None:
            states.append(episode_state(<EpisodeCore>value, writer))
        elif value_cls is not EpisodeCore and type(<object>value) is value_cls:
            states.append(buffer_state(<BufferCore>value, writer))
        else:
            return (d,)
    return (factory_code(d, value_cls), tuple(keys), tuple(states))


cdef object dict_from_state(object state, type value_cls, StateReader reader):
    """The dict that dict_state() described (value_cls: its values' class),
    checked: ValueError/TypeError for a corrupt state."""
    cdef tuple keys, states
    cdef Py_ssize_t i
    if type(state) is not tuple or len(<tuple>state) not in (1, 3):
        raise ValueError(f"corrupt episode state: expected (code, keys, values) or "
                         f"(object,), got {type(state).__name__}")
    if len(<tuple>state) == 1:
        return state[0]
    if type(state[1]) is not tuple or type(state[2]) is not tuple:
        raise ValueError("corrupt episode state: a dict's keys and values are tuples")
    keys, states = state[1], state[2]
    if len(keys) != len(states):
        raise ValueError(f"corrupt episode state: {len(keys)} keys for {len(states)} values")
    d = empty_container(state[0], value_cls if value_cls is not EpisodeCore else None)
    for i in range(len(keys)):
        d[keys[i]] = (episode_from_state(states[i], reader) if value_cls is EpisodeCore
                      else buffer_from_state(value_cls, states[i], reader))
    if len(d) != len(keys):
        raise ValueError("corrupt episode state: a key appears twice")
    return d


cdef object track_state(BufferCore buffer, StateWriter writer):
    # One of the four tracks: its state, or (buffer,) if it is not of the
    # facade's class.
    return buffer_state(buffer, writer) if type(buffer) is Buffer else (buffer,)


cdef BufferCore track_from_state(object state, StateReader reader):
    if type(state) is tuple and len(<tuple>state) == 1:
        return as_buffer(state[0])
    return buffer_from_state(Buffer, state, reader)


cdef bint is_last_row(BufferCore observations, object observation):
    """`observation` is an array holding the very bytes, dtype and shape of
    the last row of `observations`: it pickles as "the last row" (what an
    episode fed from batches keeps) instead of as an array of its own."""
    cdef Column col = observations.flat()
    cdef Py_ssize_t n
    if col is None or type(observation) is not np.ndarray or not col.plain() or col.row_type_open:
        return False
    n = col.nrows()
    if n == 0 or not col._row_matches(<cnp.ndarray>observation):
        return False
    return memcmp(col.row_ptr(n - 1, 1), array_bytes(<cnp.ndarray>observation, col.row_bytes),
                  col.row_bytes) == 0


cdef tuple episode_state(EpisodeCore episode, StateWriter writer):
    """The episode as a tuple of its fields (ES_*), buffers inline."""
    require_buffers(episode)
    observation, last_row = episode.last_observation, episode.last_row_observed
    if not last_row and is_last_row(episode.observations, observation):
        observation, last_row = None, True
    return (
        type(episode) if type(episode) is not Episode else None,
        episode.id_, episode.agent_id, episode.module_id,
        episode.multi_agent_episode_id, episode.is_terminated, episode.is_truncated,
        episode.t, episode.t_started, episode.custom_data_,
        time_or_none(episode.start_time), time_or_none(episode.last_step_time),
        observation, last_row, episode.last_infos,
        writer.space_state(episode._observation_space),
        writer.space_state(episode._action_space),
        track_state(episode.observations, writer), track_state(episode.infos, writer),
        track_state(episode.actions, writer), track_state(episode.rewards, writer),
        dict_state(own_extras(episode), Buffer, writer),
    )


cdef inline Py_ssize_t state_index(object value, str name) except? -1:
    if type(value) is not int or not -PY_SSIZE_T_MAX <= value <= PY_SSIZE_T_MAX:
        raise ValueError(f"corrupt episode state: {name} must be an int that fits an "
                         f"index, got {value!r:.100}")
    return value


cdef double state_time(object value, str name) except? -1:
    """A pickled step time: a float, or None (NaN)."""
    if value is not None and type(value) is not float:
        raise ValueError(f"corrupt episode state: {name} must be a float or None, "
                         f"got {value!r:.100}")
    return time_from(value)


cdef EpisodeCore episode_from_state(object state, StateReader reader):
    """The episode episode_state() described, checked field by field, then
    whole (validate()): ValueError/TypeError if corrupt."""
    cdef EpisodeCore episode
    cdef tuple s
    cdef Py_ssize_t t, t_started
    cdef double start_time, last_step_time
    if type(state) is not tuple or len(<tuple>state) != ES_FIELDS:
        raise ValueError(f"corrupt episode state: expected a tuple of {ES_FIELDS} fields, "
                         f"got {type(state).__name__}")
    s = <tuple>state
    cls = Episode if s[ES_CLASS] is None else s[ES_CLASS]
    if not (isinstance(cls, type) and issubclass(cls, EpisodeCore)):
        raise TypeError(f"cannot restore an episode as {cls!r:.100}")
    if type(s[ES_LAST_ROW_OBSERVED]) is not bool:
        raise ValueError("corrupt episode state: the last-row flag must be a bool")
    t = state_index(s[ES_T], "t")
    t_started = state_index(s[ES_T_STARTED], "t_started")
    start_time = state_time(s[ES_START_TIME], "_start_time")
    last_step_time = state_time(s[ES_LAST_STEP_TIME], "_last_step_time")
    observations = track_from_state(s[ES_OBSERVATIONS], reader)
    infos = track_from_state(s[ES_INFOS], reader)
    actions = track_from_state(s[ES_ACTIONS], reader)
    rewards = track_from_state(s[ES_REWARDS], reader)
    extras = dict_from_state(s[ES_EXTRAS], Buffer, reader)
    observation_space = reader.space_from_state(s[ES_OBSERVATION_SPACE])
    action_space = reader.space_from_state(s[ES_ACTION_SPACE])
    episode = EpisodeCore.__new__(cls)
    episode.id_ = s[ES_ID]
    episode.agent_id = s[ES_AGENT_ID]
    episode.module_id = s[ES_MODULE_ID]
    episode.multi_agent_episode_id = s[ES_MA_ID]
    episode.is_terminated = s[ES_TERMINATED]
    episode.is_truncated = s[ES_TRUNCATED]
    episode.t = t
    episode.t_started = t_started
    episode.custom_data_ = s[ES_CUSTOM_DATA]
    episode.start_time = start_time
    episode.last_step_time = last_step_time
    episode.last_observation = s[ES_LAST_OBSERVATION]
    episode.last_row_observed = s[ES_LAST_ROW_OBSERVED]
    episode.last_infos = s[ES_LAST_INFOS]
    episode._observation_space = observation_space
    episode._action_space = action_space
    episode.observations = observations
    episode.infos = infos
    episode.actions = actions
    episode.rewards = rewards
    episode._extras = extras
    try:
        episode.validate()
    except AssertionError as error:
        raise ValueError(f"corrupt episode state: {error}") from error
    return episode
