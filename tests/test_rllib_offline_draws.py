"""The offline prelearner's draw straight into the train batch
(OfflinePreLearner._drawn_train_batch, episode.rllib.learner.drawn_columns).

For RLlib's default learner pipeline (BC's, MARWIL's without GAE, CQL's),
a stateless module, one agent and our plain buffer, the prelearner adds the
episodes read to its buffer and gathers the train batch from the buffer's
rows, without making the drawn one-step episodes. Pinned here:

* the train batch is the one the episodes path gives (the buffer's
  sample() and the learner connectors), key by key, dtype, shape and value,
  for the same buffer seed, batch after batch (evictions, duplicate
  episodes), with n-step 1 and 3, a burn-in, both lookbacks, list-mode and
  numpy'ized recordings, episodes both terminated and truncated; the buffer
  is left as that path leaves it (its generator, counts, metrics);
* it is RLlib's own prelearner's train batch for the same draws;
* where it must not apply it does not, and the output is the episodes
  path's: a stateful module, a custom learner connector, a multi-agent
  config, a buffer class of the user's (or RLlib's), a prelearner subclass
  that adds or draws its own way, Dict observations.
"""
from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")
pytestmark = pytest.mark.rllib

import episode.rllib  # noqa: E402
from episode import SingleAgentEpisode  # noqa: E402
from episode.offline import rllib_format as F  # noqa: E402

CARTPOLE = gym.make("CartPole-v1")


@pytest.fixture(scope="module", autouse=True)
def installed():
    with episode.rllib.installed():
        yield


def _episodes(count, seed, *, numpy=False, both_flags=False, extras=False, env=CARTPOLE):
    """Random-action episodes of `env`, recorded as RLlib's runner records
    them (list mode unless `numpy`); with `both_flags` every other one ends
    terminated and truncated, and every third is truncated at step 8."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        obs, info = env.reset(seed=int(rng.integers(1 << 30)))
        ep = SingleAgentEpisode(observations=[obs], infos=[info],
                                observation_space=env.observation_space,
                                action_space=env.action_space)
        done = False
        while not done:
            action = env.action_space.sample()
            obs, reward, terminated, truncated, info = env.step(action)
            if both_flags and terminated and k % 2:
                truncated = True
            elif both_flags and k % 3 == 0 and len(ep) == 7:
                truncated = True
            ep.add_env_step(obs, action, float(reward), infos=info, terminated=terminated,
                            truncated=truncated,
                            extra_model_outputs={"vf": np.float32(reward)} if extras else None)
            done = terminated or truncated
        if numpy:
            ep.to_numpy()
        out.append(ep)
    return out


def _batches(episodes, size):
    """The episodes' packed states in batches as Ray Data hands them (a
    repeated episode in the later ones, which the prelearner drops)."""
    items = F.pack_episodes(episodes)
    batches = [items[i:i + size] for i in range(0, len(items), size)]
    for k in range(1, len(batches)):
        batches[k] = batches[k] + [items[k - 1]]
    return [{"item": np.array(b + [None], dtype=object)[:-1]} for b in batches]


def _config(*, batch=64, n_step=None, burnin=None, lookback=None, env=CARTPOLE, **offline):
    from ray.rllib.algorithms.bc import BCConfig

    config = (BCConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .training(train_batch_size_per_learner=batch)
              .offline_data(input_="unused", input_read_episodes=True,
                            dataset_num_iters_per_learner=1, **offline))
    if n_step is not None:
        config.n_step = n_step
    if burnin is not None:
        config.burnin_len = burnin
    if lookback is not None:
        config.episode_lookback_horizon = lookback
    return config


def _prelearner(config, cls=None, env=CARTPOLE, seed=0):
    from ray.rllib.env import INPUT_ENV_SPACES

    from episode.rllib.offline import OfflinePreLearner

    spaces = {INPUT_ENV_SPACES: (env.observation_space, env.action_space),
              "default_policy": (env.observation_space, env.action_space)}
    spec = config.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
    prelearner = (cls or OfflinePreLearner)(config=config, spaces=spaces[INPUT_ENV_SPACES],
                                            module_spec=spec)
    prelearner._buffer().rng = np.random.default_rng(seed)
    return prelearner


def _episodes_path_class():
    from episode.rllib.offline import OfflinePreLearner

    class EpisodesPath(OfflinePreLearner):
        """Draws through the buffer's sample() and the connectors (a
        subclass's own _sample_from_buffer turns the direct draw off)."""

        def _sample_from_buffer(self, episodes):
            return super()._sample_from_buffer(episodes)

    return EpisodesPath


def assert_same_batch(a, b):
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        assert type(x) is type(y) and x.dtype == y.dtype and tuple(x.shape) == tuple(y.shape), \
            key
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=key)


def assert_same_buffer(a, b):
    assert a.rng.bit_generator.state == b.rng.bit_generator.state
    assert a.sampled_timesteps == b.sampled_timesteps
    assert a.get_num_timesteps() == b.get_num_timesteps()
    assert a.get_num_episodes() == b.get_num_episodes()
    # (Stats objects compare by identity; their reprs show their values.)
    assert repr(a.get_metrics()) == repr(b.get_metrics())


