"""Property-based differential tests: random multi-agent episode histories.

A hypothesis state machine drives one RLlib MultiAgentEpisode and one of ours
(ma_difftools.MATwin) through random mixes of add_env_reset / valid
add_env_step calls (tests/ma_strategies.py, drawn from the agents' current
states, so they go on after cut/slice/from_state), getters with every option,
setters, to_numpy, cut (optionally going on with the successor and
concatenating it back), slice/[] (optionally going on with the piece), state
and pickle round trips; both sides are compared after every rule. Where RLlib
crashes internally or answers wrong (see ma_difftools), ours is not compared;
once our episode did what RLlib could not, the machine starts a new episode.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import ma_strategies as mas
from difftools import Other
from ma_difftools import Known, MATwin, ours_ma_class, rllib_ma_class, selftest

pytestmark = pytest.mark.rllib


class MultiAgentMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # The classes (skips the test before any rule runs if ours is missing).
        rllib_ma_class(), ours_ma_class()
        self.twin = None
        self.pred = None  # the twin the current chunk was cut from

    @property
    def theirs(self):
        return self.twin.theirs

    def fresh(self, data):
        self.sc = data.draw(mas.scenarios(), label="scenario")
        kwargs = self.sc.constructor_kwargs(data.draw(st.sampled_from(["ep", None]),
                                                      label="id"))
        if data.draw(st.booleans(), label="constructor data"):
            ep = data.draw(mas.episodes(invalid=False, max_steps=5), label="history")
            ep.scenario = self.sc = ep.scenario
            kwargs = self.sc.constructor_kwargs("ep")
            kwargs.update(mas.as_constructor_data(ep))
            kwargs["len_lookback_buffer"] = data.draw(st.sampled_from(["auto", 0, 1, 2]),
                                                      label="lookback")
        twin = MATwin.new(**kwargs)
        if twin is None:  # both constructors refused the history
            twin = MATwin.new(**self.sc.constructor_kwargs("ep"))
        self.twin, self.pred = twin, None

    @initialize(data=st.data())
    def init(self, data):
        self.fresh(data)

    @precondition(lambda self: self.twin.diverged)
    @rule(data=st.data())
    def restart(self, data):
        """Ours did what RLlib could not: go on with a new pair."""
        self.fresh(data)

    def alive(self):
        return not self.twin.diverged

    # -- building ----------------------------------------------------------------------

    @precondition(lambda self: self.alive() and not self.theirs.is_reset
                  and self.theirs.env_t == 0)
    @rule(data=st.data())
    def reset(self, data):
        call, _ = data.draw(mas.reset_call(self.sc), label="reset")
        self.twin.call(call[0], *call[1], **call[2])

    @precondition(lambda self: self.alive() and self.theirs.is_reset
                  and not self.theirs.is_done)
    @rule(data=st.data(), count=st.integers(1, 4))
    def steps(self, data, count):
        for _ in range(count):
            if not self.alive() or self.theirs.is_done:
                return
            states = mas.agent_states(self.theirs, self.sc.agents)
            call, _ = data.draw(mas.env_step(self.sc, states, mas.stepped_agents(self.theirs),
                                             mas.output_agents(self.theirs)), label="step")
            self.twin.call(call[0], *call[1], **call[2])

    @precondition(lambda self: self.alive() and self.theirs.is_reset)
    @rule()
    def to_numpy(self):
        self.twin.call("to_numpy")

    @precondition(lambda self: self.alive() and self.theirs.is_reset)
    @rule(lookback=st.sampled_from([None, 0, 1, 2, 3]), follow=st.booleans())
    def cut(self, lookback, follow):
        kwargs = {} if lookback is None else {"len_lookback_buffer": lookback}
        ours, theirs = self.twin.call("cut", **kwargs)
        if follow and ours is not None and not isinstance(theirs, Known):
            self.pred, self.twin = self.twin, self.twin.child(ours, theirs)

    @precondition(lambda self: self.alive() and self.pred is not None
                  and not self.pred.diverged
                  and self.theirs.env_t == self.pred.theirs.env_t_started)
    @rule()
    def concat_predecessor_onto_chunk(self):
        """The other way round, where the time steps allow it (a predecessor
        without steps of its own): each side's own hanging rewards stay."""
        self.twin.call("concat_episode", Other(self.pred))
        self.pred = None

    @precondition(lambda self: self.alive() and self.pred is not None
                  and not self.pred.diverged)
    @rule()
    def concat_onto_predecessor(self):
        pred = self.pred
        before = pred.theirs.env_t
        pred.call("concat_episode", Other(self.twin))
        if pred.diverged or pred.theirs.env_t != before or len(self.theirs) == 0:
            self.twin, self.pred = pred, None

    @precondition(lambda self: self.alive() and self.theirs.is_reset)
    @rule(sl=mas.SLICES, lookback=st.sampled_from([None, 0, 1, 3]), follow=st.booleans(),
          dunder=st.booleans())
    def slice(self, sl, lookback, follow, dunder):
        if dunder:
            ours, theirs = self.twin.call("__getitem__", sl)
        else:
            kwargs = {} if lookback is None else {"len_lookback_buffer": lookback}
            ours, theirs = self.twin.call("slice", sl, **kwargs)
        if follow and ours is not None and not isinstance(theirs, Known):
            self.twin, self.pred = self.twin.child(ours, theirs), None

    # -- reading -----------------------------------------------------------------------

    @precondition(lambda self: self.alive())
    @rule(data=st.data())
    def get(self, data):
        keys = self.sc.extras or mas.EXTRA_KEYS
        name, args, kwargs = data.draw(mas.getter_call(self.sc.agents, keys), label="getter")
        self.twin.call(name, *args, **kwargs)

    @precondition(lambda self: self.alive())
    @rule(call=mas.other_call())
    def other(self, call):
        name, args, kwargs = call
        if name in ("cut", "slice", "__getitem__", "to_numpy"):
            return  # (rules of their own)
        self.twin.call(name, *args, **kwargs)

    @precondition(lambda self: self.alive())
    @rule(key=st.sampled_from(["a", "b"]), value=st.integers())
    def custom_data(self, key, value):
        self.twin.ours.custom_data[key] = [value]
        self.twin.theirs.custom_data[key] = [value]
        self.twin.check_state("custom_data")

    # -- writing -----------------------------------------------------------------------

    @precondition(lambda self: self.alive() and self.theirs.agent_episodes)
    @rule(data=st.data(), idx=st.integers(-3, 2), neg=st.booleans())
    def set_one(self, data, idx, neg):
        agents = list(self.theirs.agent_episodes)
        aid = data.draw(st.sampled_from(agents + ["zz"]), label="agent")
        what = data.draw(st.sampled_from(["observations", "actions", "rewards"]), label="what")
        if aid == "zz":
            value = 0
        elif what == "observations":
            value = data.draw(self.sc.obs_value(aid))
        elif what == "actions":
            value = data.draw(self.sc.act_value(aid))
        else:
            value = data.draw(mas.REWARDS)
        self.twin.call(f"set_{what}", new_data={aid: value}, at_indices=idx,
                       neg_index_as_lookback=neg)

    @precondition(lambda self: self.alive() and self.theirs.agent_episodes)
    @rule(data=st.data(), idx=st.integers(-3, 2), neg=st.booleans())
    def set_several(self, data, idx, neg):
        """Several agents in one set_*() call, an unknown one among them
        maybe: RLlib raises the first failing agent's error in dict order."""
        agents = data.draw(st.lists(st.sampled_from(list(self.theirs.agent_episodes) + ["zz"]),
                                    min_size=2, max_size=4, unique=True), label="agents")
        what = data.draw(st.sampled_from(["observations", "actions", "rewards"]), label="what")
        values = {}
        for aid in agents:
            if aid == "zz":
                values[aid] = 0
            elif what == "observations":
                values[aid] = data.draw(self.sc.obs_value(aid))
            elif what == "actions":
                values[aid] = data.draw(self.sc.act_value(aid))
            else:
                values[aid] = data.draw(mas.REWARDS)
        self.twin.call(f"set_{what}", new_data=values, at_indices=idx,
                       neg_index_as_lookback=neg)

    # -- round trips -------------------------------------------------------------------

    @precondition(lambda self: self.alive())
    @rule(how=st.sampled_from(["from_state", "state_pickle", "pickle"]),
          ours_state=st.booleans())
    def round_trip(self, how, ours_state):
        """Goes on with episodes rebuilt by from_state() (ours from its own
        state or, in the self-test, from RLlib's) or unpickled."""
        self.twin.call("get_state")
        new = self.twin.restored_copy(how, from_ours=ours_state or not selftest())
        if new is not None:
            self.twin, self.pred = new, None


# MA_PROPS_MAX_EXAMPLES=300 for a longer hunt. Failing examples are not shrunk
# (that can take minutes) unless PROPS_SHRINK=1.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("PROPS_SHRINK"):
    _PHASES.append(Phase.shrink)

TestMultiAgentEpisodes = MultiAgentMachine.TestCase
TestMultiAgentEpisodes.settings = settings(
    max_examples=int(os.environ.get("MA_PROPS_MAX_EXAMPLES", 40)), stateful_step_count=25,
    deadline=None, database=None, phases=_PHASES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                           HealthCheck.data_too_large])
