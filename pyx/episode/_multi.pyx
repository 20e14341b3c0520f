"""MultiAgentCore: the compiled half of MultiAgentEpisode.

It holds the episode's fields, the env_t -> agent_t mapping of each agent as a
typed int64 buffer (AgentStepsCore) and the per-step paths a sampler calls:
the usual add_env_step (every stepping agent known, none done) and the
latest-observation read. Everything else, and every step these paths decline
before changing anything, is the facade's (episode/multi_agent_episode.py).
"""
import copy
from collections import defaultdict

from cpython.dict cimport PyDict_DelItem, PyDict_GetItem, PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF, Py_XINCREF
from libc.math cimport NAN, isnan
from libc.stdint cimport INT64_MAX, INT64_MIN, int64_t

cimport numpy as cnp

from episode._buffer cimport BufferCore
from episode._column cimport Column, KIND_EMPTY, KIND_INT
from episode._episode cimport EpisodeCore, now, time_from, time_or_none
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


cdef class AgentStepsCore(BufferCore):
    # One agent's env_t -> agent_t mapping: an int64 Column in list mode,
    # SKIP_STEP where the agent did not step; reads show RLlib's "S" there.

    cdef object item_at(self, Py_ssize_t pos):
        cdef int64_t value
        if self.typed():
            value = (<int64_t*>self._col.data)[pos]
            return SKIP_TAG if value == INT64_MIN else PyLong_FromLongLong(value)
        item = BufferCore.item_at(self, pos)
        if type(item) is int and item == SKIP_OBJ:
            return SKIP_TAG
        return item

    cdef inline bint typed(self) noexcept:
        # The C paths read and append raw int64 steps only in this state.
        cdef Column col = self._col
        return col is not None and not col.finalized and (
            col.kind == KIND_INT or col.kind == KIND_EMPTY)

    cdef inline int push_step(self, int64_t step) except -1:
        # A raw append; typed() is true.
        cdef Column col = self._col
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
    cdef PyObject* value = PyDict_GetItem(d, key)
    return default if value is NULL else <object>value


