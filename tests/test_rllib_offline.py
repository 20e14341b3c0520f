"""episode.rllib.offline: RLlib 2.60's offline API (recording with
``output=``, reading with ``input_=``) on our engine.

Recording: RLlib's recording runner picked by RLlib's config records
through ours; each of RLlib's recording bugs is pinned fixed (old data
written again by every sample(), chunks lost with output_max_rows_per_file,
unfinished chunks in a complete_episodes recording, no infos in the row
format, multi-agent recording refused); files appear whole; RLlib reads
what ours writes (msgpack_numpy and RLlib's own classes, in a process of
their own). Reading: BC on a local learner reads in this process without
Ray Data, with remote learners through Ray Data; the three formats; rows as
whole episodes (RLlib: one episode per row) giving BC RLlib's batches;
multi-agent data; RLlib's options; user prelearner and offline-data
classes; damaged input.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")
pytest.importorskip("pyarrow")
pytestmark = pytest.mark.rllib

import ray  # noqa: E402

import episode.rllib  # noqa: E402

HERE = Path(__file__).parent
CARTPOLE = gym.make("CartPole-v1")


@pytest.fixture(scope="module", autouse=True)
def installed():
    # RLlib's classes come back after the module: later test files compare
    # ours with RLlib's own.
    with episode.rllib.installed():
        if not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        yield


# -- configs -------------------------------------------------------------------------------


def _recording_config(out, *, batch_mode="complete_episodes", envs=1, **offline):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=0, num_envs_per_env_runner=envs, batch_mode=batch_mode,
                         rollout_fragment_length=20)
            .offline_data(output=str(out), **offline)
            .debugging(seed=0))


def _multi_agent_config(out, **offline):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    return (PPOConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
            .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: f"p{aid}")
            .env_runners(num_env_runners=0, batch_mode="complete_episodes")
            .offline_data(output=str(out), **offline)
            .debugging(seed=0))


def _runner(config):
    from episode.rllib.offline import OfflineMultiAgentEnvRunner, OfflineSingleAgentEnvRunner

    cls = OfflineMultiAgentEnvRunner if config.is_multi_agent else OfflineSingleAgentEnvRunner
    return cls(config=config)


def _bc_config(path, *, learners=0, batch=32, **offline):
    from ray.rllib.algorithms.bc import BCConfig

    offline.setdefault("dataset_num_iters_per_learner", 1)
    return (BCConfig()
            .environment(observation_space=CARTPOLE.observation_space,
                         action_space=CARTPOLE.action_space)
            .learners(num_learners=learners, num_cpus_per_learner=0.5 if learners else "auto")
            .training(train_batch_size_per_learner=batch)
            .offline_data(input_=path, **offline)
            .debugging(seed=0))


def _files(folder, ext="parquet"):
    return sorted(glob.glob(os.path.join(str(folder), "**", f"*.{ext}"), recursive=True))


def _hidden(folder):
    return [p for p in glob.glob(os.path.join(str(folder), "**", ".*"), recursive=True)]


@pytest.fixture(scope="module")
def native_recording(tmp_path_factory):
    """40 CartPole episodes recorded by our runner in the native format."""
    out = tmp_path_factory.mktemp("native")
    runner = _runner(_recording_config(out, output_write_method="write_episodes"))
    episodes = runner.sample(num_episodes=40, random_actions=True)
    runner.stop()
    return out, episodes


# -- the classes in place -----------------------------------------------------------------


def test_install_puts_the_offline_classes_in_rllibs_modules():
    from ray.rllib.offline import offline_data, offline_env_runner, offline_prelearner

    from episode.rllib import offline
    from episode.rllib.offline.prelearner import RLlibOfflinePreLearner

    assert offline_env_runner.OfflineSingleAgentEnvRunner is offline.OfflineSingleAgentEnvRunner
    assert offline_data.OfflineData is offline.OfflineData
    assert offline_data.OfflinePreLearner is offline.OfflinePreLearner
    assert offline_prelearner.OfflinePreLearner is offline.OfflinePreLearner
    # RLlib's config checks of user classes accept subclasses of RLlib's own.

    class Theirs(RLlibOfflinePreLearner):
        pass

    assert issubclass(Theirs, offline_prelearner.OfflinePreLearner)
    assert not issubclass(int, offline_prelearner.OfflinePreLearner)


def test_the_offline_classes_are_named_by_the_package():
    """RLlib's configs and checkpoints name a class by its module
    (serialize_type), and pickles do: the classes keep the package's name,
    whichever of its modules defines them."""
    import pickle

    from ray.rllib.utils.serialization import deserialize_type, serialize_type

    from episode.rllib import offline

    for name in offline.__all__[1:]:
        cls = getattr(offline, name)
        assert serialize_type(cls) == f"episode.rllib.offline.{name}"
        assert deserialize_type(serialize_type(cls)) is cls
        assert pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.parametrize("multi_agent", [False, True])
def test_rllibs_env_runner_group_records_through_ours(tmp_path, multi_agent):
    """A config with output= gets our recording runner from RLlib's
    EnvRunnerGroup; a multi-agent one too (RLlib: ValueError "Multi-agent
    recording is not supported")."""
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    from episode.rllib.offline import OfflineMultiAgentEnvRunner, OfflineSingleAgentEnvRunner

    config = _multi_agent_config(tmp_path) if multi_agent else _recording_config(tmp_path)
    group = EnvRunnerGroup(config=config)
    try:
        runner = group.local_env_runner
        assert type(runner) is (OfflineMultiAgentEnvRunner if multi_agent
                                else OfflineSingleAgentEnvRunner)
        assert runner.config.output == str(tmp_path)
        assert config.env_runner_cls is None        # the caller's config unchanged
    finally:
        group.stop()


# -- recording --------------------------------------------------------------------------------


def test_native_recording_reads_back_as_the_sampled_episodes(native_recording):
    from episode.offline import read_episodes

    out, sampled = native_recording
    assert not _hidden(out)
    read = list(read_episodes(out))
    assert [e.id_ for e in read] == [e.id_ for e in sampled]
    for a, b in zip(read, sampled):
        assert len(a) == len(b) and a.is_done and b.is_done
        np.testing.assert_array_equal(np.asarray(a.get_observations()),
                                      np.asarray(b.get_observations()))
        assert list(a.get_actions()) == list(b.get_actions())
        assert list(a.get_rewards()) == list(b.get_rewards())
    # One folder per env, as RLlib's layout.
    assert {os.path.basename(os.path.dirname(f)) for f in _files(out, "arrow")} == \
        {"cartpoleenv"}


def test_native_recording_writes_each_sample_once(tmp_path):
    from episode.offline import read_episodes

    runner = _runner(_recording_config(tmp_path, output_write_method="write_episodes"))
    sampled = []
    for _ in range(3):
        sampled += runner.sample(num_episodes=2, random_actions=True)
        assert len(read_episodes(tmp_path)) == len(sampled)
    runner.stop()
    assert sorted(e.id_ for e in read_episodes(tmp_path)) == sorted(e.id_ for e in sampled)


def test_native_recording_with_a_row_limit_keeps_the_rest_for_stop(tmp_path):
    from episode.offline import read_episodes

    config = _recording_config(tmp_path, output_write_method="write_episodes",
                               output_max_rows_per_file=10_000,
                               output_write_remaining_data=True)
    runner = _runner(config)
    sampled = runner.sample(num_episodes=3, random_actions=True)
    assert not _files(tmp_path)
    runner.stop()
    assert sorted(e.id_ for e in read_episodes(tmp_path)) == sorted(e.id_ for e in sampled)


def test_complete_episodes_records_whole_episodes_only(tmp_path):
    """sample(num_timesteps=...) under complete_episodes hands on the
    running episode's chunk (RLlib records it, and BC then refuses the
    whole recording: "must be done"): ours waits for the episode to end
    and records it whole; the chunks handed on stay as they were."""
    from episode.offline import read_episodes

    runner = _runner(_recording_config(tmp_path, output_write_method="write_episodes"))
    chunks = []
    while not any(c.is_done for c in chunks):
        chunks += runner.sample(num_timesteps=3, random_actions=True)
    runner.stop()
    first = chunks[0]
    assert len(first) == 3 and first.t_started == 0 and not first.is_done
    recorded = list(read_episodes(tmp_path))
    assert all(e.is_done and e.t_started == 0 for e in recorded)
    done = [c for c in chunks if c.is_done]
    whole = next(e for e in recorded if e.id_ == done[0].id_)
    assert len(whole) == sum(len(c) for c in chunks if c.id_ == whole.id_)
    np.testing.assert_array_equal(np.asarray(whole.get_observations(slice(0, 4))),
                                  np.asarray(first.get_observations()))


def test_a_failed_write_leaves_no_file_and_keeps_its_rows(tmp_path, monkeypatch):
    """RLlib logs a failed write and drops its rows; ours logs it, leaves no
    partial or temporary file, and writes the rows with the next sample()."""
    import pyarrow.parquet as pq

    from episode.offline import read_episodes

    runner = _runner(_recording_config(tmp_path, output_write_method="write_episodes",
                                       output_write_method_kwargs={"format": "parquet"}))
    real = pq.write_table
    calls = []

    def failing(table, where, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            real(table.slice(0, 1), where, **kwargs)
            raise OSError("disk full")
        return real(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", failing)
    first = runner.sample(num_episodes=2, random_actions=True)
    assert calls and not _files(tmp_path) and not _hidden(tmp_path)
    second = runner.sample(num_episodes=1, random_actions=True)
    runner.stop()
    assert sorted(e.id_ for e in read_episodes(tmp_path)) == sorted(
        e.id_ for e in first + second)


def test_multi_agent_recording_in_the_native_format(tmp_path):
    from episode import MultiAgentEpisode
    from episode.offline import read_episodes

    runner = _runner(_multi_agent_config(tmp_path, output_write_method="write_episodes"))
    sampled = runner.sample(num_episodes=3, random_actions=True)
    runner.stop()
    read = list(read_episodes(tmp_path))
    assert [type(e) for e in read] == [MultiAgentEpisode] * 3
    assert [e.id_ for e in read] == [e.id_ for e in sampled]
    for a, b in zip(read, sampled):
        assert a.env_t == b.env_t and sorted(a.agent_episodes) == sorted(b.agent_episodes)
        for aid, agent in a.agent_episodes.items():
            assert agent.module_id == f"p{aid}"
            assert list(agent.get_actions()) == list(b.agent_episodes[aid].get_actions())


# -- reading ---------------------------------------------------------------------------------


def _loss(result, module="default_policy"):
    return result["learners"][module]["policy_loss"]


def test_bc_on_a_local_learner_reads_in_this_process(native_recording):
    """No Ray dataset is made: the files are read and mapped here."""
    out, _ = native_recording
    algo = _bc_config(str(out)).build_algo()
    try:
        from episode.rllib.offline import OfflineData

        assert type(algo.offline_data) is OfflineData
        losses = [_loss(algo.train()) for _ in range(3)]
        assert algo.offline_data._data is None
        assert all(np.isfinite(losses))
        batch = algo.offline_data.sample(num_samples=32, num_shards=0)
        assert set(batch.policy_batches) == {"default_policy"}
        assert len(batch.policy_batches["default_policy"]) == 32
    finally:
        algo.stop()


def test_bc_on_a_remote_learner_reads_through_ray_data(native_recording):
    """num_learners >= 1: the prelearner runs in Ray Data's map_batches
    actors and the learners iterate its output, as RLlib's does (the
    native dataset enters Ray Data as episode numbers)."""
    out, _ = native_recording
    config = _bc_config(str(out), learners=1,
                        map_batches_kwargs={"concurrency": 1, "num_cpus": 0.25})
    algo = config.build_algo()
    try:
        # (One iteration: the learner actor's start is most of the time.)
        assert np.isfinite(_loss(algo.train()))
        assert algo.offline_data.data_is_mapped and algo.offline_data._data is not None
    finally:
        algo.stop()


def _multi_agent_bc_config(path, **offline):
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.core.rl_module import MultiRLModuleSpec, RLModuleSpec
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    env = MultiAgentCartPole({"num_agents": 2})
    obs, act = env.get_observation_space(0), env.get_action_space(0)
    offline.setdefault("dataset_num_iters_per_learner", 1)
    return (BCConfig()
            .environment(observation_space=gym.spaces.Dict({0: obs, 1: obs}),
                         action_space=gym.spaces.Dict({0: act, 1: act}))
            .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: f"p{aid}")
            .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={
                p: RLModuleSpec(observation_space=obs, action_space=act) for p in ("p0", "p1")}))
            .training(train_batch_size_per_learner=16)
            .offline_data(input_=path, **offline)
            .debugging(seed=0))


