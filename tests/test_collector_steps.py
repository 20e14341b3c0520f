"""AgentCollector's compiled step (episode._collect): a step whose keys and
nesting are those of the step before is taken in C along a layout decided
once; any other takes the Python path. Both must give RLlib's results.

Each test drives RLlib's collector and ours through the same calls and
compares every batch, and checks how many steps took the Python path (the
compiled one must take the steps of an unchanged layout).
"""
from __future__ import annotations

import collections.abc
import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

pytestmark = pytest.mark.rllib
pytest.importorskip("ray.rllib")

from ray.rllib.evaluation.collectors.agent_collector import (  # noqa: E402
    AgentCollector as RllibAC,
)
from ray.rllib.policy.view_requirement import ViewRequirement as RllibVR  # noqa: E402

from difftools import compare  # noqa: E402
from episode import AgentCollector, ViewRequirement  # noqa: E402
from test_collector_rllib import compare_batches  # noqa: E402

BOX = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
OURS, RLLIB = (AgentCollector, ViewRequirement), (RllibAC, RllibVR)


@pytest.fixture
def python_steps(monkeypatch):
    """The steps our collectors took along the Python path (a list of the
    step dicts)."""
    taken = []
    general = AgentCollector._add_step

    def counted(self, values):
        taken.append(values)
        return general(self, values)

    monkeypatch.setattr(AgentCollector, "_add_step", counted)
    return taken


def cartpole_views(VR, **extra):
    return {"obs": VR(space=BOX),
            "new_obs": VR("obs", shift=1, space=BOX, used_for_compute_actions=False),
            "actions": VR(space=gym.spaces.Discrete(2), used_for_compute_actions=False),
            "rewards": VR(used_for_compute_actions=False),
            "prev_actions": VR("actions", shift=-1, space=gym.spaces.Discrete(2)),
            "prev_rewards": VR("rewards", shift=-1),
            "frames": VR("obs", shift="-3:0", space=BOX),
            **{name: make(VR) for name, make in extra.items()}}


def sampler_step(i, **changes):
    """Step i as RLlib's old-stack sampler hands it over (EnvRunnerV2's keys,
    then the action its connectors add)."""
    step = {"t": i, "env_id": 0, "agent_index": 0, "rewards": i + 0.5,
            "terminateds": False, "truncateds": False, "infos": {},
            "new_obs": np.full(4, i / 10, np.float32), "actions": i % 2}
    step.update(changes)
    return {k: v for k, v in step.items() if v is not _DROP}


_DROP = object()


class Twins:
    """RLlib's collector and ours, made and driven alike."""

    def __init__(self, views, init_obs=None, **ctor):
        self.sides = []
        for AC, VR in (RLLIB, OURS):
            AC._next_unroll_id = 7
            collector = AC(views(VR), **ctor)
            collector.add_init_obs(episode_id=3, agent_index=0, env_id=0,
                                   init_obs=np.zeros(4, np.float32) if init_obs is None
                                   else copy.deepcopy(init_obs))
            self.sides.append(collector)
        self.theirs, self.ours = self.sides

    def step(self, values, infer=True, label=""):
        for side in self.sides:
            side.add_action_reward_next_obs(copy.deepcopy(values))
        for name in ("agent_steps", "episode_id", "unroll_id"):
            compare(getattr(self.ours, name), getattr(self.theirs, name), f"{label} {name}")
        if infer:
            self.infer(label)

    def infer(self, label=""):
        theirs, ours = (side.build_for_inference() for side in self.sides)
        compare_batches(ours, theirs, f"{label} inference")

    def train(self, label=""):
        theirs, ours = (side.build_for_training(side.view_requirements)
                        for side in self.sides)
        compare_batches(ours, theirs, f"{label} training")

    def raises(self, values):
        """Both raise on `values`, the same class; ours' class."""
        raised = []
        for side in self.sides:
            with pytest.raises(Exception) as info:
                side.add_action_reward_next_obs(copy.deepcopy(values))
            raised.append(type(info.value))
        assert raised[0] is raised[1], raised
        return raised[1]


