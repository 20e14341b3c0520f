"""The learner's side of a replayed batch: RLlib's default DQN/SAC learner
connector pipeline on episodes sampled from our buffers gives the same train
batch from the batch arrays (episode.rllib.learner) as RLlib's connectors do
item by item, and as RLlib's own buffer and episodes give for the same seed."""
from __future__ import annotations

import contextlib
import copy

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")
pytestmark = pytest.mark.rllib

from ray.rllib.algorithms.dqn import DQNConfig  # noqa: E402
from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (  # noqa: E402
    AddObservationsFromEpisodesToBatch)
from ray.rllib.connectors.learner.add_next_observations_from_episodes_to_train_batch import (  # noqa: E402,E501
    AddNextObservationsFromEpisodesToTrainBatch)
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode  # noqa: E402
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger  # noqa: E402
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (  # noqa: E402
    PrioritizedEpisodeReplayBuffer as TheirBuffer)

from episode import SingleAgentEpisode  # noqa: E402
from episode import replay  # noqa: E402
from episode.replay import draws  # noqa: E402
from episode.rllib.learner import learner_call, rllib_learner_call  # noqa: E402

OBS_SPACE = gym.spaces.Box(-5, 5, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


@pytest.fixture(scope="module")
def pipeline_and_module():
    config = DQNConfig().environment(observation_space=OBS_SPACE, action_space=ACTION_SPACE)
    pipeline = config.build_learner_connector(input_observation_space=OBS_SPACE,
                                              input_action_space=ACTION_SPACE)
    if not any(type(c) is AddNextObservationsFromEpisodesToTrainBatch
               for c in pipeline.connectors):
        # (As the algorithm's learners have it.)
        pipeline.insert_after(AddObservationsFromEpisodesToBatch,
                              AddNextObservationsFromEpisodesToTrainBatch())
    module = config.get_multi_rl_module_spec(env=None, spaces={
        "__env__": (OBS_SPACE, ACTION_SPACE),
        "default_policy": (OBS_SPACE, ACTION_SPACE)}).build()
    return pipeline, module


@contextlib.contextmanager
def _rllib_takes_ours():
    """RLlib's connectors tell single-agent episodes by class: while RLlib's
    own episodes are alive in this process (no install()), let them take
    ours where they ask."""
    import ray.rllib.connectors.connector_v2 as module

    theirs = module.SingleAgentEpisode
    module.SingleAgentEpisode = SingleAgentEpisode
    try:
        yield
    finally:
        module.SingleAgentEpisode = theirs


def _filled(buffer_cls, episode_cls, extras: bool):
    rng = np.random.default_rng(0)
    episodes = []
    for _ in range(20):
        n = int(rng.integers(5, 30))
        kwargs = {"extra_model_outputs": {"q": [float(x) for x in rng.normal(size=n)]}} \
            if extras else {}
        episodes.append(episode_cls(
            observations=[rng.normal(size=4).astype(np.float32) for _ in range(n + 1)],
            actions=[np.int32(rng.integers(2)) for _ in range(n)],
            rewards=[float(x) for x in rng.normal(size=n)], terminated=bool(rng.integers(2)),
            len_lookback_buffer=0, **kwargs).to_numpy())
    buffer = buffer_cls(capacity=1000, alpha=0.6)
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(7)
    return buffer


def _tensors(batch):
    return {module_id: {k: (str(v.dtype), tuple(v.shape), v.numpy().tolist())
                        for k, v in columns.items()}
            for module_id, columns in batch.items()}


@pytest.mark.parametrize("extras", [False, True])
def test_fast_path_builds_rllibs_batch(pipeline_and_module, extras):
    pipeline, module = pipeline_and_module
    ours = _filled(replay.PrioritizedEpisodeReplayBuffer, SingleAgentEpisode, extras)
    theirs = _filled(TheirBuffer, TheirEpisode, extras)
    kwargs = dict(num_items=32, n_step=3, beta=0.4, gamma=0.95,
                  include_extra_model_outputs=extras)
    our_episodes, their_episodes = ours.sample(**kwargs), theirs.sample(**kwargs)
    # RLlib's connectors on copies of our episodes (not the drawn ones: the
    # fast path only takes those), on RLlib's own episodes, and the fast path.
    copies = copy.deepcopy(our_episodes)
    slow_shared, their_shared, fast_shared = {}, {}, {}
    with _rllib_takes_ours():
        slow = rllib_learner_call(pipeline, rl_module=module, batch={}, episodes=copies,
                                  shared_data=slow_shared, metrics=MetricsLogger())
    rllibs = rllib_learner_call(pipeline, rl_module=module, batch={}, episodes=their_episodes,
                                shared_data=their_shared, metrics=MetricsLogger())
    calls = []
    original = draws.replayed_columns

    def counting(episodes):
        result = original(episodes)
        calls.append(result is not None)
        return result

    metrics = MetricsLogger()
    replay_module = __import__("episode.rllib.learner", fromlist=["x"])
    replay_module.replayed_columns = counting
    try:
        fast = learner_call(pipeline, rl_module=module, batch={}, episodes=our_episodes,
                            shared_data=fast_shared, metrics=metrics)
    finally:
        replay_module.replayed_columns = original
    assert calls == [True]
    assert list(fast) == list(slow) == ["default_policy"]
    assert list(fast["default_policy"]) == list(slow["default_policy"])
    assert _tensors(fast) == _tensors(slow)
    # RLlib's buffer with the same seed drew the same transitions.
    assert _tensors(fast) == _tensors(rllibs)
    assert [e.id_ for e in our_episodes] == [e.id_ for e in copies]
    assert fast_shared == slow_shared
    reduced = metrics.reduce()
    assert reduced["__all_modules__"]["learner_connector"]["timers"]["connectors"].keys() == {
        "add_observations_from_episodes_to_batch",
        "add_next_observations_from_episodes_to_train_batch",
        "add_columns_from_episodes_to_train_batch", "add_time_dim_to_batch_and_zero_pad",
        "add_states_from_episodes_to_batch", "batch_individual_items", "numpy_to_tensor"}


def test_changed_episodes(pipeline_and_module):
    """A value set in a drawn episode is in the batch (the episodes read the
    batch arrays in place); an episode list that is not the one drawn goes
    through RLlib's connectors."""
    pipeline, module = pipeline_and_module
    ours = _filled(replay.PrioritizedEpisodeReplayBuffer, SingleAgentEpisode, False)
    episodes = ours.sample(num_items=8, n_step=2, beta=0.4)
    episodes[3].set_rewards(new_data=np.float64(123.0), at_indices=0)    # in place
    assert draws.replayed_columns(episodes) is not None
    episodes[4].set_rewards(new_data=7.0, at_indices=0)    # a Python float: a list now
    assert draws.replayed_columns(episodes) is None
    mixed = list(episodes)
    mixed[5] = copy.deepcopy(mixed[5])
    assert draws.replayed_columns(mixed) is None
    assert draws.replayed_columns(episodes[:-1]) is None
    with _rllib_takes_ours():
        for batch in (episodes, mixed):
            copies = copy.deepcopy(batch)
            fast = learner_call(pipeline, rl_module=module, batch={}, episodes=batch,
                                shared_data={}, metrics=None)
            slow = rllib_learner_call(pipeline, rl_module=module, batch={}, episodes=copies,
                                      shared_data={}, metrics=None)
            assert _tensors(fast) == _tensors(slow)
            assert fast["default_policy"]["rewards"][3].item() == 123.0