def test_multi_agent_bc_reads_a_multi_agent_recording(tmp_path):
    """RLlib's OfflinePreLearner raises NotImplementedError for multi-agent
    data; ours reads the agents' episodes, each module's from its own
    buffer: a batch holds train_batch_size_per_learner rows per module."""
    runner = _runner(_multi_agent_config(tmp_path, output_write_method="write_episodes"))
    runner.sample(num_episodes=6, random_actions=True)
    runner.stop()
    algo = _multi_agent_bc_config(str(tmp_path)).build_algo()
    try:
        result = algo.train()
        assert np.isfinite(_loss(result, "p0")) and np.isfinite(_loss(result, "p1"))
        batch = algo.offline_data.sample(num_samples=16, num_shards=0)
        assert {m: len(b) for m, b in batch.policy_batches.items()} == {"p0": 16, "p1": 16}
    finally:
        algo.stop()


def test_local_reading_options(native_recording):
    """materialize_mapped_data keeps the first pass's mapped batches (the
    next pass hands the same rows); input_read_batch_size sets how many
    episodes each prelearner call reads; dataset_num_iters_per_learner != 1
    hands the learner an iterator (a Ray DataIterator in RLlib)."""
    out, _ = native_recording
    config = _bc_config(str(out), batch=16, materialize_mapped_data=True,
                        input_read_episodes=True, input_read_batch_size=10,
                        dataset_num_iters_per_learner=3)
    algo = config.build_algo()
    try:
        data = algo.offline_data
        # 40 episodes, 10 per prelearner call: 4 mapped batches of 16 rows.
        first = [data.sample(num_samples=16, num_shards=0) for _ in range(4)]
        again = [data.sample(num_samples=16, num_shards=0) for _ in range(4)]
        assert len(data._local.mapped_kept) == 4
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a.policy_batches["default_policy"]["obs"],
                                          b.policy_batches["default_policy"]["obs"])
        result = algo.train()
        assert np.isfinite(_loss(result))
        (iterator,) = data.sample(num_samples=16, num_shards=0, return_iterator=True)
        batches = list(iterator.iter_torch_batches(batch_size=16))
        assert len(batches) == 4 and all(len(b["default_policy/obs"]) == 16 for b in batches)
    finally:
        algo.stop()


