"""The benchmark workloads: ours does what each says, and RLlib's does the same."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from episode import SingleAgentEpisode
from episode.cli import workloads
from episode.cli.workloads import (
    N_APPEND,
    N_COLLECT,
    N_CUT,
    N_DRAWN,
    N_FRAGMENT,
    N_MA,
    N_REPLAY,
    N_STEPS,
    N_VEC_ENVS,
    N_VEC_STEPS,
    WORKLOADS,
    Round,
    Workload,
    _blackjack,
    _cartpole,
    _dict_obs,
    _logp,
    _ma_steps,
    _ma_turns,
    _replay_data,
    _vector_steps,
    assert_same,
    check,
    rllib_class,
)


# The inputs are cached: the same arrays the workloads append.
def _obs(i):
    return _cartpole().obs[i]


def _dict_rows(key, rows):
    return np.stack([_dict_obs()[i][key] for i in rows])


def _is_dict_frames(r, rows):
    """r is the Dict observations at `rows` (None: a zero-filled frame)."""
    if not (isinstance(r, dict) and r.keys() == {"img", "vec"}):
        return False
    want = {"img": (np.uint8, (8, 8, 3)), "vec": (np.float32, (5,))}
    for key, (dtype, shape) in want.items():
        frames = [np.zeros(shape, dtype) if i is None else _dict_obs()[i][key] for i in rows]
        if r[key].dtype != dtype or not np.array_equal(r[key], np.stack(frames)):
            return False
    return True


def _is_blackjack(r):
    """r is the three short episodes, numpy'ized, with what they were given."""
    if [len(e) for e in r] != [1, 2, 3]:
        return False
    for episode, (obs, actions, rewards) in zip(r, _blackjack()):
        columns = episode.get_observations()
        if not (episode.is_numpy and episode.is_terminated and isinstance(columns, tuple)):
            return False
        if not all(c.dtype == np.int64 and np.array_equal(c, [o[k] for o in obs])
                   for k, c in enumerate(columns)):
            return False
        if not (np.array_equal(episode.get_actions(), actions)
                and np.array_equal(episode.get_rewards(), rewards)
                and episode.get_rewards()[-1] in (-1.0, 1.0)):
            return False
    return True


def _is_logp_append(r, numpy):
    logp = r.get_extra_model_outputs("action_logp")
    observations = r.get_observations()
    return (len(r) == N_APPEND + 1 and r.is_numpy == numpy
            and isinstance(observations, np.ndarray) == numpy
            and np.array_equal(r.get_observations(-1), _obs(N_APPEND + 1))
            and len(logp) == N_APPEND + 1 and type(logp[-1]) is np.float32
            and logp[-1] == _logp()[-1] and (not numpy or logp.dtype == np.float32))


def _is_ma_run(r, steps, numpy=False):
    """r is the multi-agent episode of all env steps of `steps`."""
    last = {}
    for obs, _, _ in steps:
        last.update(obs)
    final = r.get_observations(-1, env_steps=False)
    n = len(steps) - 1
    return (r.env_t == n and len(r) == n and r.is_numpy == numpy
            and set(r.agent_episodes) == set(last)
            and all(np.array_equal(final[aid], o) for aid, o in last.items()))


def _is_filled_turns(r):
    """r is each agent's last four env steps of actions, 0 where it waited."""
    turns = _ma_turns()
    expected = {"a0": [], "a1": []}
    for t in range(N_MA - 4, N_MA):
        (actor, action), = turns[t + 1][1].items()
        for aid in expected:
            expected[aid].append(action if aid == actor else 0)
    return r == expected


def _is_vector_run(r):
    """r is every episode of the vector workload: as many steps as the sub-envs
    took (resets are no steps), each ended one terminated."""
    _, _, _, terminateds = _vector_steps()
    resets = int(terminateds[:-1].sum())       # the step after an end is a reset
    return (sum(len(e) for e in r) == N_VEC_ENVS * N_VEC_STEPS - resets
            and sum(bool(e.is_terminated) for e in r) == int(terminateds.sum())
            and len(r) == N_VEC_ENVS + int(terminateds.sum()) - int(terminateds[-1].sum()))


