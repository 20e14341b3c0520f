"""RLlib's recorded formats: reading them into episodes (and packing
episodes), ours beside RLlib 2.60's own code path, on the same data.

    pytest benchmarks/test_offline_rllib_read.py --benchmark-group-by=group \
        --benchmark-columns=median,iqr,rounds

The data: random-action CartPole episodes recorded as RLlib's
OfflineSingleAgentEnvRunner records them (float32 (4,) observations,
np.int64 actions, float rewards, np.bool_ flags, the ``weights_seq_no``
extra output), made with RLlib's own SingleAgentEpisode and RLlib's own
encoders: ``msgpack.packb(get_state(), default=msgpack_numpy.encode)`` for
the episode format, ``_map_episodes_to_data`` rows built into a table the
way Ray Data's ``from_items`` builds them (obs and new_obs packed, RLlib's
default) for the row format. Both sides read the very same batch: what Ray
Data's ``map_batches`` hands the OfflinePreLearner (a dict of numpy arrays).

Groups (medians per call; extra_info["steps_per_s"] and ["ns_per_step"]):

- offline_read_episodes: RLlib's path, ``SingleAgentEpisode.from_state(
  msgpack.unpackb(item, object_hook=msgpack_numpy.decode))`` per row (what
  OfflinePreLearner.__call__ does with ``input_read_episodes``), against
  ``unpack_episodes(batch["item"])`` ("ours") and the same from the Arrow
  column in place ("ours_arrow");
- offline_read_rows: RLlib's ``OfflinePreLearner._map_to_episodes`` (one
  one-step episode per row) against ``rows_to_episodes`` (whole episodes,
  "ours") and ``rows_to_episodes(whole_episodes=False)`` (RLlib's one-step
  episodes on our engine, "ours_one_step");
- offline_read_rows_unpacked: the same on rows recorded with
  ``output_compress_columns=[]``;
- offline_pack_episodes: msgpack + msgpack_numpy of RLlib's ``get_state()``
  per episode against ``pack_episodes``;
- prelearner_episodes / prelearner_rows: the whole OfflinePreLearner of a
  BC config (``train_batch_size_per_learner=1024``), RLlib's against ours
  (installed), mapping every batch of the recording as Ray Data's
  map_batches hands them: 256 packed episodes per batch (RLlib's episode
  format), 1,024 rows (its row format, obs and new_obs packed); a round
  is a fresh prelearner over all batches. These come first in the file:
  ours installs into RLlib, which it refuses while RLlib's episodes are
  alive (the fixture of the groups above holds some).

STEPS (environment variable EPISODE_BENCH_STEPS, default 20,000) sets the
recorded steps; the default keeps a run under a minute.
"""
import os
import time
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
from prelearners import bc_prelearner  # noqa: E402

pytest.importorskip("pytest_benchmark")
pa = pytest.importorskip("pyarrow")

STEPS = int(os.environ.get("EPISODE_BENCH_STEPS", "20000"))


def _rllib():
    try:
        import msgpack
        import msgpack_numpy
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    except ImportError:
        pytest.skip("ray[rllib], msgpack and msgpack_numpy are needed")
    return msgpack, msgpack_numpy, SingleAgentEpisode


