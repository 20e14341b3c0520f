"""MultiAgentCore: the compiled half of MultiAgentEpisode.

It holds the episode's fields, the env_t -> agent_t mapping of each agent as a
typed int64 buffer (AgentStepsCore) and the per-step paths a sampler calls:
the usual add_env_step (every stepping agent known, none done) and the
latest-observation read. Everything else, and every step these paths decline
before changing anything, is the facade's (episode/multi_agent_episode.py).
"""
import copy
from collections import defaultdict

from cpython.dict cimport (PyDict_DelItem, PyDict_GetItemWithError, PyDict_Next,
                           PyDict_SetItem, PyDict_Size)
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF, Py_XINCREF
from libc.math cimport NAN, isnan
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t

cimport numpy as cnp

from episode._buffer cimport BufferCore, StateReader, StateWriter
from episode._column cimport Column, KIND_EMPTY, KIND_INT
from episode._episode cimport (EpisodeCore, container_from_state, container_state,
                               dict_from_state, dict_state, extras_misfit, now, own_extras,
                               state_time, time_from, time_or_none)
from episode._index cimport (INDEX_LIMIT, SliceSpec, clamped_index, int_position,
                             interpret_slice, slice_positions)

cnp.import_array()

# RLlib's tag for "the agent did not step at this env step".
SKIP_ENV_TS_TAG = "S"
cdef object SKIP_TAG = SKIP_ENV_TS_TAG
# How the mapping stores that tag: no agent step can be this int.
SKIP_STEP = INT64_MIN
cdef object SKIP_OBJ = SKIP_STEP

cdef enum:
    # Agents that one fast step handles at most (its per-agent plan is on the stack).
    MAX_FAST_AGENTS = 64

cdef dict EMPTY = {}    # read only: stands in for a missing dict argument
cdef object MISSING = object()   # an agent without a value at an env step
cdef object DECLINE = object()   # a compiled read leaves the call to the general path


cdef class AgentStepsCore(BufferCore):
    # One agent's env_t -> agent_t mapping: an int64 Column in list mode,
    # SKIP_STEP where the agent did not step; reads show RLlib's "S" there.

    cdef object item_at(self, Py_ssize_t pos):
        cdef int64_t value
        if self.typed():
            value = (<int64_t*>self.flat().data)[pos]
            return SKIP_TAG if value == INT64_MIN else PyLong_FromLongLong(value)
        item = BufferCore.item_at(self, pos)
        if type(item) is int and item == SKIP_OBJ:
            return SKIP_TAG
        return item

    cdef inline bint typed(self) noexcept:
        # The C paths read and append raw int64 steps only in this state.
        cdef Column col = self.flat()
        return col is not None and not col.finalized and (
            col.kind == KIND_INT or col.kind == KIND_EMPTY)

    cdef inline int push_step(self, int64_t step) except -1:
        # A raw append; typed() is true.
        cdef Column col = self.flat()
        if col.kind != KIND_INT:
            return col.push(PyLong_FromLongLong(step))      # the first one types the Column
        if col.size == col.capacity:
            col._reserve(1)
        (<int64_t*>col.row_ptr(col.size, 1))[0] = step
        col.size += 1
        return 0

    def _push_step(self, step):
        """Appends one agent step, or SKIP_ENV_TS_TAG."""
        self.push(SKIP_OBJ if type(step) is str and step == SKIP_TAG else step)


cdef inline bint absent(PyObject* value) noexcept:
    return value is NULL or <object>value is None


cdef inline object get_or(object d, object key, object default):
    # d.get(key, default) for a dict (subclass), without a method call.
    cdef PyObject* value = PyDict_GetItemWithError(d, key)
    return default if value is NULL else <object>value


cdef inline object pop_or(object d, object key, object default):
    # d.pop(key, default) for a dict (subclass), without a method call.
    cdef PyObject* value = PyDict_GetItemWithError(d, key)
    if value is NULL:
        return default
    result = <object>value
    PyDict_DelItem(d, key)
    return result


# What one agent does in a fast step.
cdef enum Move:
    MOVE_NONE = 0      # not in this step's dicts
    MOVE_STEP = 1      # observation and action: one agent step
    MOVE_JOIN = 2      # observation: its hanging action completes an agent step
    MOVE_HANG = 3      # action without observation: it hangs until the next one
    MOVE_REWARD = 4    # only a reward (or falsy done flags): added to the hanging reward


# What an env-step read reads.
cdef enum Read:
    READ_OBSERVATIONS
    READ_INFOS
    READ_ACTIONS
    READ_REWARDS
    READ_EXTRA_MODEL_OUTPUTS