def _rows(collector):
    return {key: [track.to_list() for track in tracks]
            for key, tracks in collector.buffers.items()}


@pytest.mark.parametrize("training", [False, True])
def test_a_samplers_steps_take_the_compiled_path(training, python_steps):
    """RLlib's sampler rhythm: only the first steps (training: the first;
    inference: while zero rows are still in front of the tracks) take the
    Python path; the batches are RLlib's at every step and at the end."""
    twins = Twins(cartpole_views, is_training=training)
    for i in range(12):
        twins.step(sampler_step(i), label=f"step {i}")
    assert len(python_steps) == (1 if training else 4)
    assert twins.ours._has_layout
    twins.train()
    # A trajectory that goes on: the next fragment's steps (a new unroll id)
    # are RLlib's too, and keep the compiled path.
    taken = len(python_steps)
    for i in range(12, 16):
        twins.step(sampler_step(i), label=f"step {i}")
    assert len(python_steps) == taken
    twins.train("second fragment")


def test_steps_without_t_continue_the_t_column(python_steps):
    """No "t" in the steps: each takes the last t + 1, on either path."""
    views = lambda VR: cartpole_views(VR, t=lambda VR: VR("t"), infos=lambda VR: VR("infos"))
    twins = Twins(views)
    for i in range(6):
        twins.step(sampler_step(i, t=_DROP, infos=[{}, {"i": i}, None][i % 3]),
                   label=f"step {i}")
    assert len(python_steps) == 1
    twins.train()


def _struct_views(VR):
    obs = gym.spaces.Dict({"b": gym.spaces.Box(-1, 1, (2,), np.float32),
                           "a": gym.spaces.Tuple([gym.spaces.Discrete(3),
                                                  gym.spaces.Box(0, 1, (3,), np.float32)])})
    act = gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)])
    return {"obs": VR(space=obs), "prev_obs": VR("obs", shift=-1, space=obs),
            "actions": VR(space=act, used_for_compute_actions=False),
            "prev_actions": VR("actions", shift=-1, space=act),
            "rewards": VR(used_for_compute_actions=False)}


def _struct_obs(i):
    return {"b": np.full(2, i, np.float32), "a": (i % 3, np.full(3, i / 10, np.float32))}


def _struct_step(i, **changes):
    step = {"rewards": float(i), "terminateds": False, "truncateds": False,
            "new_obs": _struct_obs(i + 1), "actions": (i % 3, np.full(2, -i, np.float32))}
    step.update(changes)
    return step


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("training", [False, True])
def test_dict_and_tuple_observations_and_actions(flatten, training, python_steps):
    """Dict observations holding a Tuple, Tuple actions, kept as leaves or
    (disable_action_flattening=False) as one array: the compiled path walks
    them as the first step nested."""
    twins = Twins(_struct_views, init_obs=_struct_obs(0), is_training=training,
                  disable_action_flattening=not flatten)
    for i in range(8):
        twins.step(_struct_step(i), label=f"step {i}")
    assert len(python_steps) == (1 if training else 2)
    # Other containers of the same leaves (a list for the tuple, keys in
    # another order) and numpy scalars for the Discrete leaves.
    odd = {"a": [np.int64(1), np.ones(3, np.float32)], "b": np.zeros(2, np.float32)}
    twins.step(_struct_step(8, new_obs=odd, actions=[np.int64(2), np.ones(2, np.float32)]),
               label="other containers")
    for i in range(9, 12):
        twins.step(_struct_step(i), label=f"step {i}")
    if training:
        twins.train()


def test_keys_that_come_go_and_change_places(python_steps):
    """A step with a key more, one without it, keys in another order: each
    new layout takes the Python path once, then the compiled one."""
    views = lambda VR: cartpole_views(VR, vf_preds=lambda VR: VR("vf_preds"))
    twins = Twins(views)
    plan = ([sampler_step(i) for i in range(5)]
            + [sampler_step(i, vf_preds=np.float32(i / 3)) for i in range(5, 8)]
            + [sampler_step(i) for i in range(8, 10)]
            + [dict(reversed(sampler_step(i).items())) for i in range(10, 13)])
    for i, values in enumerate(plan):
        twins.step(values, label=f"step {i}")
    # The first; the second (the first inference input gave vf_preds a
    # placeholder column: a change of state); then one per change of layout.
    assert [step["t"] for step in python_steps] == [0, 1, 5, 8, 10]
    compare(len(twins.ours.buffers["vf_preds"][0]), len(twins.theirs.buffers["vf_preds"][0]),
            "rows of the column that came and went")