def _is_training_batch(r):
    """r is the 1,000-timestep training batch of the CartPole-sized steps."""
    obs = np.stack(_cartpole().obs[:N_COLLECT + 1])
    actions = np.array(_cartpole().actions[:N_COLLECT])
    padded = np.concatenate([obs[:1]] * 3 + [obs[:N_COLLECT]])
    frames = np.stack([padded[t:t + 4] for t in range(N_COLLECT)])
    return (set(r) == {"obs", "new_obs", "actions", "rewards", "prev_actions", "prev_rewards",
                       "frames"}
            and np.array_equal(r["obs"], obs[:-1]) and np.array_equal(r["new_obs"], obs[1:])
            and np.array_equal(r["prev_actions"], np.concatenate([[0], actions[:-1]]))
            and r["rewards"].dtype == np.float32 and r["prev_rewards"][0] == 0
            and np.array_equal(r["frames"], frames))


def _is_inference_input(r):
    """r is the 64 episodes' inputs: episode k has 20 + k steps."""
    obs = _cartpole().obs
    return (set(r) == {"obs", "prev_obs", "frames"} and r["frames"].shape == (64, 4, 4)
            and all(np.array_equal(r["obs"][k], obs[20 + k])
                    and np.array_equal(r["prev_obs"][k], obs[19 + k])
                    and np.array_equal(r["frames"][k], np.stack(obs[17 + k:21 + k]))
                    for k in range(64)))


def _is_collector_inference(r, steps_in=10):
    """r is the 64 collectors' batches: collector k is steps_in + k steps in
    (its prev_actions / prev_rewards one step late, as RLlib's collector
    reads them at inference)."""
    steps = _cartpole()
    obs = steps.obs
    return len(r) == 64 and all(
        set(b) == {"obs", "prev_actions", "prev_rewards", "frames"}
        and np.array_equal(b["obs"], obs[n][None])
        and np.array_equal(b["frames"], np.stack(obs[n - 3:n + 1])[None])
        and b["prev_actions"].dtype == np.int64 and b["prev_actions"][0] == steps.actions[n - 2]
        and b["prev_rewards"].dtype == np.float32
        and b["prev_rewards"][0] == np.float32(steps.rewards[n - 2])
        for n, b in enumerate(r, start=steps_in))


def _is_replay_add(r):
    """r is (steps, episodes) of a buffer that keeps the newest whole
    episodes: they fit the capacity, one more would not."""
    lengths = [len(actions) for _, actions, _, _ in _replay_data()]
    steps, episodes = r
    return (0 < episodes < len(lengths) and steps == sum(lengths[-episodes:]) <= N_REPLAY
            < sum(lengths[-episodes - 1:]))


def _is_replay_sample(r):
    """r is 256 one-step transitions with their importance weights in (0, 1]
    and n-steps of 3 (less at an episode's end)."""
    return (len(r) == N_DRAWN and all(len(e) == 1 for e in r)
            and all(0 < e.get_extra_model_outputs("weights")[0] <= 1 for e in r)
            and all(1 <= e.get_extra_model_outputs("n_step")[0] <= 3 for e in r))