def test_local_shuffle_and_drop_last(native_recording):
    out, _ = native_recording
    config = _bc_config(str(out), batch=16, materialize_mapped_data=True,
                        input_read_episodes=True, input_read_batch_size=10,
                        iter_batches_kwargs={"local_shuffle_buffer_size": 40,
                                             "local_shuffle_seed": 1})
    algo = config.build_algo()
    try:
        data = algo.offline_data
        data.sample(num_samples=16, num_shards=0)
        list(data._local.batches(16))       # a whole pass, kept
        plain = np.concatenate([m["default_policy/obs"] for m in data._local.mapped_kept])
        shuffled = [b["default_policy/obs"] for b in data._local.batches(
            24, local_shuffle_buffer_size=40, local_shuffle_seed=1)]
        assert [len(b) for b in shuffled] == [24, 24, 16]
        # The same rows, another order.
        joined = np.concatenate(shuffled)
        assert sorted(map(tuple, joined)) == sorted(map(tuple, plain))
        assert not np.array_equal(joined, plain)
        dropped = list(data._local.batches(24, drop_last=True))
        assert [len(b["default_policy/obs"]) for b in dropped] == [24, 24]
    finally:
        algo.stop()


def test_user_classes_run_on_ours(native_recording):
    """offline_data_class and prelearner_class subclasses of ours are the
    ones that run; RLlib's config checks take them."""
    from ray.rllib.offline.offline_data import OfflineData
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    calls = []

    class CountingPreLearner(OfflinePreLearner):
        def __call__(self, batch):
            calls.append("prelearner")
            return super().__call__(batch)

    class CountingData(OfflineData):
        def sample(self, *args, **kwargs):
            calls.append("data")
            return super().sample(*args, **kwargs)

    out, _ = native_recording
    config = _bc_config(str(out), offline_data_class=CountingData,
                        prelearner_class=CountingPreLearner)
    algo = config.build_algo()
    try:
        algo.train()
        assert type(algo.offline_data) is CountingData
        assert calls[0] == "data" and "prelearner" in calls
    finally:
        algo.stop()