@pytest.mark.parametrize("odd", [np.float32(2.5), 7])
def test_a_value_of_another_kind_on_the_compiled_path(odd, python_steps):
    """A reward or an observation of another kind (the track changes type or
    goes to the object path) in a step of an unchanged layout. (A reward of
    None or a string makes the training batch's prev_rewards an object
    array whose zero rows differ from RLlib's on the Python path too: left
    to the build's own tests.)"""
    twins = Twins(cartpole_views, is_training=True)
    for i in range(6):
        twins.step(sampler_step(i), label=f"step {i}")
    twins.step(sampler_step(6, rewards=odd), label="odd reward")
    twins.step(sampler_step(7, new_obs=[0.5, 0.25, 0.0, 1.0]), label="list observation")
    twins.step(sampler_step(8, new_obs=np.zeros(4)), label="float64 observation")
    for i in range(9, 11):
        twins.step(sampler_step(i), label=f"step {i}")
    # The first step, and the one after the odd reward: its track left the
    # typed path, so its leading rows were put back as they were (a change
    # of state the next step's layout is decided after).
    assert [step["t"] for step in python_steps] == [0, 7]
    twins.train()


def test_bad_steps_raise_rllibs_errors_and_keep_the_rows(python_steps):
    """On the compiled path's layout: an "obs" key, a missing "new_obs", a
    wrong eps_id raise what RLlib raises, before anything is stored."""
    twins = Twins(cartpole_views, is_training=True)
    for i in range(5):
        twins.step(sampler_step(i), label=f"step {i}")
    before = _rows(twins.ours)
    bad = [sampler_step(5, obs=np.zeros(4, np.float32)),
           sampler_step(5, new_obs=_DROP),
           sampler_step(5, eps_id=4)]
    for values in bad:
        assert twins.raises(values) in (AssertionError, KeyError)
        compare(_rows(twins.ours), before, "the rows after a bad step")
    twins.step(sampler_step(5), label="after the bad steps")
    twins.train()


def test_too_few_leaves_raise_and_keep_the_earlier_rows(python_steps):
    """A Dict observation of one leaf too few for the tracks: IndexError, as
    on the Python path (RLlib fails on the same index); no row stored before
    is lost."""
    twins = Twins(_struct_views, init_obs=_struct_obs(0), is_training=True)
    for i in range(4):
        twins.step(_struct_step(i), label=f"step {i}")
    before = _rows(twins.ours)
    short = {"b": np.zeros(2, np.float32), "a": (1,)}
    assert twins.raises(_struct_step(4, new_obs=short)) is IndexError
    for key, tracks in _rows(twins.ours).items():
        for i, (track, old) in enumerate(zip(tracks, before[key])):
            compare(track[:len(old)], old, f"{key}[{i}]")


def test_state_outs_keep_their_placeholder_row_last(python_steps):
    """Recurrent inference: the state_out track ends with a placeholder row
    (for the state_in view) that each step's row goes in front of."""
    def views(VR):
        return {"obs": VR(space=BOX),
                "state_in_0": VR("state_out_0", shift=-1,
                                 space=gym.spaces.Box(-1, 1, (2,), np.float32)),
                "state_out_0": VR(space=gym.spaces.Box(-1, 1, (2,), np.float32),
                                  used_for_compute_actions=False)}

    twins = Twins(views, is_training=False, is_policy_recurrent=True,
                  intial_states=[np.zeros(2, np.float32)])
    twins.infer("after the reset")
    for i in range(6):
        twins.step({"new_obs": np.full(4, i, np.float32), "actions": 1, "rewards": 1.0,
                    "terminateds": False, "truncateds": False,
                    "state_out_0": np.full(2, i / 10, np.float32)}, label=f"step {i}")
    assert len(python_steps) == 1