EXPECTED = {
    "replay_add": _is_replay_add,
    "replay_sample_prioritized": _is_replay_sample,
    "collector_build_for_training": _is_training_batch,
    "views_build_for_training": _is_training_batch,
    "views_inference_64": _is_inference_input,
    "collector_inference_64": _is_collector_inference,
    "collector_step_inference_64": functools.partial(_is_collector_inference, steps_in=11),
    "collector_step_inference_64_training": functools.partial(_is_collector_inference,
                                                              steps_in=11),
    "sampler_cartpole_64": lambda r: r is True,
    "sampler_bookkeeping_64": lambda r: r is True,
    "vector_append_64": _is_vector_run,
    "vector_append_64_running": lambda r: len(r) == N_VEC_ENVS
    and all(len(e) == N_VEC_STEPS and not e.is_done for e in r)
    and all(np.array_equal(e.get_observations(-1), _vector_steps()[0][-1][k])
            for k, e in enumerate(r)),
    "ma_add_env_step_2": lambda r: _is_ma_run(r, _ma_steps(2)),
    "ma_add_env_step_8": lambda r: _is_ma_run(r, _ma_steps(8)),
    "ma_add_env_step_turns": lambda r: _is_ma_run(r, _ma_turns())
    and list(r._hanging_actions_end) == ["a1"],
    "ma_get_observations_last": lambda r: r.keys() == {"a0", "a1"}
    and all(np.array_equal(r[aid], _ma_steps(2)[-1][0][aid]) for aid in r),
    "ma_get_actions_filled": _is_filled_turns,
    "ma_cut": lambda r: len(r) == 0 and r.env_t_started == N_MA and not r.is_numpy
    and set(r.agent_episodes) == {"a0", "a1"},
    "ma_to_numpy": lambda r: _is_ma_run(r, _ma_steps(2), numpy=True),
    "ma_pickle_roundtrip": lambda r: _is_ma_run(r, _ma_steps(2), numpy=True),
    "ma_pickle_roundtrip_list": lambda r: _is_ma_run(r, _ma_steps(2)),
    "ma_pickle_roundtrip_10k": lambda r: _is_ma_run(r, _ma_steps(2, N_STEPS), numpy=True),
    "add_env_step": lambda r: len(r) == N_COLLECT and not r.is_numpy,
    "collect_to_numpy_cartpole": lambda r: len(r) == N_COLLECT and r.is_numpy
    and r.get_observations().dtype == np.float32,
    "collect_to_numpy_atari": lambda r: r.is_numpy
    and r.get_observations().shape == (N_COLLECT + 1, 84, 84, 4),
    "get_observations_last": lambda r: np.array_equal(r, _obs(N_STEPS)),
    "frame_stack": lambda r: np.array_equal(r, np.stack([np.zeros(4, np.float32)] * 3 + [_obs(0)])),
    "frame_stack_mid": lambda r: np.array_equal(r, np.stack([_obs(i) for i in range(4997, 5001)])),
    "slice_64": lambda r: len(r) == 64 and r.t_started == 100,
    "cut_lookback_1": lambda r: len(r) == 0 and r.t_started == N_STEPS and r.is_numpy,
    "cut_lookback_1_list": lambda r: len(r) == 0 and r.t_started == N_STEPS and not r.is_numpy,
    "append_after_to_numpy": lambda r: len(r) == N_STEPS + N_COLLECT and r.is_numpy,
    "pickle_roundtrip_10k": lambda r: len(r) == N_STEPS and r.is_numpy,
    "concat": lambda r: len(r) == 2 * N_COLLECT and r.t == 2 * N_COLLECT,
    "collect_to_numpy_dict": lambda r: len(r) == N_COLLECT and r.is_numpy
    and _is_dict_frames(r.get_observations(), range(N_COLLECT + 1)),
    "get_observations_dict_last4": lambda r: _is_dict_frames(r, range(N_COLLECT - 3,
                                                                      N_COLLECT + 1)),
    "frame_stack_dict": lambda r: _is_dict_frames(r, [None, None, None, 0]),
    "construct": lambda r: len(r) == 0 and r.t == r.t_started == 0 and not r.is_numpy
    and r.get_observations() == [] and r.observation_space is None,
    "short_episode": _is_blackjack,
    "cut_10_list": lambda r: len(r) == 0 and r.t_started == N_CUT and not r.is_numpy
    and np.array_equal(r.get_observations(-1), _obs(N_CUT)),
    "append_after_to_numpy_logp": lambda r: _is_logp_append(r, numpy=True),
    "append_logp_list": lambda r: _is_logp_append(r, numpy=False),
    "state_pickle_roundtrip_10k": lambda r: isinstance(r, dict) and r["t"] == N_STEPS
    and np.array_equal(r["observations"]["data"], np.stack(_cartpole().obs[:N_STEPS + 1]))
    and r["observations"]["data"].dtype == np.float32
    and r["actions"]["data"].tolist() == _cartpole().actions[:N_STEPS],
}


