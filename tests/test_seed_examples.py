"""The code examples of the seed pages (RLlib's Episodes documentation), run against our episode.

Each example runs as printed on its page, except the import line, which
imports our class (`from episode import SingleAgentEpisode` or
`from episode.single_agent_episode import SingleAgentEpisode`). Where a
comment on the page states an expected value, the test asserts it, with the
exact type a non-numpy'ized episode returns (list / Python scalar).

Where a page's comment disagrees with what RLlib 2.60 really does, the test
asserts RLlib's behaviour and says so; `test_examples_hold_for_rllib` runs
every example once more with RLlib's own class in place of ours, so that all
the expectations here are RLlib's, not merely ours.

Pages:
  000 (the "Episodes" page source): its two code blocks are `literalinclude`s
      of the sections 01 and 02 of RLlib's doc_code/sa_episode.py, which page
      001 shows rendered: `test_create_and_fill_episode`, `test_getter_apis`.
  001 (the rendered "Episodes" page): every code block below.
  002 get_rewards API page, 003 get_observations API page: their examples and
      the examples given in their parameter descriptions.
  004 (old API stack "Sample Collections and Trajectory Views"): no
      SingleAgentEpisode code; its snippets are ModelV2/RolloutWorker
      fragments (not runnable as printed), so none of it is tested here.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

try:  # The pages compare with RLlib's `check`; without ray, a strict stand-in.
    from ray.rllib.utils.test_utils import check
except ImportError:  # CI's run without ray (.ci/run, newest gymnasium and numpy)

    def check(x, y):
        if isinstance(x, dict):
            assert isinstance(y, dict) and set(x) == set(y)
            for k in x:
                check(x[k], y[k])
        elif isinstance(x, (list, tuple)):
            assert isinstance(y, (list, tuple)) and len(x) == len(y)
            for a, b in zip(x, y):
                check(a, b)
        else:
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype.kind in "biufc" and y.dtype.kind in "biufc":
                np.testing.assert_array_almost_equal(x, y, decimal=5)
            else:   # strings and objects: no tolerance to apply
                np.testing.assert_array_equal(x, y)


# -- page 001 (and 000): "Creating a SingleAgentEpisode" ---------------------------


def make_example_episode():
    """The page's first example, as printed (import line changed)."""
    from episode.single_agent_episode import SingleAgentEpisode

    # Construct a new episode (without any data in it yet).
    episode = SingleAgentEpisode()
    assert len(episode) == 0

    episode.add_env_reset(observation="obs_0", infos="info_0")
    # Even with the initial obs/infos, the episode is still considered len=0.
    assert len(episode) == 0

    # Fill the episode with some fake data (5 timesteps).
    for i in range(5):
        episode.add_env_step(
            observation=f"obs_{i+1}",
            action=f"act_{i}",
            reward=f"rew_{i}",
            terminated=False,
            truncated=False,
            infos=f"info_{i+1}",
        )
    assert len(episode) == 5
    return episode


def test_create_and_fill_episode():
    episode = make_example_episode()
    # What the figure shows: one more observation than actions and rewards.
    assert episode.get_observations() == [f"obs_{i}" for i in range(6)]
    assert episode.get_actions() == [f"act_{i}" for i in range(5)]
    assert episode.get_rewards() == [f"rew_{i}" for i in range(5)]
    assert episode.get_infos() == [f"info_{i}" for i in range(6)]
    assert episode.t == 5 and episode.t_started == 0
    assert episode.is_terminated is False and episode.is_truncated is False
    assert isinstance(episode.id_, str) and len(episode.id_) == 32
    int(episode.id_, 16)  # "generates a unique hexadecimal code"
    assert make_example_episode().id_ != episode.id_


