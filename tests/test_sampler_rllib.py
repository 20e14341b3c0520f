"""episode.Sampler in truncate mode against RLlib 2.60's EnvRunners.

For the same seeded envs (sub-env i seeded with seed + i), random actions
drawn from the same seeded spaces (see sampler_rllib_tools), the same
rollout_fragment_length and number of envs, every sample_episodes() call
must return what the runner's sample() returns: the same episodes in the
same order (done ones, then the cut chunks of ongoing ones), with the same
data, lookbacks and done flags, and the same step and episode counts.
"""
from __future__ import annotations

import itertools

import pytest

pytest.importorskip("ray.rllib")
pytest.importorskip("torch")

import sampler_rllib_tools as tools  # noqa: E402

pytestmark = pytest.mark.rllib

ENV_ID = "CartPole-v1"
CALLS = 5
NUM_ENVS = (1, 3, 8)
FRAGMENTS = (1, 7, 50)


@pytest.fixture(scope="module")
def multi_agent_cartpole():
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    return MultiAgentCartPole


@pytest.fixture(scope="module")
def sampler_class():
    from episode import Sampler
    return Sampler


def _multi_agent_env(env_class, config: dict, num_envs: int):
    """The Sampler's env argument: the env itself for one sub-env, a function
    making one for several."""
    if num_envs == 1:
        return env_class(dict(config))
    return lambda: env_class(dict(config))


def _compare(sampler, rllib: list, record) -> None:
    """CALLS sample_episodes() calls of `sampler` give RLlib's records."""
    try:
        ours = _our_records(sampler, CALLS, record)
    finally:
        sampler.close()
    _assert_same_calls(ours, rllib)


def _counts(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "episodes"}


def _our_records(sampler, calls: int, record) -> list:
    out = []
    for _ in range(calls):
        episodes = sampler.sample_episodes()
        metrics = sampler.get_metrics()
        out.append({
            "episodes": [record(e) for e in episodes],
            "env_steps": metrics["env_steps"],
            "agent_steps": metrics["agent_steps"],
            "episodes_done": metrics["episodes_done"],
            "episode_lengths": list(metrics["episode_lengths"]),
            "episode_returns": [float(r) for r in metrics["episode_returns"]],
        })
    return out


def _assert_same_calls(ours: list, rllib: list) -> None:
    for call, (a, b) in enumerate(zip(ours, rllib)):
        assert len(a["episodes"]) == len(b["episodes"]), f"call {call}: episode count"
        for k, (x, y) in enumerate(zip(a["episodes"], b["episodes"])):
            assert x == y, f"call {call}, episode {k}"
        assert _counts(a) == _counts(b), f"call {call}: counts"
    assert len(ours) == len(rllib)


# RLlib alone: the records are reproducible and tell runs apart, and the
# counting rule the Sampler follows holds. Record fields by position:
# single-agent (len, t_started, ..., terminated, truncated), multi-agent
# (env_t_started, env_t, terminated, truncated, agents, mappings).

def test_rllib_records_reproducible_and_seed_dependent():
    first = tools.single_agent_records(ENV_ID, 3, 7, 5, 3)
    assert first == tools.single_agent_records(ENV_ID, 3, 7, 5, 3)
    assert first != tools.single_agent_records(ENV_ID, 3, 7, 6, 3)


def test_rllib_multi_agent_records_reproducible(multi_agent_cartpole):
    args = (multi_agent_cartpole, {"num_agents": 2}, 3, 7, 5, "env_steps", 3)
    first = tools.multi_agent_records(*args)
    assert first == tools.multi_agent_records(*args)


@pytest.mark.parametrize("num_envs,fragment", [(3, 7), (8, 50)])
def test_rllib_env_step_rule(num_envs, fragment):
    """Each call: at least fragment * num_envs env steps, at most num_envs - 1
    more (sub-envs step together; reset steps count nothing), all of them in
    the returned episodes; the first call's episodes all start at t=0."""
    records = tools.single_agent_records(ENV_ID, num_envs, fragment, 0, 4)
    target = fragment * num_envs
    for record in records:
        assert target <= record["env_steps"] <= target + num_envs - 1
        assert record["agent_steps"] == record["env_steps"]
        assert sum(e[0] for e in record["episodes"]) == record["env_steps"]
        assert record["episodes_done"] == sum(e[-2][1] or e[-1][1] for e in record["episodes"])
    assert all(e[1] == 0 for e in records[0]["episodes"])


@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
def test_rllib_multi_agent_step_rule(multi_agent_cartpole, count_steps_by):
    """Agent steps are the agents with an observation in a step; in
    agent_steps mode a call stops at the first vector step that reaches
    fragment * num_envs agent steps, so it overshoots by less than the
    agent steps of one vector step."""
    num_envs, fragment, agents = 3, 7, 3
    records = tools.multi_agent_records(multi_agent_cartpole, {"num_agents": agents},
                                        num_envs, fragment, 0, count_steps_by, 4)
    target = fragment * num_envs
    for record in records:
        counted = record[count_steps_by]
        assert target <= counted <= target + num_envs * agents - 1
        assert sum(e[1] - e[0] for e in record["episodes"]) == record["env_steps"]
        assert sum(a[1][0] for e in record["episodes"] for a in e[4]) == record["agent_steps"]