def test_replaced_columns_and_tracks_are_seen(python_steps):
    """A column's list or one of its tracks replaced from outside: the next
    step goes where the collector's buffers now point."""
    twins = Twins(cartpole_views, is_training=True)
    for i in range(4):
        twins.step(sampler_step(i), infer=False)
    taken = len(python_steps)
    for side in twins.sides:
        side.buffers["obs"] = copy.deepcopy(side.buffers["obs"])
    twins.step(sampler_step(4), label="new list")
    for side in twins.sides:
        side.buffers["rewards"][0] = copy.deepcopy(side.buffers["rewards"][0])
    twins.step(sampler_step(5), label="new track")
    assert len(python_steps) == taken + 2
    np.testing.assert_array_equal(twins.ours.buffers["obs"][0].get(-1), sampler_step(5)["new_obs"])
    assert twins.ours.buffers["rewards"][0].get(-1) == 5.5
    twins.train()


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copies_take_steps_of_their_own(how, python_steps):
    """A copy made after compiled steps starts without the layout (one
    Python-path step), and the original's tracks never see its rows."""
    twins = Twins(cartpole_views, is_training=False)
    for i in range(6):
        twins.step(sampler_step(i))
    ours = twins.ours
    clone = pickle.loads(pickle.dumps(ours)) if how == "pickle" else copy.deepcopy(ours)
    assert not clone._has_layout and ours._has_layout
    before = _rows(ours)
    taken = len(python_steps)
    for i in range(6, 9):
        clone.add_action_reward_next_obs(sampler_step(i))
    assert len(python_steps) == taken + 1
    compare(_rows(ours), before, "the original after the copy's steps")
    twins.step(sampler_step(6))
    np.testing.assert_array_equal(clone.build_for_inference()["obs"],
                                  sampler_step(8)["new_obs"][None])


class _Shrinking(collections.abc.Sequence):
    """A sequence observation that empties the collector's obs tracks as it
    is read (Python code run in the middle of a step)."""

    def __init__(self, collector):
        self.collector = collector

    def __len__(self):
        return 1

    def __getitem__(self, i):
        if i:
            raise IndexError(i)
        self.collector.buffers["obs"].clear()
        return np.zeros(4, np.float32)


def test_a_step_whose_values_change_the_tracks_is_checked_again(python_steps):
    """Reading a step's values may run Python code that changes the tracks:
    the compiled path checks them again before any append, and leaves such
    a step to the Python path."""
    collector = AgentCollector(cartpole_views(ViewRequirement), is_training=True)
    collector.add_init_obs(episode_id=0, agent_index=0, env_id=0,
                           init_obs=np.zeros(4, np.float32))
    for i in range(3):
        collector.add_action_reward_next_obs(sampler_step(i))
    assert collector._has_layout
    taken = len(python_steps)
    lengths = {key: len(tracks[0]) for key, tracks in collector.buffers.items()}
    collector.add_action_reward_next_obs(sampler_step(3, new_obs=_Shrinking(collector)))
    assert len(python_steps) == taken + 1
    assert collector.buffers["obs"] == []
    del lengths["obs"]
    assert {key: len(collector.buffers[key][0]) for key in lengths} == {
        key: n + 1 for key, n in lengths.items()}


@pytest.mark.parametrize("junk", ["not a column", None, [1.0, 2.0]])
def test_a_track_that_is_not_a_column_raises(junk):
    """Garbage put in a collector's buffers from outside: the step and the
    inference input raise a Python exception, never read it as a Column."""
    collector = AgentCollector(cartpole_views(ViewRequirement), is_training=False)
    collector.add_init_obs(episode_id=0, agent_index=0, env_id=0,
                           init_obs=np.zeros(4, np.float32))
    for i in range(6):
        collector.add_action_reward_next_obs(sampler_step(i))
        collector.build_for_inference()
    collector.buffers["obs"][0] = junk
    with pytest.raises(TypeError):
        collector.build_for_inference()
    with pytest.raises((TypeError, AttributeError)):
        collector.add_action_reward_next_obs(sampler_step(6))


