"""Property-based differential tests: random episode histories on both classes.

A hypothesis state machine per (observation kind, action kind) drives one
RLlib SingleAgentEpisode and one of ours (difftools.EpTwin) through random
mixes of add_env_reset / add_env_step / to_numpy / cut / slice / concat of
cut chunks / getters / setters / state and pickle round trips, comparing
results, exception classes and the full episode state after every step. The
deliberate differences (test_single_agent_episode_differences.py and the
buffer's) are avoided.
"""
from __future__ import annotations

import copy
import os
import pickle

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from difftools import (KINDS, EpTwin, Mismatch, Other, buffer_wraps_around,
                       compare_episode_states,
                       fill_without_space_on_finalized_rows, known_rllib_crash,
                       rllib_slice_assertion, rllib_slice_overflows)

pytestmark = pytest.mark.rllib

from strategies import ITEMS as _ALL_ITEMS
from strategies import F32, box as _box

# The episode machines draw from the buffer kinds; strings are never empty here.
ITEMS = {k: _ALL_ITEMS[k] for k in
         ("box4", "discrete_int", "discrete_np", "multidiscrete", "dict", "nested")}
ITEMS["string"] = st.text(alphabet="abc", min_size=1, max_size=3)
REWARDS = st.one_of(st.floats(-10, 10), st.integers(-3, 3).map(float))
INFOS = st.one_of(st.none(), st.just({}),
                  st.builds(lambda v: {"v": v}, st.integers(-5, 5)))
INDEX = st.integers(-8, 8)
BOUND = st.one_of(st.none(), st.integers(-8, 8))
SLICE = st.builds(slice, BOUND, BOUND, st.sampled_from([None, None, 1, 2]))
EXTRA_KEYS = ("action_logp", "state_out")


def extras(data):
    return {"action_logp": data.draw(st.floats(-5, 0, width=32).map(F32), label="logp"),
            "state_out": data.draw(_box((2,)), label="state_out")}