cdef tuple READ_NAMES = ("observations", "infos", "actions", "rewards", "extra_model_outputs")


cdef struct Plan:
    # One agent's part of a fast step; the pointers are strong references.
    PyObject* aid
    PyObject* episode
    PyObject* steps           # its AgentSteps
    PyObject* obs             # NULL: not in the step's observations
    PyObject* act             # NULL: not in the step's actions
    int64_t t_started         # agent_t_started[aid]
    bint new_t_started        # ... which the step adds (0), as the general step does
    unsigned char move        # a Move


# Agent steps and agent_t_started values beyond this send a call to the
# general path: the C paths add two of them and a length in int64.
cdef long long T_STARTED_LIMIT = 1LL << 62


cdef inline bint small_int(object value, long long* out) noexcept:
    # An exact int within +-T_STARTED_LIMIT: sums of two of them and a
    # lookback stay inside int64. False for anything else.
    cdef int overflow = 0
    if type(value) is not int:
        return False
    out[0] = PyLong_AsLongLongAndOverflow(value, &overflow)
    return not overflow and -T_STARTED_LIMIT <= out[0] <= T_STARTED_LIMIT


cdef class MultiAgentCore:
    cdef public object id_
    cdef public object agent_to_module_mapping_fn
    cdef public object _agent_to_module_mapping
    cdef public object observation_space
    cdef public object action_space
    cdef public object env_t_started
    cdef public object env_t
    cdef public object agent_t_started       # AgentID -> its t_started (defaultdict(int))
    cdef public object env_t_to_agent_t      # AgentID -> AgentSteps
    cdef public object _hanging_actions_end
    cdef public object _hanging_extra_model_outputs_end
    cdef public object _hanging_rewards_end
    cdef public object _hanging_rewards_begin
    cdef public object is_terminated
    cdef public object is_truncated
    cdef public object agent_episodes        # AgentID -> SingleAgentEpisode
    cdef public object _len_lookback_buffers
    cdef public object _custom_data
    cdef double start_time                   # NaN: RLlib's None
    cdef double last_step_time

    def __cinit__(self):
        self.start_time = NAN
        self.last_step_time = NAN

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

    def _stepped(self):
        """Marks the time of a step (the first one starts the clock)."""
        self.mark_step()

    def __reduce_ex__(self, protocol):
        # One state: the fields, then each agent's episode and mapping with
        # their buffers inline and the rows of every Column as a
        # PickleBuffer (protocol 5: out of band where the pickler takes
        # them), restored by one call (_restore_multi_agent). The facade's
        # classes and default mapping function are implied (None).
        cdef StateWriter writer = StateWriter(protocol >= 5)
        fn = self.agent_to_module_mapping_fn
        state = (
            self.id_,
            None if fn is default_mapping_fn else (fn,),
            self._agent_to_module_mapping, self.observation_space, self.action_space,
            self.env_t_started, self.env_t, container_state(self.agent_t_started),
            self._hanging_actions_end, container_state(self._hanging_extra_model_outputs_end),
            container_state(self._hanging_rewards_end),
            container_state(self._hanging_rewards_begin), self.is_terminated,
            self.is_truncated, self._len_lookback_buffers, self._custom_data,
            time_or_none(self.start_time), time_or_none(self.last_step_time),
            dict_state(self.agent_episodes, EpisodeCore, writer),
            dict_state(self.env_t_to_agent_t, AgentSteps, writer),
        )
        return (_restore_multi_agent,
                (MA_FORMAT, None if type(self) is MultiAgentEpisode else type(self), state))

    cdef inline void mark_step(self):
        self.last_step_time = now()
        if isnan(self.start_time):
            self.start_time = self.last_step_time

    def add_env_step(self, observations, actions, rewards, infos=None, *, terminateds=None,
                     truncateds=None, extra_model_outputs=None):
        """Adds one env step: the agents' next observations and the actions,
        rewards, infos, done flags and extra model outputs that came with it.
        Agents that act without an observation keep their action (and reward,
        outputs) hanging until their next observation."""
        if not self._fast_step(observations, actions, rewards, infos or EMPTY,
                               terminateds or EMPTY, truncateds or EMPTY,
                               extra_model_outputs or EMPTY):
            self._add_env_step_general(
                observations, actions, rewards, infos, terminateds=terminateds,
                truncateds=truncateds, extra_model_outputs=extra_model_outputs)

    cdef bint _fast_step(self, object observations, object actions, object rewards,
                         object infos, object terminateds, object truncateds,
                         object outputs) except -1:
        """The step of agents that all have an episode, are not done and get
        no done flag, with nothing the step would refuse: False, with nothing
        changed, for any other step."""
        cdef Plan plans[MAX_FAST_AGENTS]
        cdef Py_ssize_t n = 0, k
        try:
            if not self._plan_step(plans, &n, observations, actions, rewards, infos,
                                   terminateds, truncateds, outputs):
                return False
            self._apply_step(plans, n, observations, actions, rewards, infos, terminateds,
                             truncateds, outputs)
            return True
        finally:
            for k in range(n):
                Py_XDECREF(plans[k].aid)
                Py_XDECREF(plans[k].episode)
                Py_XDECREF(plans[k].steps)
                Py_XDECREF(plans[k].obs)
                Py_XDECREF(plans[k].act)

    cdef bint _plan_step(self, Plan* plans, Py_ssize_t* n, object observations,
                         object actions, object rewards, object infos, object terminateds,
                         object truncateds, object outputs) except -1:
        """Each agent's move, with strong references to what it needs (user
        code that runs in between, such as a flag's __bool__, cannot take
        them away). False to decline the step; `n` plans are filled either way."""
        cdef Py_ssize_t pos = 0, n_live = 0
        cdef Py_ssize_t n_obs = 0, n_act = 0, n_rew = 0, n_term = 0, n_trunc = 0
        cdef PyObject* key
        cdef PyObject* value
        cdef PyObject* obs
        cdef PyObject* act
        cdef PyObject* found
        cdef bint in_rewards, in_term, in_trunc, flagged
        cdef long long agent_t_started
        cdef EpisodeCore ep
        cdef Plan* plan
        episodes, mapping = self.agent_episodes, self.env_t_to_agent_t
        hanging_actions = self._hanging_actions_end
        t_started = self.agent_t_started
        if self.is_terminated or self.is_truncated:
            return False
        if not (type(observations) is dict and type(actions) is dict and type(rewards) is dict
                and type(infos) is dict and type(terminateds) is dict
                and type(truncateds) is dict and type(outputs) is dict
                and type(episodes) is dict and isinstance(mapping, dict)
                and isinstance(hanging_actions, dict)
                and isinstance(self._hanging_rewards_end, dict)
                and isinstance(self._hanging_extra_model_outputs_end, dict)
                and isinstance(t_started, dict)):
            return False
        if PyDict_Size(episodes) > MAX_FAST_AGENTS or PyDict_Size(mapping) != PyDict_Size(episodes):
            return False
        for flags in (terminateds, truncateds):
            found = PyDict_GetItemWithError(flags, "__all__")
            if found is not NULL and <object>found:
                return False
        # Snapshot the agents first: nothing below iterates a dict that user
        # code could change.
        while PyDict_Next(episodes, &pos, &key, &value):
            if not ((type(<object>key) is str or type(<object>key) is int)
                    and isinstance(<object>value, EpisodeCore)):
                return False       # (ids whose hash or == could run user code)
            plan = &plans[n[0]]
            plan.aid = key
            plan.episode = value
            plan.steps = plan.obs = plan.act = NULL
            Py_INCREF(<object>key)
            Py_INCREF(<object>value)
            n[0] += 1
        for k in range(n[0]):
            plan = &plans[k]
            aid = <object>plan.aid
            ep = <EpisodeCore>plan.episode
            # Flags first: their truth may run user code, before any borrowing.
            found = PyDict_GetItemWithError(terminateds, aid)
            in_term = found is not NULL
            flagged = in_term and <object>found
            found = PyDict_GetItemWithError(truncateds, aid)
            in_trunc = found is not NULL
            flagged = flagged or (in_trunc and <object>found)
            done = ep.is_terminated or ep.is_truncated
            if not done:
                n_live += 1
            found = PyDict_GetItemWithError(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not (<AgentStepsCore>found).typed():
                return False
            plan.steps = found
            Py_INCREF(<object>found)
            obs = PyDict_GetItemWithError(observations, aid)
            act = PyDict_GetItemWithError(actions, aid)
            in_rewards = PyDict_GetItemWithError(rewards, aid) is not NULL
            n_obs += obs is not NULL
            n_act += act is not NULL
            n_rew += in_rewards
            n_term += in_term
            n_trunc += in_trunc
            plan.obs, plan.act = obs, act
            Py_XINCREF(obs)
            Py_XINCREF(act)
            if obs is NULL and act is NULL and not in_rewards and not in_term and not in_trunc:
                plan.move = MOVE_NONE
                continue
            if done or flagged:
                return False
            if (obs is not NULL and <object>obs is None) or ep.rewards.is_finalized():
                return False
            found = PyDict_GetItemWithError(t_started, aid)
            plan.new_t_started = found is NULL
            if found is NULL:
                # The general step reads agent_t_started[aid], so its
                # defaultdict(int) gains 0 there: the same below.
                if not (type(t_started) is defaultdict
                        and (<object>t_started).default_factory is int):
                    return False
                plan.t_started = 0
            else:
                if not small_int(<object>found, &agent_t_started):
                    return False
                plan.t_started = agent_t_started
            if not absent(obs) and not absent(act):
                if not in_rewards or extras_misfit(ep, get_or(outputs, aid, None)) is not None:
                    return False
                plan.move = MOVE_STEP
            elif not absent(obs):
                if PyDict_GetItemWithError(hanging_actions, aid) is NULL or extras_misfit(
                        ep, get_or(self._hanging_extra_model_outputs_end, aid, None)) is not None:
                    return False
                plan.move = MOVE_JOIN
            elif not absent(act):
                if PyDict_GetItemWithError(hanging_actions, aid) is not NULL:
                    return False
                plan.move = MOVE_HANG
            else:
                plan.move = MOVE_REWARD
        # A key of no known agent (a new agent, "__all__" among the agents' data).
        return (n_obs == PyDict_Size(observations) and n_act == PyDict_Size(actions)
                and n_rew == PyDict_Size(rewards)
                and n_term == PyDict_Size(terminateds) - (PyDict_GetItemWithError(terminateds, "__all__") is not NULL)
                and n_trunc == PyDict_Size(truncateds) - (PyDict_GetItemWithError(truncateds, "__all__") is not NULL)
                and n_live > 0)

    cdef int _apply_step(self, Plan* plans, Py_ssize_t n, object observations, object actions,
                         object rewards, object infos, object terminateds, object truncateds,
                         object outputs) except -1:
        """The planned moves: nothing here refuses the step (but MemoryError)."""
        cdef Py_ssize_t k
        cdef EpisodeCore ep
        cdef Plan* plan
        hanging_actions = self._hanging_actions_end
        hanging_rewards = self._hanging_rewards_end
        hanging_outputs = self._hanging_extra_model_outputs_end
        self.env_t = self.env_t + 1
        self.is_terminated = get_or(terminateds, "__all__", False)
        self.is_truncated = get_or(truncateds, "__all__", False)
        for k in range(n):
            plan = &plans[k]
            if plan.obs is NULL:
                (<AgentStepsCore>plan.steps).push_step(INT64_MIN)
            if plan.move == MOVE_NONE:
                continue
            aid = <object>plan.aid
            reward = get_or(rewards, aid, None) or 0.0
            if plan.move == MOVE_HANG:
                PyDict_SetItem(hanging_actions, aid, <object>plan.act)
                PyDict_SetItem(hanging_rewards, aid, reward)
                PyDict_SetItem(hanging_outputs, aid, get_or(outputs, aid, None))
                continue
            if plan.move == MOVE_REWARD:
                PyDict_SetItem(hanging_rewards, aid, get_or(hanging_rewards, aid, 0.0) + reward)
                continue
            ep = <EpisodeCore>plan.episode
            if plan.move == MOVE_STEP:
                ep.append_step(<object>plan.obs, <object>plan.act, reward,
                               get_or(infos, aid, None), False, False,
                               get_or(outputs, aid, None))
            else:
                action = pop_or(hanging_actions, aid, None)
                agent_outputs = pop_or(hanging_outputs, aid, None)
                reward = pop_or(hanging_rewards, aid, 0.0) + reward
                ep.append_step(<object>plan.obs, action, reward, get_or(infos, aid, None),
                               False, False, agent_outputs)
            # The agent's step, as RLlib counts it: len(episode) + agent_t_started.
            if plan.new_t_started:
                PyDict_SetItem(self.agent_t_started, aid, 0)
            (<AgentStepsCore>plan.steps).push_step(plan.t_started + (ep.t - ep.t_started))
        self.mark_step()
        return 0

    def _cut_at_last_observations(self):
        """cut() without lookback when no action hangs and every agent observed
        at the last env step, none done or numpy'ized (a sampler's chunk
        boundary): each agent's successor is its own single-agent cut. None,
        having changed nothing, for anything else."""
        cdef PyObject* key
        cdef PyObject* value
        cdef PyObject* found
        cdef Py_ssize_t pos = 0
        cdef EpisodeCore episode
        cdef AgentStepsCore steps
        cdef MultiAgentCore successor
        episodes, mapping = self.agent_episodes, self.env_t_to_agent_t
        if not (type(episodes) is dict and isinstance(mapping, dict)) or self._hanging_actions_end:
            return None
        while PyDict_Next(episodes, &pos, &key, &value):
            found = PyDict_GetItemWithError(mapping, <object>key)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            steps = <AgentStepsCore>found
            episode = <EpisodeCore>value
            if (not steps.typed() or steps.flat().size == 0
                    or (<int64_t*>steps.flat().data)[steps.flat().size - 1] == INT64_MIN
                    or episode.is_terminated or episode.is_truncated
                    or episode.observations is None or episode.observations.is_finalized()):
                return None
        agent_ids = set(episodes)     # RLlib builds these dicts in this set's order
        successor = type(self).__new__(type(self))
        successor.id_ = self.id_
        successor.agent_to_module_mapping_fn = self.agent_to_module_mapping_fn
        successor._agent_to_module_mapping = {
            aid: (<EpisodeCore>episodes[aid]).module_id for aid in agent_ids}
        successor.observation_space = self.observation_space or {}
        successor.action_space = self.action_space or {}
        successor.env_t_started = successor.env_t = self.env_t
        successor._len_lookback_buffers = 0
        successor.agent_t_started = defaultdict(
            int, {aid: (<EpisodeCore>episodes[aid]).t for aid in agent_ids})
        successor._hanging_actions_end = {}
        successor._hanging_extra_model_outputs_end = defaultdict(dict)
        successor._hanging_rewards_end = defaultdict(float)
        successor._hanging_rewards_begin = self._hanging_rewards_end.copy()
        successor.is_terminated = self.is_terminated
        successor.is_truncated = self.is_truncated
        pieces = {}
        new_mapping = defaultdict(AgentSteps)
        pos = 0
        while PyDict_Next(episodes, &pos, &key, &value):
            aid = <object>key      # held: user code (a __deepcopy__) may run in between
            episode = <EpisodeCore>value
            piece = episode.cut()
            # The single-agent cut drops the ids and keeps the output keys
            # (empty); a multi-agent chunk's agent has its ids and no keys yet.
            (<EpisodeCore>piece).agent_id = aid
            (<EpisodeCore>piece).module_id = episode.module_id
            (<EpisodeCore>piece).multi_agent_episode_id = self.id_
            (<EpisodeCore>piece)._extras = {}
            (<EpisodeCore>piece).custom_data_ = None
            pieces[aid] = piece
            steps = AgentSteps.__new__(AgentSteps)
            steps.push_step(episode.t)
            new_mapping[aid] = steps
        successor.agent_episodes = pieces
        successor.env_t_to_agent_t = new_mapping
        successor._custom_data = copy.deepcopy(self._custom_data) if self._custom_data else {}
        return successor

    # -- the getters: the compiled env-step read, else the facade's _get ---------

    def get_observations(self, indices=None, agent_ids=None, *, env_steps=True,
                         neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                         return_list=False):
        """Observations at `indices` (env steps by default, else each agent's
        own steps), per agent, or one dict per env step with `return_list`."""
        return self.read(READ_OBSERVATIONS, indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, one_hot_discrete, return_list, None)

    def get_infos(self, indices=None, agent_ids=None, *, env_steps=True,
                  neg_index_as_lookback=False, fill=None, return_list=False):
        """Infos at `indices` (see get_observations)."""
        return self.read(READ_INFOS, indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, False, return_list, None)

    def get_actions(self, indices=None, agent_ids=None, *, env_steps=True,
                    neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                    return_list=False):
        """Actions at `indices` (see get_observations); an action taken
        after an agent's last observation (hanging) counts as its last step."""
        return self.read(READ_ACTIONS, indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, one_hot_discrete, return_list, None)

    def get_rewards(self, indices=None, agent_ids=None, *, env_steps=True,
                    neg_index_as_lookback=False, fill=None, return_list=False):
        """Rewards at `indices` (see get_actions)."""
        return self.read(READ_REWARDS, indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, False, return_list, None)

    def get_extra_model_outputs(self, key=None, indices=None, agent_ids=None, *,
                                env_steps=True, neg_index_as_lookback=False, fill=None,
                                return_list=False):
        """Extra model outputs under `key` (all keys, as a dict, without one)
        at `indices` (see get_actions)."""
        return self.read(READ_EXTRA_MODEL_OUTPUTS, indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, False, return_list, key)

    cdef object read(self, Read what, object indices, object agent_ids, object env_steps,
                     object neg_index_as_lookback, object fill, object one_hot_discrete,
                     object return_list, object key):
        # The compiled env-step read where it answers, else the facade's _get.
        if env_steps is True and not one_hot_discrete and (
                key is not None or what != READ_EXTRA_MODEL_OUTPUTS):
            result = self.env_read(what, indices, agent_ids, neg_index_as_lookback, fill, key,
                                   return_list)
            if result is not None:
                return result
        return self._get(READ_NAMES[what], indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, one_hot_discrete, return_list, key)

    cdef object env_read(self, Read what, object indices, object agent_ids,
                         bint neg_index_as_lookback, object fill, object key, bint return_list):
        """get_<what>(indices, agent_ids, env_steps=True, fill=..., return_list=...)
        without one-hot, for list-mode data (and single steps without a
        hanging value once numpy'ized): the mapping is read and translated to
        rows in C, one pass per agent. None, before anything changes, for
        anything else (the general path answers)."""
        cdef Py_ssize_t pos = 0, i, idx = 0, n_rows = -1
        cdef PyObject* key_ptr
        cdef PyObject* value
        cdef PyObject* found
        cdef bint single
        cdef list out
        episodes, mapping = self.agent_episodes, self.env_t_to_agent_t
        if not (type(episodes) is dict and isinstance(mapping, dict)
                and isinstance(self.agent_t_started, dict)):
            return None
        if what == READ_ACTIONS:
            hanging_of = self._hanging_actions_end
        elif what == READ_REWARDS:
            hanging_of = self._hanging_rewards_end
        elif what == READ_EXTRA_MODEL_OUTPUTS:
            hanging_of = self._hanging_extra_model_outputs_end
        else:
            hanging_of = None
        if hanging_of is not None and not isinstance(hanging_of, dict):
            return None
        if type(indices) is int:
            single = True
            idx = clamped_index(indices)
        elif indices is None or type(indices) is slice:
            single = False
        else:
            return None
        requested = None if agent_ids is None else self._requested(agent_ids)
        result = {}
        columns = {} if return_list else None
        while PyDict_Next(episodes, &pos, &key_ptr, &value):
            aid = <object>key_ptr
            if requested is not None and aid not in requested:
                continue
            found = PyDict_GetItemWithError(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            got = self.agent_reads(aid, <EpisodeCore>value, <AgentStepsCore>found, what, key,
                                   hanging_of, single, idx, indices, neg_index_as_lookback,
                                   fill, return_list)
            if got is DECLINE:
                return None
            if single and not return_list:
                if got is not MISSING and got is not None:
                    result[aid] = got
                continue
            out = [got] if single else <list>got
            if return_list:
                if n_rows >= 0 and len(out) != n_rows:
                    return None
                n_rows = len(out)
                columns[aid] = out
            else:
                out = [v for v in out if v is not MISSING]
                if len(out) > 0:
                    result[aid] = out
        if not return_list:
            return result
        # One dict per env step; an agent without a value there is left out.
        rows = []
        for i in range(n_rows if n_rows > 0 else 0):
            row = {}
            for aid, out in columns.items():
                item = out[i]
                if item is not MISSING and item is not None:
                    row[aid] = item
            rows.append(row)
        return rows

    cdef object agent_reads(self, object aid, EpisodeCore episode, AgentStepsCore steps,
                            Read what, object key, object hanging_of, bint single,
                            Py_ssize_t idx, object indices, bint neg_index_as_lookback,
                            object fill, bint fill_mapping):
        """One agent's value at each env step `indices` selects (MISSING where
        it has none), as its mapping's get() with `fill` ("S" with
        `fill_mapping`) and the buffer's reads at the translated rows give
        them: the value for an int index, else a list. DECLINE, having read
        nothing, for the general path."""
        cdef Py_ssize_t n, lb, first = 0, step = 1, count = 0, left = 0, right = 0
        cdef Py_ssize_t i, p, rows, total
        cdef long long agent_t_started
        cdef int64_t t
        cdef bint ignore_last = hanging_of is not None, has_hanging = False, finalized
        cdef SliceSpec spec
        cdef PyObject* found
        cdef BufferCore buffer
        if not steps.typed():
            return DECLINE
        # The agent's buffer and its hanging value (the virtual last row).
        if what == READ_OBSERVATIONS:
            buffer = episode.observations
        elif what == READ_INFOS:
            buffer = episode.infos
        elif what == READ_ACTIONS:
            buffer = episode.actions
        elif what == READ_REWARDS:
            buffer = episode.rewards
        else:
            outputs = own_extras(episode)
            if not isinstance(outputs, dict):
                return DECLINE
            found = PyDict_GetItemWithError(outputs, key)
            if found is NULL or not isinstance(<object>found, BufferCore):
                return DECLINE       # (a key only hanging so far, or none: general)
            buffer = <BufferCore>found
        if buffer is None:
            return DECLINE
        # A hanging row exists when the agent has a hanging value (for extra
        # outputs: a hanging dict, whatever keys it has).
        hanging = None
        if hanging_of is not None:
            found = PyDict_GetItemWithError(hanging_of, aid)
            if found is not NULL and <object>found is not None:
                has_hanging = True
                hanging = <object>found
                if what == READ_EXTRA_MODEL_OUTPUTS:
                    if not isinstance(hanging, dict):
                        return DECLINE
                    hanging = hanging.get(key)
        finalized = buffer.is_finalized() or episode.rewards is None \
            or episode.rewards.is_finalized()
        if finalized and (has_hanging or not single):
            return DECLINE
        found = PyDict_GetItemWithError(self.agent_t_started, aid)
        if found is NULL or not small_int(<object>found, &agent_t_started):
            return DECLINE
        rows = buffer.first().nrows()      # (not the cpdef: no override lookup)
        # The mapping's rows at `indices` (SKIP where filled), as its get() reads them.
        n = steps.flat().size
        lb = steps._lookback
        total = n - ignore_last
        if single:
            p = int_position(idx, neg_index_as_lookback, lb, total if total > 0 else 0,
                             (n - lb if n > lb else 0) + lb - ignore_last)
            if p < 0 and fill is None and not fill_mapping:
                return DECLINE           # (the general path raises IndexError)
            first, count = p, 1
        elif indices is None:
            interpret_slice(slice(None, -1 if ignore_last else None), False, lb, n, &spec)
            count = slice_positions(&spec, n, &first, &step)
        else:
            interpret_slice(indices, neg_index_as_lookback, lb, total, &spec)
            count = slice_positions(&spec, total if total > 0 else 0, &first, &step)
            if (fill is not None or fill_mapping) and (spec.fill_left or spec.fill_right):
                left, right = spec.fill_left, spec.fill_right
                if spec.length <= 0:
                    count = 0
        filler = None
        out = None if single else []
        for i in range(left + count + right):
            p = -1
            if left <= i < left + count and first >= 0:
                t = (<int64_t*>steps.flat().data)[first + (i - left) * step]
                if t != INT64_MIN:
                    if t > T_STARTED_LIMIT or t < -T_STARTED_LIMIT:
                        return DECLINE
                    # The agent step as a row of the buffer (lookback included).
                    p = <Py_ssize_t>t + buffer._lookback - agent_t_started
                    if p < 0:
                        return DECLINE       # (below the lookback: general rules)
                    if ignore_last and p == rows + has_hanging:
                        p = -1             # its latest observation awaits an action
            if p < 0:
                if fill is None:
                    item = MISSING
                else:
                    if filler is None:
                        filler = fill if buffer._space is None else buffer.get(
                            INDEX_LIMIT, neg_index_as_lookback=False, fill=fill)
                    item = filler
            elif p < rows:
                item = buffer.item_at(p)
            elif has_hanging and p == rows and hanging is not None:
                item = hanging
            else:
                return DECLINE               # past the data: general rules
            if single:
                return item
            out.append(item)
        return out

# -- pickling -------------------------------------------------------------------------

# The layout of a pickled multi-agent episode; other ones are refused.
MA_FORMAT = 1

# The fields of its state (see MultiAgentCore.__reduce_ex__), in order.
cdef enum:
    MS_ID, MS_MAPPING_FN, MS_MODULE_MAPPING, MS_OBSERVATION_SPACE, MS_ACTION_SPACE
    MS_ENV_T_STARTED, MS_ENV_T, MS_AGENT_T_STARTED, MS_HANGING_ACTIONS, MS_HANGING_OUTPUTS
    MS_HANGING_REWARDS_END, MS_HANGING_REWARDS_BEGIN, MS_TERMINATED, MS_TRUNCATED
    MS_LEN_LOOKBACK, MS_CUSTOM_DATA, MS_START_TIME, MS_LAST_STEP_TIME
    MS_AGENT_EPISODES, MS_MAPPINGS
    MS_FIELDS


def _restore_multi_agent(version, cls, state):
    """The multi-agent episode a pickle holds (see MultiAgentCore.__reduce_ex__).
    Each part of the state is checked before anything is made from it, and
    each agent's episode is checked whole once made: ValueError/TypeError
    for a corrupt state. The episode itself is made last."""
    cdef MultiAgentCore episode
    cdef StateReader reader = StateReader()
    cdef tuple s
    cdef double start_time, last_step_time
    if type(version) is not int or version != MA_FORMAT:
        raise ValueError(f"cannot restore a multi-agent episode pickled in format "
                         f"{version!r:.100}; this version of episode reads format {MA_FORMAT}")
    if cls is None:
        cls = MultiAgentEpisode
    if not (isinstance(cls, type) and issubclass(cls, MultiAgentCore)):
        raise TypeError(f"cannot restore a multi-agent episode as {cls!r:.100}")
    if type(state) is not tuple or len(<tuple>state) != MS_FIELDS:
        raise ValueError(f"corrupt multi-agent episode state: expected a tuple of "
                         f"{MS_FIELDS} fields, got {type(state).__name__}")
    s = <tuple>state
    fn = s[MS_MAPPING_FN]
    if fn is not None and not (type(fn) is tuple and len(<tuple>fn) == 1):
        raise ValueError(f"corrupt multi-agent episode state: the mapping function is None "
                         f"or (function,), got {fn!r:.100}")
    fn = default_mapping_fn if fn is None else fn[0]
    start_time = state_time(s[MS_START_TIME], "_start_time")
    last_step_time = state_time(s[MS_LAST_STEP_TIME], "_last_step_time")
    agent_t_started = container_from_state(s[MS_AGENT_T_STARTED])
    hanging_outputs = container_from_state(s[MS_HANGING_OUTPUTS])
    hanging_rewards_end = container_from_state(s[MS_HANGING_REWARDS_END])
    hanging_rewards_begin = container_from_state(s[MS_HANGING_REWARDS_BEGIN])
    # (Each agent's episode is checked whole, its tracks' lengths included.)
    agent_episodes = dict_from_state(s[MS_AGENT_EPISODES], EpisodeCore, reader)
    mapping = dict_from_state(s[MS_MAPPINGS], AgentSteps, reader)
    if len(<tuple>s[MS_AGENT_EPISODES]) == 1:
        # Agents in a container of another kind pickled as themselves: each
        # is checked as validate() checks it.
        for agent in agent_episodes.values():
            agent.validate()
    episode = cls.__new__(cls)
    episode.id_ = s[MS_ID]
    episode.agent_to_module_mapping_fn = fn
    episode._agent_to_module_mapping = s[MS_MODULE_MAPPING]
    episode.observation_space = s[MS_OBSERVATION_SPACE]
    episode.action_space = s[MS_ACTION_SPACE]
    episode.env_t_started = s[MS_ENV_T_STARTED]
    episode.env_t = s[MS_ENV_T]
    episode.agent_t_started = agent_t_started
    episode._hanging_actions_end = s[MS_HANGING_ACTIONS]
    episode._hanging_extra_model_outputs_end = hanging_outputs
    episode._hanging_rewards_end = hanging_rewards_end
    episode._hanging_rewards_begin = hanging_rewards_begin
    episode.is_terminated = s[MS_TERMINATED]
    episode.is_truncated = s[MS_TRUNCATED]
    episode._len_lookback_buffers = s[MS_LEN_LOOKBACK]
    episode._custom_data = s[MS_CUSTOM_DATA]
    episode.start_time = start_time
    episode.last_step_time = last_step_time
    episode.agent_episodes = agent_episodes
    episode.env_t_to_agent_t = mapping
    return episode


# The facade's classes and default mapping function (set by
# episode.multi_agent_episode): the C paths take only mappings of its class,
# whose reads go through AgentStepsCore.item_at; a pickle leaves out what is
# the facade's.
cdef type AgentSteps = AgentStepsCore
cdef type MultiAgentEpisode = MultiAgentCore
cdef object default_mapping_fn = None


def _register_facade(episode_cls, agent_steps_cls, mapping_fn):
    """Tells the core the facade's episode and mapping classes and its
    default agent-to-module mapping function."""
    global AgentSteps, MultiAgentEpisode, default_mapping_fn
    if not (isinstance(episode_cls, type) and issubclass(episode_cls, MultiAgentCore)):
        raise TypeError(f"expected a subclass of MultiAgentCore, got {episode_cls!r}")
    if not (isinstance(agent_steps_cls, type) and issubclass(agent_steps_cls, AgentStepsCore)):
        raise TypeError(f"expected a subclass of AgentStepsCore, got {agent_steps_cls!r}")
    MultiAgentEpisode, AgentSteps, default_mapping_fn = episode_cls, agent_steps_cls, mapping_fn