# Workloads whose rounds each take their inputs one step further (a
# sampler's rhythm): the same work on the next step's data. What their second
# round gives.
NEXT_ROUND = {
    "collector_step_inference_64": functools.partial(_is_collector_inference, steps_in=12),
    "collector_step_inference_64_training": functools.partial(_is_collector_inference,
                                                              steps_in=12),
}


def test_every_workload_has_an_expectation():
    assert set(EXPECTED) == set(WORKLOADS)
    assert set(NEXT_ROUND) <= set(WORKLOADS)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_does_what_it_says_and_rllibs_does_the_same(name):
    """Each workload runs here once per side (the command line's bench runs a
    few of them, tests/test_cli.py): ours gives what it says, round after
    round, and RLlib's (where ray[rllib] is installed) gives the same."""
    prepared = WORKLOADS[name].prepare(SingleAgentEpisode)
    result = prepared.once()
    assert EXPECTED[name](result)
    if name in NEXT_ROUND:
        assert NEXT_ROUND[name](prepared.once())
    else:
        # Rounds are repeatable: every timed round does the same work.
        assert_same(prepared.once(), result)
    rllib = rllib_class()
    if rllib is None:
        return
    if name.startswith("sampler_"):
        pytest.importorskip("torch")   # RLlib's EnvRunner needs it
    assert_same(result, WORKLOADS[name].prepare(rllib).once())


@pytest.mark.parametrize("name", list(NEXT_ROUND))
def test_collector_rhythm_reads_the_newest_steps_past_a_fragments_end(name):
    """Rounds of the sampler's rhythm past the point where the training-mode
    collectors end a fragment (build_for_training keeps only the last rows):
    each batch still reads its collector's newest steps."""
    prepared = WORKLOADS[name].prepare(SingleAgentEpisode)
    for _ in range(N_FRAGMENT + 5):
        batches = prepared.once()
    assert _is_collector_inference(batches, steps_in=10 + N_FRAGMENT + 5)


def test_check_compares_a_workload_with_rllibs(monkeypatch):
    # RLlib's side stands in as a subclass of ours: the same results pass,
    # others fail.
    class Other(SingleAgentEpisode):
        pass

    monkeypatch.setattr(workloads, "rllib_class", lambda: Other)
    check(WORKLOADS["slice_64"])
    differs = Workload("differs", "", 1, lambda cls: Round(lambda: cls is Other))
    with pytest.raises(AssertionError):
        check(differs)
    monkeypatch.setattr(workloads, "rllib_class", lambda: None)
    with pytest.raises(ImportError, match="ray"):
        check(WORKLOADS["slice_64"])


def test_assert_same_tells_where_results_differ():
    with pytest.raises(AssertionError, match=r"value\[1\]"):
        assert_same([1, 2.0], [1, 2])
    with pytest.raises(AssertionError, match="float32"):
        assert_same(np.zeros(2, np.float32), np.zeros(2))


def test_assert_same_on_state_dicts_ignores_only_ids_and_times():
    a, b = SingleAgentEpisode(), SingleAgentEpisode()
    a.add_env_reset(_obs(0))
    b.add_env_reset(_obs(0))
    assert a.get_state()["id_"] != b.get_state()["id_"]
    assert_same(a.get_state(), b.get_state())
    b.add_env_step(_obs(1), 0, 1.0)
    with pytest.raises(AssertionError, match=r"value\['observations'\]"):
        assert_same(a.get_state(), b.get_state())