def test_rllib_counts_first_observations_as_agent_steps():
    """Turn-taking agents: each step gives one agent an observation, which
    the runner counts as an agent step even where it only starts that
    agent's episode (agent "b"'s first observation)."""
    record, = tools.multi_agent_records(tools.turn_taking_class(), {}, 1, 5, 0,
                                        "env_steps", 1)
    assert (record["env_steps"], record["agent_steps"]) == (5, 5)
    assert sum(a[1][0] for e in record["episodes"] for a in e[4]) == 4


# The Sampler against the runners.

@pytest.mark.parametrize("num_envs,fragment,seed",
                         [(n, f, s) for (n, f), s in zip(itertools.product(NUM_ENVS, FRAGMENTS),
                                                         itertools.cycle((0, 11, 123)))])
def test_single_agent_matches_rllib(sampler_class, num_envs, fragment, seed):
    rllib = tools.single_agent_records(ENV_ID, num_envs, fragment, seed, CALLS)
    sampler = sampler_class(ENV_ID, num_envs=num_envs, rollout_fragment_length=fragment,
                            seed=seed)
    _compare(sampler, rllib, tools.episode_record)


@pytest.mark.parametrize("num_envs,fragment", [(1, 7), (3, 7), (8, 3)])
def test_single_agent_truncated_episodes_match_rllib(sampler_class, num_envs, fragment):
    """CartPole cut at 10 steps: episodes end truncated, often together."""
    env_id = tools.short_cartpole()
    rllib = tools.single_agent_records(env_id, num_envs, fragment, 3, CALLS)
    assert any(e[-1][1] for call in rllib for e in call["episodes"])
    sampler = sampler_class(env_id, num_envs=num_envs, rollout_fragment_length=fragment, seed=3)
    _compare(sampler, rllib, tools.episode_record)


@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
def test_multi_agent_truncated_episodes_match_rllib(sampler_class, count_steps_by):
    """Agents truncated together: RLlib's make_multi_agent envs then also
    report "__all__" terminated, so the episode and its agents end both
    terminated and truncated."""
    from ray.rllib.env.multi_agent_env import make_multi_agent
    env_class = make_multi_agent(tools.short_cartpole())
    config = {"num_agents": 2}
    rllib = tools.multi_agent_records(env_class, config, 3, 7, 4, count_steps_by, CALLS)
    assert any(e[3] for call in rllib for e in call["episodes"])
    sampler = sampler_class(_multi_agent_env(env_class, config, 3), num_envs=3,
                            rollout_fragment_length=7, count_steps_by=count_steps_by, seed=4)
    _compare(sampler, rllib, tools.ma_episode_record)


@pytest.mark.parametrize("agents", [2, 3])
@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
@pytest.mark.parametrize("num_envs,fragment", list(itertools.product(NUM_ENVS, FRAGMENTS)))
def test_multi_agent_matches_rllib(sampler_class, multi_agent_cartpole, agents,
                                   count_steps_by, num_envs, fragment):
    seed = 7 * agents + num_envs
    config = {"num_agents": agents}
    rllib = tools.multi_agent_records(multi_agent_cartpole, config, num_envs, fragment, seed,
                                      count_steps_by, CALLS)
    sampler = sampler_class(_multi_agent_env(multi_agent_cartpole, config, num_envs),
                            num_envs=num_envs,
                            rollout_fragment_length=fragment, count_steps_by=count_steps_by,
                            seed=seed)
    _compare(sampler, rllib, tools.ma_episode_record)


@pytest.mark.parametrize("count_steps_by", ["env_steps", "agent_steps"])
@pytest.mark.parametrize("num_envs,fragment", [(1, 5), (2, 4)])
def test_turn_taking_matches_rllib(sampler_class, count_steps_by, num_envs, fragment):
    """Agents that get observations in steps they did not act in: counted
    the runner's way (agents with an observation), chunks keep the
    runner's per-agent data."""
    env_class = tools.turn_taking_class()
    rllib = tools.multi_agent_records(env_class, {}, num_envs, fragment, 0, count_steps_by,
                                      CALLS)
    sampler = sampler_class(_multi_agent_env(env_class, {}, num_envs), num_envs=num_envs,
                            rollout_fragment_length=fragment, count_steps_by=count_steps_by,
                            seed=0)
    _compare(sampler, rllib, tools.ma_episode_record)


def test_complete_episodes_rllib_resets_every_call_ours_goes_on():
    """A difference (docs/differences.md): RLlib's runner, in complete_episodes mode,
    returns num_envs episodes per call and resets its envs for the next one
    (what was sampled of the running episodes is dropped); ours returns
    finished episodes covering rollout_fragment_length x num_envs steps and
    keeps the running ones for the next call."""
    from episode import Sampler

    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (PPOConfig().environment(ENV_ID)
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=200,
                           batch_mode="complete_episodes").debugging(seed=0))
    runner = SingleAgentEnvRunner(config=config)
    for _ in range(2):
        episodes = runner.sample(random_actions=True)
        assert len(episodes) == 2 and all(e.is_done and e.t_started == 0 for e in episodes)
    sampler = Sampler(ENV_ID, num_envs=2, rollout_fragment_length=200, seed=0,
                      batch_mode="complete_episodes")
    episodes = sampler.sample_episodes()
    assert sum(len(e) for e in episodes) >= 400 and all(e.is_done for e in episodes)
    # The running episodes (those not between episodes) keep their steps.
    assert sum(len(e) for e in sampler.ongoing_episodes()) > 0
    sampler.close()