class EpisodeMachine(RuleBasedStateMachine):
    obs_name = act_name = None  # set by the subclasses below

    def __init__(self):
        super().__init__()
        self.twin = None
        self.pred = None  # the episode the current chunk was cut from

    # -- helpers -------------------------------------------------------------------

    @property
    def okind(self):
        return KINDS[self.obs_name]

    @property
    def akind(self):
        return KINDS[self.act_name]

    @property
    def theirs(self):
        return self.twin.theirs

    def numpy_struct_cap(self, ep=None):
        """RLlib caps a numpy'ized Dict/Tuple buffer's lookback at its number of
        keys (deliberate buffer difference): the largest lookback to ask for."""
        ep = ep or self.theirs
        caps = [len(buf.data) for buf in (ep.observations, ep.actions)
                if buf.finalized and isinstance(buf.data, (dict, tuple))]
        return min(caps) if caps else 10 ** 9

    # -- set-up ------------------------------------------------------------------------

    @initialize(data=st.data(), spaces=st.booleans(), with_extras=st.booleans(),
                n=st.one_of(st.none(), st.integers(0, 4)),
                lookback=st.sampled_from(["auto", 0, 1, 2, 5]),
                t_started=st.one_of(st.none(), st.integers(0, 20)))
    def init(self, data, spaces, with_extras, n, lookback, t_started):
        self.with_extras = with_extras
        kwargs = dict(id_="ep")
        if spaces:
            kwargs.update(observation_space=self.okind.space, action_space=self.akind.space)
        if n is not None:  # constructor data (all or partly in the lookback)
            kwargs.update(
                observations=data.draw(st.lists(ITEMS[self.obs_name], min_size=n + 1,
                                                max_size=n + 1), label="observations"),
                actions=data.draw(st.lists(ITEMS[self.act_name], min_size=n, max_size=n),
                                  label="actions"),
                rewards=data.draw(st.lists(REWARDS, min_size=n, max_size=n), label="rewards"),
                len_lookback_buffer=lookback, t_started=t_started)
            if data.draw(st.booleans(), label="infos given"):
                kwargs["infos"] = data.draw(st.lists(INFOS.map(lambda i: i or {}),
                                                     min_size=n + 1, max_size=n + 1))
            if with_extras:
                steps = [extras(data) for _ in range(n)]
                kwargs["extra_model_outputs"] = {k: [s[k] for s in steps] for k in EXTRA_KEYS}
        self.twin = EpTwin.new(**kwargs)
        assert self.twin is not None

    # -- building --------------------------------------------------------------------

    @precondition(lambda self: not self.theirs.is_reset)
    @rule(data=st.data())
    def reset(self, data):
        obs = data.draw(ITEMS[self.obs_name], label="observation")
        infos = data.draw(INFOS, label="infos")
        self.twin.call("add_env_reset", obs, infos)

    @precondition(lambda self: self.theirs.is_reset and not self.theirs.is_done)
    @rule(data=st.data(), positional=st.booleans(),
          done=st.sampled_from([None] * 8 + ["terminated", "truncated"]))
    def step(self, data, positional, done):
        obs = data.draw(ITEMS[self.obs_name], label="observation")
        action = data.draw(ITEMS[self.act_name], label="action")
        reward = data.draw(REWARDS, label="reward")
        infos = data.draw(INFOS, label="infos")
        kwargs = {done: True} if done else {}
        if self.with_extras:
            kwargs["extra_model_outputs"] = extras(data)
        if positional:
            self.twin.call("add_env_step", obs, action, reward, infos, **kwargs)
        else:
            self.twin.call("add_env_step", observation=obs, action=action, reward=reward,
                           infos=infos, **kwargs)

    @precondition(lambda self: self.theirs.is_reset)
    @rule()
    def to_numpy(self):
        self.twin.call("to_numpy")

    @precondition(lambda self: self.theirs.is_reset)
    @rule(lookback=st.integers(0, 4), follow=st.booleans())
    def cut(self, lookback, follow):
        if lookback > self.numpy_struct_cap():
            return
        ours, theirs = self.twin.call("cut", len_lookback_buffer=lookback)
        if ours is not None and follow:
            self.pred, self.twin = self.twin, EpTwin(ours, theirs)

    @precondition(lambda self: self.pred is not None)
    @rule()
    def concat_onto_predecessor(self):
        pred = self.pred
        # Deliberate differences: into a numpy'ized episode; Dict/Tuple observations
        # or actions with a numpy'ized chunk.
        if pred.theirs.observations.finalized or pred.theirs.actions.finalized:
            return
        if (self.okind.struct or self.akind.struct) and (
                self.theirs.observations.finalized or self.theirs.actions.finalized):
            return  # (RLlib list.extend()s the chunk's dict/tuple of arrays: its keys)
        before = pred.theirs.t
        pred.call("concat_episode", Other(self.twin))
        if pred.theirs.t != before:  # it worked: go on with the whole episode
            self.twin, self.pred = pred, None

    @precondition(lambda self: self.theirs.is_reset)
    @rule(sl=SLICE, lookback=st.one_of(st.none(), st.integers(0, 3)), follow=st.booleans(),
          dunder=st.booleans())
    def slice(self, sl, lookback, follow, dunder):
        if rllib_slice_overflows(self.theirs, sl, len_lookback_buffer=lookback):
            return
        # (RLlib's buffer asserts on slices with no rows to address: a deliberate
        # buffer difference.)
        if dunder and lookback is None:
            ours, theirs = self.twin.call("__getitem__", sl, known=rllib_slice_assertion)
        else:
            ours, theirs = self.twin.call("slice", sl, len_lookback_buffer=lookback,
                                          known=rllib_slice_assertion)
        if ours is not None and follow:
            self.twin, self.pred = EpTwin(ours, theirs), None

    # -- reading ---------------------------------------------------------------------

    def getter(self, data):
        t = self.theirs
        choices = [("get_observations", (), t.observations, self.okind.fill, True),
                   ("get_actions", (), t.actions, self.akind.fill, True),
                   ("get_rewards", (), t.rewards, 0.0, False),
                   ("get_infos", (), t.infos, {"f": 1}, False)]
        choices += [("get_extra_model_outputs", (k,), buf, 0.0, False)
                    for k, buf in t.extra_model_outputs.items()]
        return data.draw(st.sampled_from(choices), label="getter")

    @rule(data=st.data(), indices=st.one_of(st.none(), INDEX, SLICE,
                                            st.lists(INDEX, max_size=3)))
    def get(self, data, indices):
        name, lead, buf, fill_value, can_hot = self.getter(data)
        neg = data.draw(st.booleans(), label="neg_index_as_lookback")
        fill = data.draw(st.sampled_from([None, fill_value]), label="fill")
        hot = can_hot and buf.space is not None and data.draw(st.booleans(), label="one_hot")
        idxs = indices if isinstance(indices, list) else (
            [indices] if isinstance(indices, int) else [])
        if any(buffer_wraps_around(buf, i, neg, fill, hot) for i in idxs):
            return
        if fill_without_space_on_finalized_rows(buf, fill):
            return
        kwargs = dict(neg_index_as_lookback=neg, fill=fill)
        if hot:
            kwargs["one_hot_discrete"] = True
        self.twin.call(name, *lead, indices, known=known_rllib_crash, **kwargs)

    @rule(method=st.sampled_from(["__len__", "__repr__", "get_return", "env_steps",
                                  "agent_steps", "get_data_dict", "get_sample_batch",
                                  "validate", "is_done"]))
    def simple(self, method):
        if method == "is_done":
            self.twin.check_state("properties")
            return
        self.twin.call(method, known=rllib_slice_assertion)

    # -- writing ---------------------------------------------------------------------

    @rule(data=st.data(), idx=INDEX, neg=st.booleans())
    def set_one(self, data, idx, neg):
        t = self.theirs
        setters = [("set_observations", {}, ITEMS[self.obs_name], t.observations),
                   ("set_actions", {}, ITEMS[self.act_name], t.actions),
                   ("set_rewards", {}, REWARDS, t.rewards)]
        if "action_logp" in t.extra_model_outputs:
            setters.append(("set_extra_model_outputs", {"key": "action_logp"},
                            st.floats(-5, 0, width=32).map(F32),
                            t.extra_model_outputs["action_logp"]))
        name, lead, items, buf = data.draw(st.sampled_from(setters), label="setter")
        if buf.finalized and isinstance(buf.data, (dict, tuple)) and buf.space is not None:
            return  # deliberate buffer difference (set on numpy'ized Dict/Tuple with a space)
        item = data.draw(items, label="new_data")
        self.twin.call(name, **lead, new_data=item, at_indices=idx, neg_index_as_lookback=neg)

    @rule(key=st.sampled_from(["a", "b"]), value=st.integers())
    def custom_data(self, key, value):
        self.twin.ours.custom_data[key] = [value]
        self.twin.theirs.custom_data[key] = [value]
        self.twin.check_state("custom_data")

    # -- round trips -----------------------------------------------------------------

    @rule(ours_state=st.booleans())
    def state_round_trip(self, ours_state):
        """Goes on with episodes rebuilt by from_state() (ours from RLlib's state
        or its own). Where RLlib's from_state raises, ours must raise alike."""
        self.twin.call("get_state", result_check=compare_episode_states)
        state = (self.twin.ours if ours_state else self.theirs).get_state()
        try:
            theirs, exc_theirs = self.twin.Rllib.from_state(
                copy.deepcopy(self.theirs.get_state())), None
        except Exception as e:  # noqa: BLE001
            theirs, exc_theirs = None, e
        try:
            ours, exc_ours = self.twin.Ours.from_state(copy.deepcopy(state)), None
        except Exception as e:  # noqa: BLE001
            ours, exc_ours = None, e
        if exc_theirs is not None:
            extras = self.theirs.get_state()["extra_model_outputs"] or {}
            if any(hasattr(v, "len_incl_lookback") for v in extras.values()):
                # RLlib's own state holds an all-lookback buffer object it cannot
                # read back; ours can (pinned in the differential tests).
                assert exc_ours is None, exc_ours
                return
            if not isinstance(exc_ours, type(exc_theirs)):
                raise Mismatch(f"from_state: RLlib raised {exc_theirs!r}, ours {exc_ours!r}")
            return
        if exc_ours is not None:
            raise Mismatch(f"from_state: RLlib worked, ours raised {exc_ours!r}")
        self.twin, self.pred = EpTwin(ours, theirs), None
        self.twin.check_state("from_state")

    @rule()
    def pickle_round_trip(self):
        ours = pickle.loads(pickle.dumps(self.twin.ours, protocol=5))
        self.twin = EpTwin(ours, copy.deepcopy(self.theirs))
        self.twin.check_state("pickle round trip")


# PROPS_MAX_EXAMPLES=500 for a longer hunt; the default keeps the suite fast.
# Failing examples are not shrunk (that can take minutes) unless PROPS_SHRINK=1.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("PROPS_SHRINK"):
    _PHASES.append(Phase.shrink)
SETTINGS = settings(max_examples=int(os.environ.get("PROPS_MAX_EXAMPLES", 40)),
                    stateful_step_count=25, deadline=None, database=None, phases=_PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

PAIRS = [("box4", "discrete_int"), ("discrete_np", "multidiscrete"), ("dict", "box4"),
         ("nested", "discrete_np"), ("string", "string"), ("multidiscrete", "dict")]

for _obs, _act in PAIRS:
    _machine = type(f"Machine_{_obs}_{_act}", (EpisodeMachine,),
                    {"obs_name": _obs, "act_name": _act})
    _case = _machine.TestCase
    _case.settings = SETTINGS
    _case.__name__ = f"TestRandomEpisodes_{_obs}_{_act}"
    globals()[_case.__name__] = _case
del _obs, _act, _machine, _case