def test_missing_input_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file or folder"):
        _bc_config(str(tmp_path / "nothing")).build_algo()


def test_whole_episodes_train_batch_is_the_connectors(tmp_path):
    """BC's train batch of whole episodes built from their columns equals
    what RLlib's learner connectors build of them item by item (the
    module's extra outputs included)."""
    import copy

    from episode.offline import read_episodes

    runner = _runner(_recording_config(tmp_path, output_write_method="write_episodes"))
    runner.sample(num_episodes=5)
    runner.stop()
    ours, _ = _prelearners(_bc_config(str(tmp_path)))
    episodes = list(read_episodes(tmp_path))
    assert set(episodes[0].extra_model_outputs) == {"action_dist_inputs", "action_logp",
                                                     "weights_seq_no"}
    fast = ours._columns_of_whole_episodes(copy.deepcopy(episodes))
    slow = ours._learner_connector(rl_module=ours._module, batch={}, episodes=episodes,
                                   shared_data={}, metrics=None)
    slow = {f"default_policy/{k}": v for k, v in slow["default_policy"].items()}
    assert fast is not None and sorted(fast) == sorted(slow)
    for key in fast:
        assert fast[key].dtype == slow[key].dtype, key
        np.testing.assert_array_equal(fast[key].numpy(), slow[key].numpy(), err_msg=key)