@pytest.mark.parametrize("junk", [None, ["obs"], "buffers", 5])
def test_buffers_replaced_by_junk_raise_rllibs_error(junk):
    """A collector's buffers replaced from outside by what is not a dict:
    the inference input and the step raise the class RLlib raises."""
    twins = Twins(cartpole_views, is_training=False)
    for i in range(6):
        twins.step(sampler_step(i))
    for side in twins.sides:
        side.buffers = junk
    twins.raises(sampler_step(6))
    raised = []
    for side in twins.sides:
        with pytest.raises(Exception) as info:
            side.build_for_inference()
        raised.append(type(info.value))
    assert raised[0] is raised[1], raised


def test_batches_are_made_only_as_dicts():
    """The inference answer writes its columns into the batch as into a dict:
    a batch class that is not a dict is refused when the maker is made."""
    from episode._collect import BatchMaker

    class NotADict:
        pass

    with pytest.raises(TypeError):
        BatchMaker(NotADict, NotADict())
    with pytest.raises(TypeError):
        BatchMaker(len, NotADict())


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("odd", [np.zeros(3, np.float32), np.zeros((2, 4), np.float32), "str",
                                 None, 1.5, [1, 2, 3, 4], np.zeros(4, np.int64)])
def test_an_observation_of_another_shape_after_the_plan(odd, training):
    """Once the step layout and the inference plan are made, a next
    observation of another shape or kind: the step is taken as RLlib takes
    it, and the inference input (and the training batch) is RLlib's batch
    or raises RLlib's class."""
    twins = Twins(cartpole_views, is_training=training)
    for i in range(6):
        twins.step(sampler_step(i), label=f"step {i}")
    for side in twins.sides:
        side.add_action_reward_next_obs(sampler_step(6, new_obs=copy.deepcopy(odd)))
    builds = [("inference", lambda side: side.build_for_inference())]
    if training:
        builds.append(("training",
                       lambda side: side.build_for_training(side.view_requirements)))
    for label, build in builds:
        outcomes = []
        for side in twins.sides:
            try:
                outcomes.append(build(side))
            except Exception as e:  # noqa: BLE001 - the class is compared
                outcomes.append(type(e))
        theirs, ours = outcomes
        if isinstance(theirs, type):
            assert ours is theirs, label
        else:
            compare_batches(ours, theirs, f"{label} after the odd step")


@pytest.mark.parametrize("reward", [None, "x", "a longer one", 1.5, np.float64(2.0), 3,
                                    np.array(0.5, np.float32), True])
@pytest.mark.parametrize("steps", [1, 3])
def test_rewards_of_any_kind_gather_as_rllibs(reward, steps):
    """Each timestep's item stacked as RLlib's collector stacks it: a 0-d
    pad among objects gathers as numbers, strings fit the longest gathered
    (prev_rewards of a None or str reward were a 0-d array in an object
    array and '<U32' strings), and a string past the end pads as ''
    (it was '0')."""
    out = []
    for AC, VR in (OURS, RLLIB):
        views = {"obs": VR(), "rewards": VR(), "infos": VR(),
                 "prev_rewards": VR(data_col="rewards", shift=-1),
                 "next_infos": VR(data_col="infos", shift=1, used_for_compute_actions=False),
                 "next_id": VR(data_col="eps_id", shift=1, used_for_compute_actions=False)}
        collector = AC(views, max_seq_len=1, is_policy_recurrent=False, is_training=True)
        collector.add_init_obs(episode_id="an id", agent_index=0, env_id=0,
                               init_obs=np.zeros(2, np.float32), init_infos={"k": 0}, t=-1)
        for t in range(steps):
            collector.add_action_reward_next_obs({
                "t": t, "env_id": 0, "agent_index": 0, "rewards": reward,
                "new_obs": np.full(2, t, np.float32), "actions": 0, "terminateds": False,
                "truncateds": False, "infos": {"k": t + 1}})
        out.append(collector.build_for_training(views))
    compare_batches(out[0], out[1], f"reward {reward!r}")