def test_getter_apis():
    episode = make_example_episode()
    # -- the page's code block, as printed ---------------------------------
    # We can now access information from the episode via its getter APIs.

    # Get the very first observation ("reset observation"). Note that a single observation
    # is returned here (not a list of size 1 or a batch of size 1).
    check(episode.get_observations(0), "obs_0")
    # ... which is the same as using the indexing operator on the Episode's
    # `observations` property:
    check(episode.observations[0], "obs_0")

    # You can also get several observations at once by providing a list of indices:
    check(episode.get_observations([1, 2]), ["obs_1", "obs_2"])
    # .. or a slice of observations by providing a python slice object:
    check(episode.get_observations(slice(1, 3)), ["obs_1", "obs_2"])

    # Note that when passing only a single index, a single item is returned.
    # Whereas when passing a list of indices or a slice, a list of items is returned.

    # Similarly for getting rewards:
    # Get the last reward.
    check(episode.get_rewards(-1), "rew_4")
    # ... which is the same as using the slice operator on the `rewards` property:
    check(episode.rewards[-1], "rew_4")

    # Similarly for getting actions:
    # Get the first action in the episode (single item, not batched).
    # This works regardless of the action space.
    check(episode.get_actions(0), "act_0")
    # ... which is the same as using the indexing operator on the `actions` property:
    check(episode.actions[0], "act_0")

    # Finally, you can slice the entire episode using the []-operator with a slice notation:
    sliced_episode = episode[3:4]
    check(list(sliced_episode.observations), ["obs_3", "obs_4"])
    check(list(sliced_episode.actions), ["act_3"])
    check(list(sliced_episode.rewards), ["rew_3"])
    # -- end of the page's code ---------------------------------------------
    # "a single item ... a list of items": the exact types, not just values.
    assert type(episode.get_observations(0)) is str
    assert type(episode.get_observations([1, 2])) is list
    assert type(episode.get_observations(slice(1, 3))) is list
    assert len(sliced_episode) == 1 and sliced_episode.t_started == 3
    assert sliced_episode.id_ == episode.id_


def test_numpy_and_non_numpy_episodes():
    episode = make_example_episode()
    # Episodes start in the non-numpy'ized state (in which data is stored
    # under the hood in lists).
    assert episode.is_numpy is False

    # Call `to_numpy()` to convert all stored data from lists of individual (possibly
    # complex) items to numpy arrays. Note that RLlib normally performs this method call,
    # so users don't need to call `to_numpy()` themselves.
    episode.to_numpy()
    assert episode.is_numpy is True
    # Data now numpy arrays with a batch axis; infos stay a list.
    obs = episode.get_observations()
    assert isinstance(obs, np.ndarray) and obs.shape == (6,)
    assert obs.tolist() == [f"obs_{i}" for i in range(6)]
    assert isinstance(episode.get_actions(slice(0, 2)), np.ndarray)
    assert episode.get_infos() == [f"info_{i}" for i in range(6)]


@pytest.mark.parametrize("numpy_first", [True, False], ids=["after-to_numpy", "list-mode"])
def test_cut_and_lookback(numpy_first):
    """Page order runs this block on the episode the previous block numpy'ized;
    RLlib's doc_code runs it on a non-numpy'ized copy. Both must work."""
    episode = make_example_episode()
    if numpy_first:
        episode.to_numpy()
    # An ongoing episode (of length 5):
    assert len(episode) == 5
    assert episode.is_done is False

    # During an `EnvRunner.sample()` rollout, when enough data has been collected into
    # one or more Episodes, the `EnvRunner` calls the `cut()` method, interrupting
    # the ongoing Episode and returning a new continuation chunk (with which the
    # `EnvRunner` can continue collecting data during the next call to `sample()`):
    continuation_episode = episode.cut()

    # The length is still 5, but the length of the continuation chunk is 0.
    assert len(episode) == 5
    assert len(continuation_episode) == 0

    # Thanks to the lookback buffer, we can still access the most recent observation
    # in the continuation chunk:
    check(continuation_episode.get_observations(-1), "obs_5")
    # The continuation goes on where the episode stopped.
    assert continuation_episode.id_ == episode.id_
    assert continuation_episode.t_started == continuation_episode.t == 5


@pytest.mark.parametrize("numpy_first", [False, True], ids=["list-mode", "after-to_numpy"])
def test_default_lookback_horizon_of_one(numpy_first):
    """The page: with a lookback of 1 after a cut "you can still access the most
    recent action (get_actions(-1)), the most recent reward (get_rewards(-1)),
    and the two most recent observations (get_observations([-2, -1]))"."""
    episode = make_example_episode()
    if numpy_first:
        episode.to_numpy()
    chunk = episode.cut(len_lookback_buffer=1)
    assert len(chunk) == 0
    check(chunk.get_actions(-1), "act_4")
    check(chunk.get_rewards(-1), "rew_4")
    check(chunk.get_observations([-2, -1]), ["obs_4", "obs_5"])
    # Nothing further back than that (numpy'ized, RLlib wraps around instead: a
    # deliberate difference of the lookback buffer).
    if not numpy_first:
        with pytest.raises(IndexError):
            chunk.get_actions(-2, neg_index_as_lookback=True)


@pytest.mark.rllib
def test_lookback_horizon_config_example():
    """The page's AlgorithmConfig block (RLlib's config, not an episode API)."""
    AlgorithmConfig = pytest.importorskip(
        "ray.rllib.algorithms.algorithm_config").AlgorithmConfig
    config = AlgorithmConfig()
    assert config.episode_lookback_horizon == 1  # "The default lookback horizon (H) is 1"
    # Change the lookback horizon setting, in case your connector (pipelines) need
    # to access data further in the past.
    config.env_runners(episode_lookback_horizon=10)
    assert config.episode_lookback_horizon == 10