# -- RLlib's formats ----------------------------------------------------------------------------

RLLIB_FORMATS = {"episodes": {}, "rows": {"output_write_episodes": False}}


def _rllib_subprocess(code: str, timeout: int = 600) -> dict:
    """Runs `code` (which prints one JSON line last) in a fresh process on
    RLlib's own classes."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=HERE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def our_recordings(tmp_path_factory):
    """30 CartPole episodes recorded by our runner in each of RLlib's formats."""
    out = {}
    for kind, options in RLLIB_FORMATS.items():
        folder = tmp_path_factory.mktemp(f"ours-{kind}")
        runner = _runner(_recording_config(folder, envs=2, **options))
        episodes = []
        for _ in range(3):
            episodes += runner.sample(num_episodes=10, random_actions=True)
        runner.stop()
        out[kind] = (folder, episodes)
    return out


@pytest.fixture(scope="module")
def rllib_recordings(tmp_path_factory):
    """CartPole episodes recorded by RLlib's own runner, in both formats
    (in a process without install())."""
    folders = {kind: str(tmp_path_factory.mktemp(f"rllib-{kind}")) for kind in RLLIB_FORMATS}
    code = f"""
import json, logging
logging.disable(logging.WARNING)
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner
out = {{}}
for kind, folder in {folders!r}.items():
    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2,
                           batch_mode="complete_episodes")
              .offline_data(output=folder, output_write_episodes=kind == "episodes",
                            output_max_rows_per_file=10_000, output_write_remaining_data=True)
              .debugging(seed=0))
    runner = OfflineSingleAgentEnvRunner(config=config)
    episodes = runner.sample(num_episodes=20)
    runner.stop()
    out[kind] = [[e.id_, len(e), float(sum(e.get_rewards()))] for e in episodes]
print(json.dumps(out))
"""
    sampled = _rllib_subprocess(code)
    return {kind: (folders[kind], sampled[kind]) for kind in RLLIB_FORMATS}


def test_rllib_reads_our_episode_recording(our_recordings):
    """msgpack with msgpack_numpy and RLlib's SingleAgentEpisode.from_state
    (RLlib's reader) read ours: the episodes sampled, step for step."""
    folder, episodes = our_recordings["episodes"]
    files = _files(folder)
    assert files and all("/cartpoleenv/run-" in f for f in files)
    code = f"""
import json, msgpack, msgpack_numpy as mnp, numpy as np, pyarrow.parquet as pq
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
out = []
for f in {files!r}:
    for blob in pq.read_table(f).column("item").to_pylist():
        e = SingleAgentEpisode.from_state(msgpack.unpackb(blob, object_hook=mnp.decode))
        out.append([e.id_, len(e), bool(e.is_terminated), bool(e.is_truncated),
                    np.asarray(e.get_observations()).tolist(), list(map(int, e.get_actions())),
                    list(map(float, e.get_rewards()))])
print(json.dumps(out))
"""
    read = _rllib_subprocess(code)
    assert [r[0] for r in read] == [e.id_ for e in episodes]
    for r, e in zip(read, episodes):
        assert r[1:4] == [len(e), e.is_terminated, e.is_truncated]
        np.testing.assert_array_equal(np.asarray(r[4], np.float32),
                                      np.asarray(e.get_observations()))
        assert r[5] == list(e.get_actions()) and r[6] == list(e.get_rewards())