@pytest.mark.parametrize("numpy", [False, True], ids=["list", "numpy"])
@pytest.mark.parametrize("n_step, burnin, lookback", [(None, None, None), (3, None, 0),
                                                       (1, 2, 1), (5, 1, None)])
def test_drawn_batch_is_the_episodes_paths(numpy, n_step, burnin, lookback, monkeypatch):
    episodes = _episodes(48, seed=1, numpy=numpy, both_flags=True, extras=True)
    config = _config(n_step=n_step, burnin=burnin, lookback=lookback)
    fast = _prelearner(config)
    slow = _prelearner(config, _episodes_path_class())
    assert fast._draws_train_batch() and not slow._draws_train_batch()
    # The direct draw makes no episodes: the buffer's sample() is not called.
    monkeypatch.setattr(type(fast._buffer()), "sample",
                        lambda *a, **k: pytest.fail("sample() called"), raising=True)
    outs = [fast(batch) for batch in _batches(episodes, 8)]
    monkeypatch.undo()
    expected = [slow(batch) for batch in _batches(episodes, 8)]
    for a, b in zip(outs, expected):
        assert_same_batch(a, b)
    assert_same_buffer(fast._buffer(), slow._buffer())
    # (The draws reached the ends of terminated and of truncated episodes;
    # a burn-in may keep them from the last steps.)
    for flag in ("terminateds", "truncateds"):
        reached = sum(int(out[f"default_policy/{flag}"].sum()) for out in outs)
        assert reached > 0 or burnin


def test_drawn_columns_are_the_replayed_episodes_columns():
    """drawn_columns against the columns of sample()'s episodes, on twin
    buffers: the same values and the same buffer state after."""
    from episode.replay import EpisodeReplayBuffer
    from episode.replay.draws import replayed_columns
    from episode.rllib.learner import drawn_columns

    episodes = _episodes(30, seed=2, both_flags=True)
    a, b = (EpisodeReplayBuffer(capacity=400, batch_size_B=32, seed=5) for _ in range(2))
    for k in range(0, 30, 6):
        a.add(copy.deepcopy(episodes[k:k + 6]))
        b.add(copy.deepcopy(episodes[k:k + 6]))
        for n_step, min_t in ((1, 0), (3, 0), (2, 3)):
            got = drawn_columns(a, 32, n_step, min_t)
            sampled = b.sample(num_items=32, n_step=n_step, sample_episodes=True,
                               to_numpy=True, lookback=1, min_batch_length_T=min_t)
            want = replayed_columns(sampled)
            assert list(got) == list(want)
            for key in want:
                assert got[key].dtype == want[key].dtype, key
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)
            assert_same_buffer(a, b)


def test_drawn_columns_decline_before_drawing():
    """None, with the buffer's generator untouched, where the direct draw
    does not apply."""
    from episode.replay import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer
    from episode.rllib.learner import drawn_columns

    class Mine(EpisodeReplayBuffer):
        pass

    episodes = _episodes(4, seed=3)
    for buffer, args in [(EpisodeReplayBuffer(capacity=100), (8, (1, 3))),
                         (EpisodeReplayBuffer(capacity=100), (8, 0)),
                         (EpisodeReplayBuffer(capacity=100), (8, 1, -1)),
                         (Mine(capacity=100), (8, 1)),
                         (PrioritizedEpisodeReplayBuffer(capacity=100), (8, 1))]:
        buffer.add(copy.deepcopy(episodes))
        state = copy.deepcopy(buffer.rng.bit_generator.state)
        assert drawn_columns(buffer, *args) is None
        assert buffer.rng.bit_generator.state == state
    assert drawn_columns(EpisodeReplayBuffer(capacity=100), 8, 1) is None   # empty


