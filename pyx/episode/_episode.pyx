"""EpisodeCore: the compiled half of SingleAgentEpisode.

It holds the episode's fields and the per-step methods (add_env_step, the
getters, len, validate) so that a sampler's calls go straight to C and from
there to the buffers' C methods. The facade (episode/single_agent_episode.py)
subclasses it and adds the rest of RLlib's API.
"""
import copy

import gymnasium as gym
import numpy as np

from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject
from cpython.pyport cimport PY_SSIZE_T_MAX
from libc.math cimport NAN, isnan
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cimport numpy as cnp

from episode._buffer cimport BufferCore
from episode._column cimport Column, array_bytes

# The Columns' inline push (inlined here) calls numpy's C-API.
cnp.import_array()


# RLlib gives every rewards buffer this space (it shapes `fill` values).
REWARDS_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)


cdef inline double now():
    # time.perf_counter()'s clock on Linux, without a Python call.
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef object Box = gym.spaces.Box
cdef object Discrete = gym.spaces.Discrete


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


cdef int not_a_buffer(object obj) except -1:
    # Out of line, so that as_buffer stays small enough to inline.
    raise TypeError(f"expected an InfiniteLookbackBuffer, got {type(obj).__name__}")


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


cdef class EpisodeCore:

    def __cinit__(self, *args, **kwargs):
        self.is_terminated = False
        self.is_truncated = False
        self.t = 0
        self.t_started = 0
        self.start_time = NAN
        self.last_step_time = NAN

    # Times are kept as C doubles (perf_counter's clock); None reads as unset.
    @property
    def _start_time(self):
        return None if isnan(self.start_time) else self.start_time

    @_start_time.setter
    def _start_time(self, value):
        self.start_time = NAN if value is None else value

    @property
    def _last_step_time(self):
        return None if isnan(self.last_step_time) else self.last_step_time

    @_last_step_time.setter
    def _last_step_time(self, value):
        self.last_step_time = NAN if value is None else value

    @property
    def _last_added_infos(self):
        # Empty infos are not kept as objects (see add_env_step).
        return {} if self.last_infos is None else self.last_infos

    @_last_added_infos.setter
    def _last_added_infos(self, value):
        self.last_infos = value if value else None

    # -- the step ---------------------------------------------------------------

    def add_env_step(self, observation, action, reward, infos=None, *,
                     terminated=False, truncated=False, extra_model_outputs=None):
        """Adds one environment step: the observation after `action`, the
        reward, infos, the done flags and the model's extra outputs."""
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
        if self.rewards._col is None or self.rewards._col.finalized:
            # Numpy'ized: check everything before appending anything.
            self._check_step(observation, action, reward, extra_model_outputs)
        if extra_model_outputs is not None and type(extra_model_outputs) is not dict:
            # Another mapping: its items, read before anything is appended
            # (AttributeError, as RLlib's, for something without items()).
            extra_items = list(extra_model_outputs.items())
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
            outputs = self.extra_model_outputs
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
        self.is_terminated = terminated
        self.is_truncated = truncated
        self._last_added_observation = observation
        self.last_step_time = now()
        if isnan(self.start_time):
            self.start_time = self.last_step_time

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
        col = self.observations._col
        if col is None or col.finalized and not col.row_fits(observation):
            self.observations.check_append(observation)
        col = self.actions._col
        if col is None or col.finalized and not col.row_fits(action):
            self.actions.check_append(action)
        col = self.rewards._col
        if col is None or col.finalized and not col.row_fits(reward):
            self.rewards.check_append(reward)
        if extra_model_outputs is not None:
            outputs = self.extra_model_outputs
            if type(extra_model_outputs) is dict and type(outputs) is dict:
                # PyDict_Next and C lookups: no Python-level calls per key.
                while PyDict_Next(extra_model_outputs, &pos, &key_ptr, &value_ptr):
                    found = PyDict_GetItemWithError(outputs, <object>key_ptr)
                    if found is NULL:
                        continue
                    if isinstance(<object>found, BufferCore):
                        col = (<BufferCore>found)._col
                        if col is not None and (not col.finalized
                                                or col.row_fits(<object>value_ptr)):
                            continue
                    (<object>found).check_append(<object>value_ptr)
            else:
                for key, value in extra_model_outputs.items():
                    buf = outputs.get(key)
                    if buf is not None:
                        buf.check_append(value)
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
        cdef Py_ssize_t n_obs = len(self.observations)
        cdef Py_ssize_t n_infos = len(self.infos)
        cdef Py_ssize_t n_actions = len(self.actions)
        cdef Py_ssize_t n_rewards = len(self.rewards)
        if n_obs != n_infos:
            inconsistent(f"one info per observation, got {n_obs} observations and "
                         f"{n_infos} infos")
        if n_obs == 0:
            if n_rewards != 0 or n_actions != 0:
                inconsistent(f"no actions or rewards without observations, got "
                             f"{n_actions} actions and {n_rewards} rewards")
            for key, buf in self.extra_model_outputs.items():
                if len(buf) != 0:
                    inconsistent(f"no extra model outputs without observations, got "
                                 f"{len(buf)} of {key!r}")
        else:
            if n_rewards + 1 != n_obs or n_actions + 1 != n_obs:
                inconsistent(f"one action and one reward per observation after the "
                             f"first, got {n_obs} observations, {n_actions} actions and "
                             f"{n_rewards} rewards")
            for key, buf in self.extra_model_outputs.items():
                if len(buf) != n_obs - 1:
                    inconsistent(f"one extra model output per action, got {len(buf)} "
                                 f"of {key!r} for {n_obs - 1} actions")

    def __len__(self):
        """Number of env steps in this episode chunk (lookback excluded)."""
        return steps(self)

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
        episode = assemble(
            type(self), self.id_,
            self.observations.sub_buffer(obs_slice, False, n, self._observation_space),
            self.infos.sub_buffer(obs_slice, False, n, None),
            self.actions.sub_buffer(rest, False, n, self._action_space),
            rewards,
            {k: as_buffer(v).sub_buffer(rest, False, n, None)
             for k, v in self.extra_model_outputs.items()},
            False, False, self.t,
        )
        if episode is None:
            episode = self._construct(
                id_=self.id_, observations=self.get_observations(obs_slice),
                observation_space=self._observation_space, infos=self.get_infos(obs_slice),
                actions=self.get_actions(rest), action_space=self._action_space,
                rewards=self.get_rewards(rest),
                extra_model_outputs={k: self.get_extra_model_outputs(k, rest)
                                     for k in self.extra_model_outputs},
                t_started=self.t, len_lookback_buffer="auto")
        else:
            episode._observation_space = self._observation_space
            episode._action_space = self._action_space
        episode._custom_data = copy.deepcopy(self._custom_data) if self._custom_data else {}
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
        args = (
            self.id_,
            _piece(self.observations, start, stop, step, 1, len_lookback_buffer, obs_space),
            _piece(self.infos, start, stop, step, 1, len_lookback_buffer, None),
            _piece(self.actions, start, stop, step, 0, len_lookback_buffer, action_space),
            _piece(self.rewards, start, stop, step, 0, len_lookback_buffer, None),
            {k: _piece(v, start, stop, step, 0, len_lookback_buffer, None)
             for k, v in self.extra_model_outputs.items()},
            self.is_terminated if keep_done else False,
            self.is_truncated if keep_done else False,
            self.t_started + start,
        )
        episode = assemble(type(self), *args)
        if episode is None:
            id_, obs, infos, actions, rewards, extras, term, trunc, t_started = args
            return self._construct(
                id_=id_, observations=obs, observation_space=obs_space, infos=infos,
                actions=actions, action_space=action_space, rewards=rewards,
                extra_model_outputs=extras, terminated=term, truncated=trunc,
                t_started=t_started)
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
        return as_buffer(self.extra_model_outputs[key]).cget(indices, neg_index_as_lookback, fill, False, False, None)


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
    would build it, without its Python-level work. Returns None where the
    constructor does more (empty infos are replaced there)."""
    cdef EpisodeCore episode
    if len(infos) == 0:
        return None
    episode = EpisodeCore.__new__(cls)
    episode.id_ = id_
    episode.observations = observations
    episode.infos = infos
    episode.actions = actions
    episode.rewards = rewards
    episode.extra_model_outputs = extra_model_outputs
    episode.is_terminated = terminated
    episode.is_truncated = truncated
    t_started = t_started or 0
    episode.t_started = t_started
    episode.t = len(rewards) + t_started      # Python ints: OverflowError, not a wrap
    episode._custom_data = {}
    episode.validate()
    return episode