@pytest.fixture(scope="module")
def rllib_losses_on_ours(our_recordings):
    """BC on RLlib's own classes (no install(), its Ray Data path), two
    iterations on each format that ours recorded: the losses, by format
    (both in one process: a Ray start and RLlib's imports each)."""
    folders = {kind: str(folder) for kind, (folder, _) in our_recordings.items()}
    code = f"""
import json, logging
logging.disable(logging.WARNING)
import gymnasium as gym, ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
from ray.rllib.algorithms.bc import BCConfig
env = gym.make("CartPole-v1")
out = {{}}
for kind, folder in {folders!r}.items():
    algo = (BCConfig().environment(observation_space=env.observation_space,
                                   action_space=env.action_space)
            .learners(num_learners=0).training(train_batch_size_per_learner=32)
            .offline_data(input_=folder, input_read_episodes=kind == "episodes",
                          dataset_num_iters_per_learner=1,
                          map_batches_kwargs={{"concurrency": 1, "num_cpus": 0.5}})
            .build_algo())
    out[kind] = [algo.train()["learners"]["default_policy"]["policy_loss"] for _ in range(2)]
    algo.stop()
print(json.dumps(out))
"""
    return _rllib_subprocess(code)


@pytest.mark.parametrize("kind", sorted(RLLIB_FORMATS))
def test_rllib_trains_on_our_recordings(rllib_losses_on_ours, kind):
    """RLlib's BC trains on what ours recorded, in either format."""
    losses = rllib_losses_on_ours[kind]
    assert len(losses) == 2 and all(np.isfinite(losses))


@pytest.mark.parametrize("kind", sorted(RLLIB_FORMATS))
def test_ours_trains_on_rllibs_recordings(rllib_recordings, kind):
    from episode.offline import read_episodes

    folder, sampled = rllib_recordings[kind]
    if kind == "episodes":
        read = list(read_episodes(folder))
        assert sorted(e.id_ for e in read) == sorted(s[0] for s in sampled)
    else:
        # RLlib's rows (Ray Data spreads them over many files) become the
        # whole episodes.
        ours, _ = _prelearners(_bc_config(folder))
        read = ours._map_to_episodes(_rows_batch(folder))["episodes"]
        assert sorted((e.id_, len(e)) for e in read) == sorted((s[0], s[1]) for s in sampled)
    algo = _bc_config(folder, input_read_episodes=kind == "episodes").build_algo()
    try:
        losses = [_loss(algo.train()) for _ in range(2)]
        assert all(np.isfinite(losses))
    finally:
        algo.stop()


def _rows_batch(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from episode.offline import rllib_format

    return rllib_format.to_numpy_batch(pa.concat_tables(pq.read_table(f) for f in _files(folder)))


def _prelearners(config):
    from ray.rllib.env import INPUT_ENV_SPACES

    from episode.rllib.offline import OfflinePreLearner
    from episode.rllib.offline.prelearner import RLlibOfflinePreLearner

    spaces = {INPUT_ENV_SPACES: (CARTPOLE.observation_space, CARTPOLE.action_space),
              "default_policy": (CARTPOLE.observation_space, CARTPOLE.action_space)}
    spec = config.get_multi_rl_module_spec(spaces=spaces, inference_only=False)
    return [cls(config=config, spaces=spaces[INPUT_ENV_SPACES], module_spec=spec)
            for cls in (OfflinePreLearner, RLlibOfflinePreLearner)]


def test_rows_become_whole_episodes(our_recordings):
    """RLlib makes a one-step episode of each row; ours joins a recorded
    episode's rows (same eps_id, each row's obs the previous row's new_obs)
    into one, infos included."""
    folder, episodes = our_recordings["rows"]
    batch = _rows_batch(folder)
    ours, theirs = _prelearners(_bc_config(str(folder)))
    whole = ours._map_to_episodes(batch)["episodes"]
    one_step = theirs._map_to_episodes(batch)["episodes"]
    assert len(one_step) == len(batch["obs"]) == sum(len(e) for e in episodes)
    assert {len(e) for e in one_step} == {1}
    assert [(e.id_, len(e), e.is_terminated) for e in whole] == \
        [(e.id_, len(e), e.is_terminated) for e in episodes]
    for a, b in zip(whole, episodes):
        np.testing.assert_array_equal(np.asarray(a.get_observations()),
                                      np.asarray(b.get_observations()))
        assert a.get_infos()[1:] == b.get_infos()[1:]


def test_rows_give_bc_rllibs_train_batch(our_recordings):
    """Whole episodes or one-step ones: BC's learner connector makes the same
    train batch of the same rows (same keys, dtypes, values)."""
    folder, _ = our_recordings["rows"]
    batch = _rows_batch(folder)
    ours, theirs = _prelearners(_bc_config(str(folder)))
    a, b = ours(batch), theirs(batch)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=key)