def test_lookback_buffers_and_fill():
    from episode import SingleAgentEpisode

    # Construct a new episode (with some data in its lookback buffer).
    episode = SingleAgentEpisode(
        observations=["o0", "o1", "o2", "o3"],
        actions=["a0", "a1", "a2"],
        rewards=[0.0, 1.0, 2.0],
        len_lookback_buffer=3,
    )
    # Since our lookback buffer is 3, all data already specified in the constructor should
    # now be in the lookback buffer (and not be part of the `episode` chunk), meaning
    # the length of `episode` should still be 0.
    assert len(episode) == 0

    # .. and trying to get the first reward will hence lead to an IndexError.
    try:
        episode.get_rewards(0)
    except IndexError:
        pass
    else:
        pytest.fail("get_rewards(0) on an episode of length 0 must raise IndexError")

    # Get the last 3 rewards (using the lookback buffer).
    check(episode.get_rewards(slice(-3, None)), [0.0, 1.0, 2.0])

    # Assuming the episode actually started with `obs_0` (reset obs),
    # then `obs_1` + `act_0` + reward=0.0, but your model always requires a 1D reward tensor
    # of shape (5,) with the 5 most recent rewards in it.
    # You could try to code for this by manually filling the missing 2 timesteps with zeros:
    last_5_rewards = [0.0, 0.0] + episode.get_rewards(slice(-3, None))
    # However, this will become extremely tedious, especially when moving to (possibly more
    # complex) observations and actions.
    assert last_5_rewards == [0.0, 0.0, 0.0, 1.0, 2.0]

    # Instead, `SingleAgentEpisode` getters offer some useful options to solve this problem:
    last_5_rewards = episode.get_rewards(slice(-5, None), fill=0.0)
    # Note that the `fill` argument allows you to even go further back into the past, provided
    # you are ok with filling timesteps that are not covered by the lookback buffer with
    # a fixed value.
    assert last_5_rewards == [0.0, 0.0, 0.0, 1.0, 2.0] and type(last_5_rewards) is list
    # The constructor's data all went into the lookback buffer.
    assert episode.t_started == episode.t == 0
    assert episode.get_observations(-1) == "o3"  # -1 counts from the end


def test_neg_index_as_lookback_loop(capsys):
    from episode import SingleAgentEpisode

    # Construct a new episode (len=3 and lookback buffer=3).
    episode = SingleAgentEpisode(
        observations=[
            "o-3",
            "o-2",
            "o-1",  # <- lookback  # noqa
            "o0",
            "o1",
            "o2",
            "o3",  # <- actual episode data  # noqa
        ],
        actions=[
            "a-3",
            "a-2",
            "a-1",  # <- lookback  # noqa
            "a0",
            "a1",
            "a2",  # <- actual episode data  # noqa
        ],
        rewards=[
            -3.0,
            -2.0,
            -1.0,  # <- lookback  # noqa
            0.0,
            1.0,
            2.0,  # <- actual episode data  # noqa
        ],
        len_lookback_buffer=3,
    )
    assert len(episode) == 3

    # In case you want to loop through global timesteps 0 to 2 (timesteps -3, -2, and -1
    # being the lookback buffer) and at each such global timestep look 2 timesteps back,
    # you can do so easily using the `neg_index_as_lookback` arg like so:
    for global_ts in [0, 1, 2]:
        rewards = episode.get_rewards(
            slice(global_ts - 2, global_ts + 1),
            # Switch behavior of negative indices from "from-the-end" to
            # "into the lookback buffer":
            neg_index_as_lookback=True,
        )
        print(rewards)

    # The expected output should be:
    # [-2.0, -1.0, 0.0]  # global ts=0 (plus looking back 2 ts)
    # [-1.0, 0.0, 1.0]   # global ts=1 (plus looking back 2 ts)
    # [0.0, 1.0, 2.0]    # global ts=2 (plus looking back 2 ts)
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["[-2.0, -1.0, 0.0]", "[-1.0, 0.0, 1.0]", "[0.0, 1.0, 2.0]"]
    # The observations line up the same way ("o0" is ts 0).
    assert episode.get_observations(slice(-2, 1), neg_index_as_lookback=True) == \
        ["o-2", "o-1", "o0"]
    assert episode.get_actions(-1, neg_index_as_lookback=True) == "a-1"


