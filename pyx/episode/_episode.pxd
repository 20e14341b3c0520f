from cpython.dict cimport PyDict_Size

from libc.math cimport NAN, isnan
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

from episode._buffer cimport BufferCore, StateReader, StateWriter


cdef inline double now() noexcept:
    # time.perf_counter()'s clock on Linux, without a Python call.
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# Step times are C doubles; NaN stands for RLlib's None (not started, no step).
cdef inline object time_or_none(double t):
    return None if t != t else t


cdef inline double time_from(object value) except? -1:
    return NAN if value is None else value


cdef class EpisodeCore:
    cdef public object id_
    cdef public object agent_id
    cdef public object module_id
    cdef public object multi_agent_episode_id
    cdef public BufferCore observations
    cdef public BufferCore actions
    cdef public BufferCore rewards
    cdef public BufferCore infos
    cdef object _extras             # extra_model_outputs: key -> buffer (a dict; a
                                    # defaultdict after from_state); see own_extras
    cdef public object is_terminated
    cdef public object is_truncated
    cdef public Py_ssize_t t
    cdef public Py_ssize_t t_started
    cdef public object _observation_space
    cdef public object _action_space
    cdef object custom_data_        # None until first used (see _custom_data)
    cdef double start_time          # NaN: not started (RLlib's None)
    cdef double last_step_time      # NaN: no step yet
    cdef object last_observation    # the last observation added (see last_row_observed)
    cdef bint last_row_observed     # it is the observations' last row (a batch row,
                                    # read back on demand instead of kept as a view)
    cdef object last_infos          # None: the last infos were empty

    cpdef validate(self)

    cdef inline void end_step(self, object observation, object terminated, object truncated,
                              double t):
        # What closes every appended step (add_env_step's and a batch's):
        # the done flags, the observation kept as the last one (None: the
        # last row, a batch's), the times.
        self.is_terminated = terminated
        self.is_truncated = truncated
        self.last_observation = observation
        self.last_row_observed = observation is None
        self.last_step_time = t
        if isnan(self.start_time):
            self.start_time = t

    cdef int append_step(self, object observation, object action, object reward,
                         object infos, object terminated, object truncated,
                         object extra_model_outputs) except -1
    cdef int store_reset(self, object observation, object infos) except -1
    cdef int _check_step(self, object observation, object action, object reward,
                         object extra_model_outputs) except -1


# A new episode id (as uuid.uuid4().hex).
cdef str new_id()
cdef type buffer_class()


# len() of an episode (t - t_started), checked.
cdef Py_ssize_t steps(EpisodeCore episode) except -1


# cls(observation_space=..., action_space=...) after add_env_reset(observation,
# infos), without the Python-level work (cls: an EpisodeCore subclass).
cdef EpisodeCore start_episode(type cls, object observation_space, object action_space,
                               object observation, object infos)

# cls(observation_space=..., action_space=...), the same way.
cdef EpisodeCore empty_episode(type cls, object observation_space, object action_space)


# make_episode() with its class (an EpisodeCore subclass) and lookbacks
# checked by the caller: an episode over ready storage, checked.
cdef EpisodeCore build_episode(type cls, object id_, object observations, object infos,
                               object actions, object rewards, dict extra_model_outputs,
                               Py_ssize_t lb_obs, Py_ssize_t lb_infos, Py_ssize_t lb_actions,
                               Py_ssize_t lb_rewards, Py_ssize_t lb_extras, object terminated,
                               object truncated, Py_ssize_t t_started,
                               object observation_space, object action_space,
                               object agent_id, object module_id,
                               object multi_agent_episode_id, double start_time,
                               double last_step_time, object custom_data,
                               bint defaultdict_extras, object last_added)


# What a dataset keeps of the episode's last added observation and infos:
# None, True (its last rows) or the pair.
cpdef object last_added(EpisodeCore episode)


# episode.extra_model_outputs, with any of RLlib's own buffers that RLlib code
# put in it (its replay buffers do) replaced by ours.
cdef object own_extras(EpisodeCore episode)


# Why one more step with the extra model outputs `outputs` (a dict, or None)
# would break validate()'s rule of one output per action under every key, or
# None if it would not: a step gives the keys of the chunk's earlier steps,
# new keys only in its first one. Inline, the usual step without outputs.
cdef str outputs_misfit(EpisodeCore episode, object outputs)

cdef inline str extras_misfit(EpisodeCore episode, object outputs):
    if outputs is None and type(episode._extras) is dict and PyDict_Size(episode._extras) == 0:
        return None
    return outputs_misfit(episode, outputs)


# An episode as a tuple of its fields (buffers inline, see _episode.pyx), and
# the episode such a tuple describes, checked: ValueError/TypeError if corrupt.
cdef tuple episode_state(EpisodeCore episode, StateWriter writer)
cdef EpisodeCore episode_from_state(object state, StateReader reader)

# An exact dict/defaultdict of episodes (value_cls EpisodeCore) or of buffers
# of exactly `value_cls` as a state of theirs (anything else pickles as
# itself), and back, checked.
cdef object dict_state(object d, type value_cls, StateWriter writer)
cdef object dict_from_state(object state, type value_cls, StateReader reader)

# A dict or defaultdict field (any values) as a state that names no global
# for the usual containers, and back, checked.
cdef object container_state(object d)
cdef object container_from_state(object state)

# A pickled step time (a float, or None: NaN), checked.
cdef double state_time(object value, str name) except? -1