def test_a_prelearner_call_leaves_the_collector_as_it_found_it(our_recordings, monkeypatch):
    """The collector is off during a call (its transient episodes are never
    walked) and back as it was after it, a raise included."""
    import gc

    folder, _ = our_recordings["rows"]
    batch = _rows_batch(folder)
    ours, _ = _prelearners(_bc_config(str(folder)))
    seen = []
    to_episodes = ours._map_to_episodes

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return to_episodes(*args, **kwargs)

    monkeypatch.setattr(ours, "_map_to_episodes", spy)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            ours(batch)
            assert gc.isenabled() is enabled
        gc.enable()
        with pytest.raises(ValueError, match="no column"):
            ours({"nothing": np.zeros(3)})
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert seen == [False, False, False]


def test_episode_format_without_input_read_episodes(our_recordings):
    """RLlib reads an `item` column as rows without input_read_episodes
    (KeyError 'obs'); ours reads the episodes."""
    folder, _ = our_recordings["episodes"]
    algo = _bc_config(str(folder)).build_algo()
    try:
        assert np.isfinite(_loss(algo.train()))
    finally:
        algo.stop()


def test_unfinished_episodes_are_refused_as_rllib_refuses_them(tmp_path):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    import pyarrow as pa
    import pyarrow.parquet as pq

    from episode.offline import rllib_format

    episode = SingleAgentEpisode(observations=[np.zeros(4, np.float32)] * 3, actions=[0, 1],
                                 rewards=[1.0, 1.0], observation_space=CARTPOLE.observation_space,
                                 action_space=CARTPOLE.action_space, len_lookback_buffer=0)
    pq.write_table(pa.table({"item": pa.array(rllib_format.pack_episodes([episode]),
                                              pa.binary())}), tmp_path / "x.parquet")
    algo = _bc_config(str(tmp_path), input_read_episodes=True).build_algo()
    try:
        with pytest.raises(ValueError, match="must be done"):
            algo.train()
    finally:
        algo.stop()