# -- page 002: get_rewards --------------------------------------------------------


def test_get_rewards_examples():
    from episode.single_agent_episode import SingleAgentEpisode

    episode = SingleAgentEpisode(
        rewards=[1.0, 2.0, 3.0],
        observations=[0, 1, 2, 3], actions=[1, 2, 3],  # <- not relevant here
        len_lookback_buffer=0,  # no lookback; all data is actually "in" episode
    )
    # Plain usage (`indices` arg only).
    assert episode.get_rewards(-1) == 3.0  # 3.0
    assert episode.get_rewards(0) == 1.0  # 1.0
    assert episode.get_rewards([0, 2]) == [1.0, 3.0]  # [1.0, 3.0]
    assert episode.get_rewards([-1, 0]) == [3.0, 1.0]  # [3.0, 1.0]
    assert episode.get_rewards(slice(None, 2)) == [1.0, 2.0]  # [1.0, 2.0]
    assert episode.get_rewards(slice(-2, None)) == [2.0, 3.0]  # [2.0, 3.0]
    # Using `fill=...` (requesting slices beyond the boundaries).
    # The page's comment says [0.0, 0.0, 1.0, 2.0]; RLlib 2.60 returns three
    # values: slice(-5, -2) of 3 rewards spans positions -2..0 (stop -2 is 3-2=1),
    # two fills and rewards[0:1].
    assert episode.get_rewards(slice(-5, -2), fill=0.0) == [0.0, 0.0, 1.0]
    assert episode.get_rewards(slice(1, 5), fill=0.0) == [2.0, 3.0, 0.0, 0.0]
    # "A single item ... if indices is a single int", a batch otherwise.
    assert type(episode.get_rewards(0)) is float
    assert type(episode.get_rewards([0])) is list and episode.get_rewards([0]) == [1.0]


def test_get_rewards_parameter_examples():
    from episode import SingleAgentEpisode

    # "rewards [4, 5, 6, 7, 8, 9], where [4, 5, 6] is the lookback buffer range
    # (ts=0 item is 7)"
    episode = SingleAgentEpisode(
        observations=list(range(7)), actions=list(range(6)),
        rewards=[4, 5, 6, 7, 8, 9], len_lookback_buffer=3,
    )
    assert episode.get_rewards(0) == 7
    assert episode.get_rewards(-1, neg_index_as_lookback=True) == 6
    assert episode.get_rewards(slice(-2, 1), neg_index_as_lookback=True) == [5, 6, 7]
    # "rewards [10, 11, 12, 13, 14] and lookback buffer size of 2"
    episode = SingleAgentEpisode(
        observations=list(range(6)), actions=list(range(5)),
        rewards=[10, 11, 12, 13, 14], len_lookback_buffer=2,
    )
    assert episode.get_rewards(slice(-7, -2), fill=0.0) == [0.0, 0.0, 10, 11, 12]


# -- page 003: get_observations -----------------------------------------------------