cdef inline object pop_or(object d, object key, object default):
    # d.pop(key, default) for a dict (subclass), without a method call.
    cdef PyObject* value = PyDict_GetItem(d, key)
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

    def __cinit__(self, *args, **kwargs):
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
                                   terminateds, truncateds):
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
                         object truncateds) except -1:
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
                and type(truncateds) is dict
                and type(episodes) is dict and isinstance(mapping, dict)
                and isinstance(hanging_actions, dict)
                and isinstance(self._hanging_rewards_end, dict)
                and isinstance(self._hanging_extra_model_outputs_end, dict)
                and isinstance(t_started, dict)):
            return False
        if PyDict_Size(episodes) > MAX_FAST_AGENTS or PyDict_Size(mapping) != PyDict_Size(episodes):
            return False
        for flags in (terminateds, truncateds):
            found = PyDict_GetItem(flags, "__all__")
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
            found = PyDict_GetItem(terminateds, aid)
            in_term = found is not NULL
            flagged = in_term and <object>found
            found = PyDict_GetItem(truncateds, aid)
            in_trunc = found is not NULL
            flagged = flagged or (in_trunc and <object>found)
            done = ep.is_terminated or ep.is_truncated
            if not done:
                n_live += 1
            found = PyDict_GetItem(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not (<AgentStepsCore>found).typed():
                return False
            plan.steps = found
            Py_INCREF(<object>found)
            obs = PyDict_GetItem(observations, aid)
            act = PyDict_GetItem(actions, aid)
            in_rewards = PyDict_GetItem(rewards, aid) is not NULL
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
            found = PyDict_GetItem(t_started, aid)
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
                if not in_rewards:
                    return False
                plan.move = MOVE_STEP
            elif not absent(obs):
                if PyDict_GetItem(hanging_actions, aid) is NULL:
                    return False
                plan.move = MOVE_JOIN
            elif not absent(act):
                if PyDict_GetItem(hanging_actions, aid) is not NULL:
                    return False
                plan.move = MOVE_HANG
            else:
                plan.move = MOVE_REWARD
        # A key of no known agent (a new agent, "__all__" among the agents' data).
        return (n_obs == PyDict_Size(observations) and n_act == PyDict_Size(actions)
                and n_rew == PyDict_Size(rewards)
                and n_term == PyDict_Size(terminateds) - (PyDict_GetItem(terminateds, "__all__") is not NULL)
                and n_trunc == PyDict_Size(truncateds) - (PyDict_GetItem(truncateds, "__all__") is not NULL)
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
        self.last_step_time = now()
        if isnan(self.start_time):
            self.start_time = self.last_step_time
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
            found = PyDict_GetItem(mapping, <object>key)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            steps = <AgentStepsCore>found
            episode = <EpisodeCore>value
            if (not steps.typed() or steps._col.size == 0
                    or (<int64_t*>steps._col.data)[steps._col.size - 1] == INT64_MIN
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
            (<EpisodeCore>piece).extra_model_outputs = {}
            (<EpisodeCore>piece).custom_data_ = None
            pieces[aid] = piece
            steps = AgentSteps.__new__(AgentSteps)
            steps.push_step(episode.t)
            new_mapping[aid] = steps
        successor.agent_episodes = pieces
        successor.env_t_to_agent_t = new_mapping
        successor._custom_data = copy.deepcopy(self._custom_data) if self._custom_data else {}
        return successor

    def get_observations(self, indices=None, agent_ids=None, *, env_steps=True,
                         neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                         return_list=False):
        """Observations at `indices` (env steps by default, else each agent's
        own steps), per agent, or one dict per env step with `return_list`."""
        if (type(indices) is int and agent_ids is None and env_steps is True
                and not neg_index_as_lookback and fill is None and not one_hot_discrete
                and not return_list):
            result = self._observations_at(indices)
            if result is not None:
                return result
        return self._get("observations", indices, agent_ids, env_steps,
                         neg_index_as_lookback, fill, one_hot_discrete, return_list)

    def get_actions(self, indices=None, agent_ids=None, *, env_steps=True,
                    neg_index_as_lookback=False, fill=None, one_hot_discrete=False,
                    return_list=False):
        """Actions at `indices` (see get_observations); an action taken
        after an agent's last observation (hanging) counts as its last step."""
        if (type(indices) is slice and agent_ids is None and env_steps is True
                and not neg_index_as_lookback and fill is not None and not one_hot_discrete
                and not return_list):
            result = self._actions_filled(indices, fill)
            if result is not None:
                return result
        return self._get("actions", indices, agent_ids, env_steps, neg_index_as_lookback,
                         fill, one_hot_discrete, return_list)

    cdef object _actions_filled(self, object slice_, object fill):
        """Each agent's actions at the env steps of `slice_`, `fill` where it
        did not act (its hanging action as the step after its last one), as
        lists: list mode only. None, before anything changes, for the general
        path."""
        cdef Py_ssize_t pos = 0, n, total, lb, first, step, count, i, p = 0, limit
        cdef long long agent_t_started
        cdef bint skip
        cdef Py_ssize_t left, right, offset
        cdef SliceSpec spec
        cdef PyObject* key
        cdef PyObject* value
        cdef PyObject* found
        cdef AgentStepsCore steps
        cdef BufferCore actions
        cdef int64_t t
        cdef list values
        episodes, mapping, t_started = self.agent_episodes, self.env_t_to_agent_t, \
            self.agent_t_started
        hanging_actions = self._hanging_actions_end
        if not (isinstance(episodes, dict) and isinstance(mapping, dict)
                and isinstance(t_started, dict) and isinstance(hanging_actions, dict)):
            return None
        result = {}
        while PyDict_Next(episodes, &pos, &key, &value):
            aid = <object>key      # held: a fill value's code may run in between
            found = PyDict_GetItem(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            steps = <AgentStepsCore>found
            actions = (<EpisodeCore>value).actions
            if not steps.typed() or actions is None or actions.is_finalized():
                return None
            # The mapping's rows without its last one (the step awaiting an action).
            n = steps._col.size
            total = n - 1
            lb = steps._lookback
            if total < 1:
                return None
            interpret_slice(slice_, False, lb, total, &spec)
            left, right = spec.fill_left, spec.fill_right
            count = slice_positions(&spec, total, &first, &step)
            if (left or right) and spec.length <= 0:
                count = 0
            found = PyDict_GetItem(t_started, aid)
            if found is NULL or type(<object>found) is not int:
                return None
            if not small_int(<object>found, &agent_t_started):
                return None
            offset = actions._lookback - agent_t_started
            found = PyDict_GetItem(hanging_actions, aid)
            hanging = None if found is NULL else <object>found
            limit = actions.len_incl_lookback() + (hanging is not None)
            filler = None
            values = []
            for i in range(left + count + right):
                skip = i < left or i >= left + count
                if not skip:
                    t = (<int64_t*>steps._col.data)[first + (i - left) * step]
                    if t != INT64_MIN and (t > T_STARTED_LIMIT or t < -T_STARTED_LIMIT):
                        return None
                    p = 0 if t == INT64_MIN else <Py_ssize_t>t + offset
                    # No step, or the step after the hanging one (awaiting an action).
                    skip = t == INT64_MIN or p == limit
                if skip:
                    if filler is None:
                        filler = fill if actions._space is None else actions.get(
                            INDEX_LIMIT, neg_index_as_lookback=False, fill=fill)
                    values.append(filler)
                elif 0 <= p < limit - (hanging is not None):
                    values.append(actions.item_at(p))
                elif hanging is not None and p == limit - 1:
                    values.append(hanging)
                else:
                    return None
            if len(values) > 0:
                result[aid] = values
        return result

    def _env_read(self, str what, object indices, object agent_ids, bint neg_index_as_lookback,
                  object fill, object key):
        """get_<what>(indices, agent_ids, env_steps=True, fill=...) without
        one-hot or return_list, for list-mode data (and single steps without
        a hanging value once numpy'ized): the mapping is read and translated
        to rows in C, one pass per agent. None, before anything changes, for
        anything else (the general path answers)."""
        cdef Py_ssize_t pos = 0, n, lb, first = 0, step = 1, count = 0, left = 0, right = 0
        cdef Py_ssize_t i, k, p, rows, total, idx = 0
        cdef long long agent_t_started
        cdef int64_t t
        cdef bint single, ignore_last, has_limit, finalized, has_hanging
        cdef SliceSpec spec
        cdef PyObject* key_ptr
        cdef PyObject* value
        cdef PyObject* found
        cdef AgentStepsCore steps
        cdef BufferCore buffer
        cdef EpisodeCore episode
        cdef list values
        episodes, mapping, t_started = self.agent_episodes, self.env_t_to_agent_t, \
            self.agent_t_started
        if not (type(episodes) is dict and isinstance(mapping, dict)
                and isinstance(t_started, dict)):
            return None
        if what == "observations" or what == "infos":
            ignore_last = False
            hanging_of = None
        elif what == "actions":
            ignore_last, hanging_of = True, self._hanging_actions_end
        elif what == "rewards":
            ignore_last, hanging_of = True, self._hanging_rewards_end
        elif what == "extra_model_outputs" and key is not None:
            ignore_last, hanging_of = True, self._hanging_extra_model_outputs_end
        else:
            return None
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
        while PyDict_Next(episodes, &pos, &key_ptr, &value):
            aid = <object>key_ptr
            if requested is not None and aid not in requested:
                continue
            found = PyDict_GetItem(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            steps = <AgentStepsCore>found
            episode = <EpisodeCore>value
            if not steps.typed():
                return None
            # The agent's buffer and its hanging value (the virtual last row).
            if what == "extra_model_outputs":
                outputs = episode.extra_model_outputs
                if not isinstance(outputs, dict):
                    return None
                found = PyDict_GetItem(outputs, key)
                if found is NULL or not isinstance(<object>found, BufferCore):
                    return None       # (a key only hanging so far, or none: general)
                buffer = <BufferCore>found
            else:
                buffer = getattr(episode, what)
                if buffer is None:
                    return None
            # A hanging row exists when the agent has a hanging value (for
            # extra outputs: a hanging dict, whatever keys it has).
            hanging = None
            has_hanging = False
            if hanging_of is not None:
                found = PyDict_GetItem(hanging_of, aid)
                if found is not NULL and <object>found is not None:
                    has_hanging = True
                    hanging = <object>found
                    if what == "extra_model_outputs":
                        if not isinstance(hanging, dict):
                            return None
                        hanging = hanging.get(key)
            finalized = buffer.is_finalized() or episode.rewards is None \
                or episode.rewards.is_finalized()
            if finalized and (has_hanging or not single):
                return None
            found = PyDict_GetItem(t_started, aid)
            if found is NULL or not small_int(<object>found, &agent_t_started):
                return None
            rows = buffer.len_incl_lookback()
            has_limit = ignore_last
            # The mapping's rows at `indices` (SKIP where filled), as its get() reads them.
            n = steps._col.size
            lb = steps._lookback
            total = n - ignore_last
            if single:
                p = int_position(idx, neg_index_as_lookback, lb, total if total > 0 else 0,
                                 (n - lb if n > lb else 0) + lb - ignore_last)
                if p < 0 and fill is None:
                    return None           # (the general path raises IndexError)
                first, count, step, left, right = p, 1, 1, 0, 0
            elif indices is None:
                interpret_slice(slice(None, -1 if ignore_last else None), False, lb, n, &spec)
                count = slice_positions(&spec, n, &first, &step)
                left = right = 0
            else:
                interpret_slice(indices, neg_index_as_lookback, lb, total, &spec)
                count = slice_positions(&spec, total if total > 0 else 0, &first, &step)
                left = right = 0
                if fill is not None and (spec.fill_left or spec.fill_right):
                    left, right = spec.fill_left, spec.fill_right
                    if spec.length <= 0:
                        count = 0
            values = []
            filler = None
            for i in range(left + count + right):
                p = -1
                if left <= i < left + count and (not single or first >= 0):
                    t = (<int64_t*>steps._col.data)[first + (i - left) * step]
                    if t != INT64_MIN:
                        if t > T_STARTED_LIMIT or t < -T_STARTED_LIMIT:
                            return None
                        # The agent step as a row of the buffer (lookback included).
                        p = <Py_ssize_t>t + buffer._lookback - agent_t_started
                        if p < 0:
                            return None       # (below the lookback: general rules)
                        if has_limit and p == rows + has_hanging:
                            p = -1            # its latest observation awaits an action
                if p < 0:
                    if fill is None:
                        continue
                    if filler is None:
                        filler = fill if buffer._space is None else buffer.get(
                            INDEX_LIMIT, neg_index_as_lookback=False, fill=fill)
                    values.append(filler)
                elif p < rows:
                    values.append(buffer.item_at(p))
                elif has_hanging and p == rows and hanging is not None:
                    values.append(hanging)
                else:
                    return None               # past the data: general rules
            if single:
                if len(values) == 1 and values[0] is not None:
                    result[aid] = values[0]
            elif len(values) > 0:
                result[aid] = values
        return result

    cdef object _observations_at(self, object index):
        """Each agent's observation at env step `index` (agents that did not
        step there left out); None, before anything changes, where the
        general path has to answer (an index out of range raises there)."""
        cdef Py_ssize_t pos = 0, idx = clamped_index(index), n, lb, p
        cdef long long agent_t_started
        cdef PyObject* key
        cdef PyObject* value
        cdef PyObject* found
        cdef AgentStepsCore steps
        cdef BufferCore obs
        cdef int64_t t
        episodes, mapping, t_started = self.agent_episodes, self.env_t_to_agent_t, \
            self.agent_t_started
        if not (isinstance(episodes, dict) and isinstance(mapping, dict)
                and isinstance(t_started, dict)):
            return None
        result = {}
        while PyDict_Next(episodes, &pos, &key, &value):
            aid = <object>key
            found = PyDict_GetItem(mapping, aid)
            if found is NULL or type(<object>found) is not AgentSteps:
                return None
            steps = <AgentStepsCore>found
            if not steps.typed():
                return None
            n = steps._col.size
            lb = steps._lookback
            p = int_position(idx, False, lb, n, (n - lb if n > lb else 0) + lb)
            if p < 0:
                return None
            t = (<int64_t*>steps._col.data)[p]
            if t == INT64_MIN:
                continue
            found = PyDict_GetItem(t_started, aid)
            if found is NULL or type(<object>found) is not int \
                    or not isinstance(<object>value, EpisodeCore):
                return None
            obs = (<EpisodeCore>value).observations
            if obs is None:
                return None
            # The agent step as a row of its observations (lookback included).
            if not small_int(<object>found, &agent_t_started) \
                    or t > T_STARTED_LIMIT or t < -T_STARTED_LIMIT:
                return None
            p = <Py_ssize_t>t + obs._lookback - agent_t_started
            if p < 0 or p >= obs.len_incl_lookback():
                return None
            item = obs.item_at(p)
            if item is not None:
                result[aid] = item
        return result


# The facade's class of mappings (set by episode.multi_agent_episode): the C
# paths take only those, whose reads go through AgentStepsCore.item_at.
cdef type AgentSteps = AgentStepsCore


def _register_agent_steps(cls):
    """Tells the core which Python class the facade's mappings have."""
    global AgentSteps
    if not (isinstance(cls, type) and issubclass(cls, AgentStepsCore)):
        raise TypeError(f"expected a subclass of AgentStepsCore, got {cls!r}")
    AgentSteps = cls