def _random_cartpole(cls, steps):
    """Random-action CartPole episodes of class `cls` (RLlib's or ours),
    as RLlib's OfflineSingleAgentEnvRunner records them (list mode)."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episodes, total = [], 0
    while total < steps:
        ep = cls(observation_space=env.observation_space, action_space=env.action_space)
        obs, info = env.reset(seed=int(rng.integers(1 << 30)))
        ep.add_env_reset(obs, infos=info)
        done = False
        while not done:
            action = np.int64(rng.integers(2))
            obs, reward, term, trunc, info = env.step(int(action))
            ep.add_env_step(obs, action, float(reward), infos=info, terminated=np.bool_(term),
                            truncated=np.bool_(trunc), extra_model_outputs={"weights_seq_no": 0})
            done = term or trunc
        episodes.append(ep)
        total += len(ep)
    return episodes, total


# -- the prelearner ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prelearner_batches():
    """STEPS recorded CartPole steps in RLlib's two formats, as the numpy
    batches map_batches hands the prelearner. Packed with our encoder (the
    very bytes of RLlib's, see tests/test_offline_rllib_format.py), so that
    no RLlib episode outlives the fixture."""
    _rllib()
    from episode import SingleAgentEpisode
    from episode.offline import rllib_format as F

    episodes, steps = _random_cartpole(SingleAgentEpisode, STEPS)
    items = F.pack_episodes(episodes)
    rows = F.episode_rows(episodes, compress_columns=["obs", "new_obs"], infos=False)
    return SimpleNamespace(steps=steps, episodes=[
        {"item": np.array(items[i:i + 256] + [None], dtype=object)[:-1]}
        for i in range(0, len(items), 256)], rows=[
        F.to_numpy_batch(rows.slice(i, 1024)) for i in range(0, rows.num_rows, 1024)])


@pytest.mark.parametrize("side", ["ours", "rllib"], indirect=True)
@pytest.mark.parametrize("kind", ["episodes", "rows"])
def test_prelearner(benchmark, side, kind, prelearner_batches):
    import logging

    benchmark.group = f"prelearner_{kind}"
    batches = getattr(prelearner_batches, kind)
    logging.disable(logging.WARNING)     # RLlib's deprecation warnings, per prelearner

    def setup():
        return (bc_prelearner(side, kind, input_="unused",
                              input_compress_columns=["obs", "new_obs"]),), {}

    def run(prelearner):
        for batch in batches:
            prelearner(batch)

    # Both sides give BC's train batch of train_batch_size_per_learner rows.
    out = bc_prelearner(side, kind, input_="unused",
                              input_compress_columns=["obs", "new_obs"])(batches[0])
    assert {k: tuple(v.shape) for k, v in out.items()}["default_policy/obs"] == (1024, 4)
    rounds = 5 if side == "ours" else 3 if prelearner_batches.steps <= 100_000 else 1
    benchmark.pedantic(run, setup=setup, rounds=rounds)
    logging.disable(logging.NOTSET)
    steps = prelearner_batches.steps
    benchmark.extra_info.update(steps=steps, batches=len(batches))
    if benchmark.stats is not None:
        benchmark.extra_info["steps_per_s"] = round(steps / benchmark.stats.stats.median)


# -- decoding and encoding -------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded():
    """RLlib's episodes of STEPS CartPole steps, and their two recordings."""
    msgpack, mnp, RLlibEpisode = _rllib()
    from ray.data._internal.arrow_block import ArrowBlockBuilder
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    from episode.offline import rllib_format as F

    episodes, steps = _random_cartpole(RLlibEpisode, STEPS)
    items = [msgpack.packb(ep.get_state(), default=mnp.encode) for ep in episodes]
    tables = {}
    for name, compress in (("packed", ["obs", "new_obs"]), ("unpacked", [])):
        ns = SimpleNamespace(output_compress_columns=compress, _samples=[])
        OfflineSingleAgentEnvRunner._map_episodes_to_data(ns, episodes)
        columns = {k: [row[k] for row in ns._samples] for k in ns._samples[0]}
        tables[name] = ArrowBlockBuilder._table_from_pydict(columns)
    return SimpleNamespace(
        steps=steps, episodes=episodes, items=items,
        item_column=pa.array(items, pa.binary()),
        item_batch={"item": np.array(items + [None], dtype=object)[:-1]},
        row_batches={k: F.to_numpy_batch(t) for k, t in tables.items()})


def _timed(benchmark, call, steps, rounds=None):
    start = time.perf_counter()
    call()
    once = time.perf_counter() - start
    iterations = max(1, int(0.02 / once))
    rounds = rounds or int(min(15, max(3, 3.0 / (once * iterations))))
    benchmark.pedantic(call, rounds=rounds, iterations=iterations, warmup_rounds=0)
    benchmark.extra_info["steps"] = steps
    if benchmark.stats is not None:
        median = benchmark.stats.stats.median
        benchmark.extra_info["steps_per_s"] = round(steps / median)
        benchmark.extra_info["ns_per_step"] = round(median / steps * 1e9, 1)


@pytest.mark.parametrize("impl", ["rllib", "ours", "ours_arrow"])
def test_offline_read_episodes(benchmark, recorded, impl):
    benchmark.group = "offline_read_episodes"
    from episode.offline import rllib_format as F

    if impl == "rllib":
        msgpack, mnp, RLlibEpisode = _rllib()
        batch = recorded.item_batch

        def call():
            return [RLlibEpisode.from_state(msgpack.unpackb(s, object_hook=mnp.decode))
                    for s in batch["item"]]
    elif impl == "ours":
        def call():
            return F.unpack_episodes(recorded.item_batch["item"])
    else:
        def call():
            return F.unpack_episodes(recorded.item_column)
    out = call()
    assert sum(len(e) for e in out) == recorded.steps
    _timed(benchmark, call, recorded.steps)


def _rllib_map_to_episodes(batch, compress):
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    prelearner = SimpleNamespace(config=BCConfig().offline_data(input_compress_columns=compress))
    return lambda: OfflinePreLearner._map_to_episodes(prelearner, batch)["episodes"]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("impl", ["rllib", "ours", "ours_one_step"])
def test_offline_read_rows(benchmark, recorded, impl, packed):
    benchmark.group = "offline_read_rows" if packed else "offline_read_rows_unpacked"
    from episode.offline import rllib_format as F

    _rllib()
    compress = ["obs", "new_obs"] if packed else []
    batch = recorded.row_batches["packed" if packed else "unpacked"]
    if impl == "rllib":
        call = _rllib_map_to_episodes(batch, compress)
    else:
        whole = impl == "ours"

        def call():
            return F.rows_to_episodes(batch, compress_columns=compress, whole_episodes=whole)
    out = call()
    assert sum(len(e) for e in out) == recorded.steps
    if impl == "ours":
        assert len(out) == len(recorded.episodes)
    _timed(benchmark, call, recorded.steps)


@pytest.mark.parametrize("impl", ["rllib", "ours"])
def test_offline_pack_episodes(benchmark, recorded, impl):
    benchmark.group = "offline_pack_episodes"
    from episode.offline import rllib_format as F

    if impl == "rllib":
        msgpack, mnp, _ = _rllib()
        episodes = recorded.episodes

        def call():
            return [msgpack.packb(e.get_state(), default=mnp.encode) for e in episodes]
    else:
        episodes = F.unpack_episodes(recorded.items)

        def call():
            return F.pack_episodes(episodes)
    assert call() == recorded.items
    _timed(benchmark, call, recorded.steps)