def test_drawn_batch_is_rllibs_train_batch(tmp_path):
    """One episode per batch (RLlib puts a batch's episodes in a set, whose
    order is its own): RLlib's prelearner (in a process of its own, on
    RLlib's classes) and ours draw the same transitions from equally seeded
    buffers and give the same train batch."""
    pytest.importorskip("msgpack_numpy")
    episodes = _episodes(6, seed=4)
    batches = _batches(episodes, 1)
    ours = _prelearner(_config(batch=32))
    assert ours._draws_train_batch()
    mine = [{k: v.numpy() for k, v in ours(batch).items()} for batch in batches]
    with open(tmp_path / "items.pkl", "wb") as f:
        pickle.dump([list(b["item"]) for b in batches], f)
    code = f"""
import logging, pickle, sys
logging.disable(logging.WARNING)
import gymnasium as gym, numpy as np
from ray.rllib.algorithms.bc import BCConfig
from ray.rllib.env import INPUT_ENV_SPACES
from ray.rllib.offline.offline_prelearner import OfflinePreLearner
env = gym.make("CartPole-v1")
config = (BCConfig().environment(observation_space=env.observation_space,
                                 action_space=env.action_space)
          .training(train_batch_size_per_learner=32)
          .offline_data(input_="unused", input_read_episodes=True,
                        dataset_num_iters_per_learner=1))
spaces = {{INPUT_ENV_SPACES: (env.observation_space, env.action_space),
          "default_policy": (env.observation_space, env.action_space)}}
spec = config.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
prelearner = OfflinePreLearner(config=config, spaces=spaces[INPUT_ENV_SPACES], module_spec=spec)
prelearner.episode_buffer.rng = np.random.default_rng(0)
items = pickle.load(open({str(tmp_path / "items.pkl")!r}, "rb"))
out = [{{k: v.numpy() for k, v in prelearner({{"item": np.array(b, dtype=object)}}).items()}}
       for b in items]
pickle.dump(out, open({str(tmp_path / "out.pkl")!r}, "wb"))
"""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "out.pkl", "rb") as f:
        theirs = pickle.load(f)
    for a, b in zip(mine, theirs):
        assert sorted(a) == sorted(b)
        for key in b:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# -- where it does not apply ----------------------------------------------------------------


def _same_as_episodes_path(config, episodes, env=CARTPOLE):
    ours = _prelearner(config, env=env)
    slow = _prelearner(config, _episodes_path_class(), env=env)
    for batch in _batches(episodes, 8):
        assert_same_batch(ours(batch), slow(batch))
    return ours


def test_not_for_a_stateful_module():
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    config = _config(batch=16).rl_module(
        model_config=DefaultModelConfig(use_lstm=True, max_seq_len=4))
    ours = _same_as_episodes_path(config, _episodes(12, seed=5))
    assert ours._module.is_stateful() and not ours._draws_train_batch()


def test_not_for_a_custom_learner_connector():
    from ray.rllib.connectors.connector_v2 import ConnectorV2

    class Tag(ConnectorV2):
        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            return batch

    config = _config().training(learner_connector=lambda *spaces: Tag())
    ours = _same_as_episodes_path(config, _episodes(12, seed=6))
    assert not ours._draws_train_batch()


def test_not_for_a_multi_agent_config():
    from ray.rllib.env import INPUT_ENV_SPACES

    from episode.rllib.offline import OfflinePreLearner

    config = _config().multi_agent(policies={"p0", "p1"},
                                   policy_mapping_fn=lambda aid, *a, **k: "p0")
    pair = (CARTPOLE.observation_space, CARTPOLE.action_space)
    agents = tuple(gym.spaces.Dict({0: space, 1: space}) for space in pair)
    spaces = {INPUT_ENV_SPACES: agents, "p0": pair, "p1": pair}
    spec = config.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
    ours = OfflinePreLearner(config=config, spaces=agents, module_spec=spec)
    assert config.is_multi_agent and not ours._draws_train_batch()


def test_not_for_another_buffer_class():
    from episode.replay import EpisodeReplayBuffer

    class Mine(EpisodeReplayBuffer):
        pass

    config = _config(prelearner_buffer_class=Mine)
    ours = _same_as_episodes_path(config, _episodes(16, seed=7))
    assert type(ours._buffer()) is Mine and not ours._draws_train_batch()


def test_a_subclass_that_adds_its_own_way_is_called():
    from episode.rllib.offline import OfflinePreLearner

    calls = []

    class Counting(OfflinePreLearner):
        def _postprocess_and_sample(self, episodes):
            calls.append(len(episodes))
            return super()._postprocess_and_sample(episodes)

    ours = _prelearner(_config(), Counting)
    assert not ours._draws_train_batch()
    for batch in _batches(_episodes(8, seed=8), 4):
        ours(batch)
    assert calls == [4, 5]


def test_a_layout_it_does_not_gather_goes_through_the_episodes(monkeypatch):
    """Where drawn_columns declines (Dict items, objects), the buffer's
    sample() and the connectors make the batch, as without the direct draw."""
    import episode.rllib.learner as learner
    from episode.replay import EpisodeReplayBuffer

    declined = []
    monkeypatch.setattr(learner, "drawn_columns", lambda *a, **k: declined.append(1))
    ours = _same_as_episodes_path(_config(), _episodes(16, seed=9))
    assert ours._draws_train_batch() and declined
    # Dict observations: declined before anything is drawn.
    monkeypatch.undo()
    space = gym.spaces.Dict({"x": CARTPOLE.observation_space})
    ep = SingleAgentEpisode(observations=[{"x": np.zeros(4, np.float32)}],
                            observation_space=space, action_space=CARTPOLE.action_space)
    for t in range(5):
        ep.add_env_step({"x": np.full(4, t, np.float32)}, 1, 1.0, terminated=t == 4)
    buffer = EpisodeReplayBuffer(capacity=100, seed=1)
    buffer.add([ep])
    state = copy.deepcopy(buffer.rng.bit_generator.state)
    assert learner.drawn_columns(buffer, 8, 1) is None
    assert buffer.rng.bit_generator.state == state
