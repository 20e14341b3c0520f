"""RLlib's own buffers in our episodes: RLlib's replay buffers put an
InfiniteLookbackBuffer of theirs into the episodes they sample
(extra_model_outputs["n_step"], ["weights"]), whatever the episodes' class.
Ours take them over on first use (same state), and then behave as RLlib's
episode with the same buffer does."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from episode import InfiniteLookbackBuffer, SingleAgentEpisode
from difftools import compare, episode_state

pytestmark = pytest.mark.rllib

RB = pytest.importorskip("ray.rllib.env.utils.infinite_lookback_buffer").InfiniteLookbackBuffer
Theirs = pytest.importorskip("ray.rllib.env.single_agent_episode").SingleAgentEpisode


def _pair(numpy: bool, lookback: int):
    """Ours and RLlib's episode of 4 steps (`lookback` of them as lookback),
    each with RLlib's n_step and weights buffers put in as RLlib's replay
    buffer puts them."""
    pair = []
    for cls in (SingleAgentEpisode, Theirs):
        e = cls(id_="e", observations=[np.full(2, i, np.float32) for i in range(5)],
                actions=[0, 1, 0, 1],
                rewards=[1.0, 2.0, 3.0, 4.0], extra_model_outputs={"logp": [.1, .2, .3, .4]},
                len_lookback_buffer=lookback)
        if numpy:
            e.to_numpy()
        e.extra_model_outputs["n_step"] = RB(np.full((4,), 3), lookback=lookback)
        e.extra_model_outputs["weights"] = RB(np.ones((4,)), lookback=lookback)
        pair.append(e)
    return pair


@pytest.mark.parametrize("numpy", [False, True])
@pytest.mark.parametrize("lookback", [0, 1])
@pytest.mark.parametrize("call", [
    lambda e: e.get_extra_model_outputs("n_step"),
    lambda e: e.get_extra_model_outputs("n_step", -1),
    lambda e: e.get_extra_model_outputs("weights", slice(-3, None), neg_index_as_lookback=True,
                                        fill=0.0),
    lambda e: e.get_extra_model_outputs("n_step", [0, 1]),
    lambda e: len(e.extra_model_outputs["n_step"]),
    lambda e: e.extra_model_outputs["weights"].get(-1),
    lambda e: e.get_state()["extra_model_outputs"],
    lambda e: e.cut(1).extra_model_outputs["n_step"].get_state(),
    lambda e: e[1:3].get_extra_model_outputs("n_step"),
    lambda e: e.slice(slice(0, 2), len_lookback_buffer=0).get_extra_model_outputs("weights"),
    lambda e: e.to_numpy().get_extra_model_outputs("n_step"),
    lambda e: e.validate(),
    lambda e: sorted(e.get_data_dict()),
])
def test_rllib_buffers_in_our_episodes_read_as_in_rllib(numpy, lookback, call):
    ours, theirs = _pair(numpy, lookback)
    compare(call(ours), call(theirs))
    assert all(isinstance(b, InfiniteLookbackBuffer) for b in ours.extra_model_outputs.values())


@pytest.mark.parametrize("numpy", [False, True])
def test_steps_after_rllib_buffers_went_in(numpy):
    ours, theirs = _pair(numpy, 0)
    for e in (ours, theirs):
        e.add_env_step(np.full(2, 9, np.float32), 1, 5.0,
                       extra_model_outputs={"logp": .5, "n_step": 3, "weights": 1.0})
    compare(episode_state(ours), episode_state(theirs))
    back = pickle.loads(pickle.dumps(ours))
    compare(episode_state(back), episode_state(theirs))


def test_the_issue_example():
    e = SingleAgentEpisode(observations=[0, 1], actions=[0], rewards=[0.0], len_lookback_buffer=0)
    e.extra_model_outputs["n_step"] = RB(np.full((1,), 3))
    got = e.get_extra_model_outputs("n_step")
    assert isinstance(got, np.ndarray) and got.tolist() == [3]