def test_a_damaged_file_is_named(our_recordings, tmp_path):
    folder, _ = our_recordings["rows"]
    good = _files(folder)[0]
    data = Path(good).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[:len(data) // 2])
    algo = _bc_config(str(tmp_path)).build_algo()
    try:
        with pytest.raises(ValueError, match="cut.parquet"):
            algo.train()
    finally:
        algo.stop()


def test_local_uri_and_a_list_of_inputs(tmp_path):
    """output= and input_ take RLlib's local:// URIs; input_ a list of
    folders."""
    from episode.offline import read_episodes

    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        runner = _runner(_recording_config(f"local://{folder}", output_write_episodes=False))
        runner.sample(num_episodes=3, random_actions=True)
        runner.stop()
        assert len(read_episodes(folder)) == 3
    algo = _bc_config([f"local://{f}" for f in folders]).build_algo()
    try:
        assert np.isfinite(_loss(algo.train()))
    finally:
        algo.stop()


def test_write_methods_only_ray_data_has_go_through_ray_data(tmp_path):
    import pandas as pd

    runner = _runner(_recording_config(tmp_path, output_write_episodes=False,
                                       output_write_method="write_json"))
    sampled = runner.sample(num_episodes=2, random_actions=True)
    runner.stop()
    files = _files(tmp_path, "json")
    assert files and not _files(tmp_path)
    rows = pd.concat([pd.read_json(f, lines=True) for f in files])
    assert len(rows) == sum(len(e) for e in sampled)


def test_parquet_keyword_arguments(tmp_path):
    """write_parquet's pyarrow arguments go to pyarrow; read_parquet's that
    only Ray Data has make a local learner read through Ray Data (the
    mapping stays in this process)."""
    import pyarrow.parquet as pq

    runner = _runner(_recording_config(tmp_path, output_write_episodes=False,
                                       output_write_method_kwargs={"compression": "zstd"}))
    runner.sample(num_episodes=4, random_actions=True)
    runner.stop()
    (f,) = _files(tmp_path)
    assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"
    algo = _bc_config(str(tmp_path),
                      input_read_method_kwargs={"override_num_blocks": 2}).build_algo()
    try:
        assert np.isfinite(_loss(algo.train()))
        assert algo.offline_data._data is not None         # read by Ray Data
        assert not algo.offline_data.data_is_mapped         # mapped here
    finally:
        algo.stop()


@pytest.mark.parametrize("kind", sorted(RLLIB_FORMATS))
def test_max_rows_writes_every_full_file(tmp_path, kind):
    """RLlib's loop splits off every full file but writes only the last one;
    ours writes each, and stop() the rest (output_write_remaining_data)."""
    import pyarrow.parquet as pq

    config = _recording_config(tmp_path, output_max_rows_per_file=3,
                               output_write_remaining_data=True, **RLLIB_FORMATS[kind])
    runner = _runner(config)
    sampled = runner.sample(num_episodes=4, random_actions=True)
    rows = 4 if kind == "episodes" else sum(len(e) for e in sampled)
    written = [pq.read_table(f).num_rows for f in _files(tmp_path)]
    assert written == [3] * (rows // 3)
    runner.stop()
    written = [pq.read_table(f).num_rows for f in _files(tmp_path)]
    assert written == [3] * (rows // 3) + ([rows % 3] if rows % 3 else [])


@pytest.mark.parametrize("kind", sorted(RLLIB_FORMATS))
def test_each_sample_is_written_once(tmp_path, kind):
    """RLlib's buffer is never emptied without output_max_rows_per_file:
    every sample() writes everything recorded so far again."""
    from episode.offline import read_episodes

    runner = _runner(_recording_config(tmp_path, **RLLIB_FORMATS[kind]))
    sampled = []
    for call in range(1, 4):
        sampled += runner.sample(num_episodes=2, random_actions=True)
        assert len(glob.glob(os.path.join(str(tmp_path), "cartpoleenv", "run-*"))) == call
    runner.stop()
    read = list(read_episodes(tmp_path))
    assert sorted(e.id_ for e in read) == sorted(e.id_ for e in sampled)


def test_row_format_keeps_infos(tmp_path):
    """RLlib's row format drops infos; ours has an infos column: the info
    that came with each row's new_obs."""
    import pyarrow.parquet as pq

    from episode.offline import read_episodes

    config = _recording_config(tmp_path, output_write_episodes=False)
    config.environment(InfosCartPole)
    runner = _runner(config)
    sampled = runner.sample(num_episodes=2, random_actions=True)
    runner.stop()
    (f,) = _files(tmp_path)
    # (In the file's schema metadata, out of RLlib's reader's sight.)
    assert "infos" not in pq.read_schema(f).names
    assert b"episode.infos" in pq.read_schema(f).metadata
    read = list(read_episodes(tmp_path))
    assert [e.id_ for e in read] == [e.id_ for e in sampled]
    for a, b in zip(read, sampled):
        assert a.get_infos()[1:] == b.get_infos()[1:]
        assert a.get_infos(-1) == {"step": len(b)}


class InfosCartPole(gym.Wrapper):
    """CartPole whose infos count the steps."""

    def __init__(self, config=None):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.steps += 1
        return obs, reward, terminated, truncated, {"step": self.steps}


@pytest.mark.parametrize("kind", sorted(RLLIB_FORMATS))
def test_multi_agent_recording_in_rllibs_formats(tmp_path, kind):
    """Each agent's episode, with its agent and module ids and its
    multi-agent episode's id; multi-agent BC trains on them."""
    from episode.offline import read_episodes

    runner = _runner(_multi_agent_config(tmp_path, **RLLIB_FORMATS[kind]))
    sampled = runner.sample(num_episodes=4, random_actions=True)
    runner.stop()
    agents = {(a.id_, a.agent_id, a.module_id, len(a)) for e in sampled
              for a in e.agent_episodes.values() if len(a)}
    read = list(read_episodes(tmp_path))
    if kind == "episodes":
        assert {(e.id_, e.agent_id, e.module_id, len(e)) for e in read} == agents
        assert {e.multi_agent_episode_id for e in read} == {e.id_ for e in sampled}
    else:
        assert {(e.id_, len(e)) for e in read} == {(a[0], a[3]) for a in agents}
    algo = _multi_agent_bc_config(str(tmp_path),
                                  input_read_episodes=kind == "episodes").build_algo()
    try:
        # (A batch of rows may hold one module's only.)
        losses: dict = {}
        for _ in range(4):
            for module, values in algo.train()["learners"].items():
                if module in ("p0", "p1") and "policy_loss" in values:
                    losses.setdefault(module, []).append(values["policy_loss"])
        assert sorted(losses) == ["p0", "p1"] and np.isfinite(sum(losses.values(), [])).all()
    finally:
        algo.stop()