def test_get_observations_examples():
    import gymnasium as gym

    from episode.single_agent_episode import SingleAgentEpisode

    episode = SingleAgentEpisode(
        # Discrete(4) observations (ints between 0 and 4 (excl.))
        observation_space=gym.spaces.Discrete(4),
        observations=[0, 1, 2, 3],
        actions=[1, 2, 3], rewards=[1, 2, 3],  # <- not relevant for this demo
        len_lookback_buffer=0,  # no lookback; all data is actually "in" episode
    )
    # Plain usage (`indices` arg only).
    check(episode.get_observations(-1), 3)
    check(episode.get_observations(0), 0)
    check(episode.get_observations([0, 2]), [0, 2])
    check(episode.get_observations([-1, 0]), [3, 0])
    check(episode.get_observations(slice(None, 2)), [0, 1])
    check(episode.get_observations(slice(-2, None)), [2, 3])
    # Using `fill=...` (requesting slices beyond the boundaries).
    check(episode.get_observations(slice(-6, -2), fill=-9), [-9, -9, 0, 1])
    check(episode.get_observations(slice(2, 5), fill=-7), [2, 3, -7])
    # Using `one_hot_discrete=True`.
    check(episode.get_observations(2, one_hot_discrete=True), [0, 0, 1, 0])
    check(episode.get_observations(3, one_hot_discrete=True), [0, 0, 0, 1])
    check(episode.get_observations(
        slice(0, 3),
        one_hot_discrete=True,
    ), [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])
    # Special case: Using `fill=0.0` AND `one_hot_discrete=True`.
    check(episode.get_observations(
        -1,
        neg_index_as_lookback=True,  # -1 means one left of ts=0
        fill=0.0,
        one_hot_discrete=True,
    ), [0, 0, 0, 0])  # <- all 0s one-hot tensor (note difference to [1 0 0 0]!)

    # `check` does not look at types; the exact values and types:
    assert episode.get_observations(-1) == 3 and type(episode.get_observations(-1)) is int
    assert episode.get_observations([-1, 0]) == [3, 0]
    assert episode.get_observations(slice(-6, -2), fill=-9) == [-9, -9, 0, 1]
    assert episode.get_observations(slice(2, 5), fill=-7) == [2, 3, -7]
    hot = episode.get_observations(2, one_hot_discrete=True)
    assert isinstance(hot, np.ndarray) and hot.dtype == np.float32
    assert hot.tolist() == [0.0, 0.0, 1.0, 0.0]
    rows = episode.get_observations(slice(0, 3), one_hot_discrete=True)
    assert [np.asarray(r).tolist() for r in rows] == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    zero_hot = episode.get_observations(-1, neg_index_as_lookback=True, fill=0.0,
                                        one_hot_discrete=True)
    assert np.asarray(zero_hot).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_get_observations_parameter_examples():
    from episode import SingleAgentEpisode

    # "observations [4, 5, 6, 7, 8, 9], where [4, 5, 6] is the lookback buffer
    # range (ts=0 item is 7)"
    episode = SingleAgentEpisode(
        observations=[4, 5, 6, 7, 8, 9], actions=list(range(5)), rewards=[0.0] * 5,
        len_lookback_buffer=3,
    )
    assert episode.get_observations(0) == 7
    assert episode.get_observations(-1, neg_index_as_lookback=True) == 6
    assert episode.get_observations(slice(-2, 1), neg_index_as_lookback=True) == [5, 6, 7]
    # "observations [10, 11, 12, 13, 14] and lookback buffer size of 2"
    episode = SingleAgentEpisode(
        observations=[10, 11, 12, 13, 14], actions=list(range(4)), rewards=[0.0] * 4,
        len_lookback_buffer=2,
    )
    assert episode.get_observations(slice(-7, -2), fill=0.0) == [0.0, 0.0, 10, 11, 12]


# -- all of the above once more with RLlib's class in place of ours ------------------

EXAMPLES = [
    test_create_and_fill_episode,
    test_getter_apis,
    test_numpy_and_non_numpy_episodes,
    lambda: test_cut_and_lookback(True),
    lambda: test_cut_and_lookback(False),
    lambda: test_default_lookback_horizon_of_one(False),
    lambda: test_default_lookback_horizon_of_one(True),
    test_lookback_buffers_and_fill,
    test_get_rewards_examples,
    test_get_rewards_parameter_examples,
    test_get_observations_examples,
    test_get_observations_parameter_examples,
]


@pytest.mark.rllib
@pytest.mark.parametrize("example", range(len(EXAMPLES)))
def test_examples_hold_for_rllib(example, monkeypatch):
    """Every expectation above is RLlib 2.60's behaviour, too."""
    rllib_cls = pytest.importorskip("ray.rllib.env.single_agent_episode").SingleAgentEpisode
    import episode
    import episode.single_agent_episode as module

    monkeypatch.setattr(episode, "SingleAgentEpisode", rllib_cls)
    monkeypatch.setattr(module, "SingleAgentEpisode", rllib_cls)
    EXAMPLES[example]()


@pytest.mark.rllib
def test_neg_index_loop_output_holds_for_rllib(capsys, monkeypatch):
    rllib_cls = pytest.importorskip("ray.rllib.env.single_agent_episode").SingleAgentEpisode
    import episode

    monkeypatch.setattr(episode, "SingleAgentEpisode", rllib_cls)
    test_neg_index_as_lookback_loop(capsys)


@pytest.mark.rllib
def test_rllib_get_rewards_fill_comment_is_wrong():
    """The page's comment for get_rewards(slice(-5, -2), fill=0.0) says four
    values; RLlib returns three."""
    rllib_cls = pytest.importorskip("ray.rllib.env.single_agent_episode").SingleAgentEpisode
    episode = rllib_cls(rewards=[1.0, 2.0, 3.0], observations=[0, 1, 2, 3],
                        actions=[1, 2, 3], len_lookback_buffer=0)
    assert episode.get_rewards(slice(-5, -2), fill=0.0) == [0.0, 0.0, 1.0]


def test_examples_use_our_class():
    """Guards the monkeypatching above: the examples really ran on ours."""
    from episode import SingleAgentEpisode

    assert SingleAgentEpisode.__module__.split(".")[0] == "episode"
    assert "episode.single_agent_episode" in sys.modules
