"""The `episode` command (`python -m episode`): a sampling demo, a benchmark,
and recording and inspecting datasets of episodes.

    episode demo [--env CartPole-v1] [--num-envs 1] [--agents N] [--steps 100000]
                 [--batch-mode truncate_episodes] [--rollout-fragment-length 200] ...
    episode bench [--rounds 7] [--workloads a,b] [--json PATH] [--plot PATH]
    episode record --env ID --steps N --out DIR [--policy module:function]
                   [--num-envs 1] [--format parquet|arrow] [--compression C] ...
    episode inspect DIR [--json]
    episode --version

`demo` runs an episode.Sampler on a gymnasium environment (or a multi-agent
one: N copies of a gymnasium env as agents, a PettingZoo ParallelEnv or an
RLlib MultiAgentEnv) with random actions; `bench` times the workloads of
episode.cli.workloads for ours and, when ray[rllib] is installed, for RLlib's
SingleAgentEpisode in the same process; `record` samples an env as `demo`
takes them (random actions, or a policy function) into a dataset with
episode.offline's EpisodeWriter; `inspect` describes a dataset read_episodes
opens (files, schema, counts, episode-length and return statistics).
Without a command, `demo` runs.

User errors (bad paths, foreign or damaged datasets among them) print one
line, ``episode: error: ...``, and exit with status 2; Ctrl-C prints what was
measured (or recorded: `record` writes what it sampled) so far and exits with
status 130.
"""
from __future__ import annotations

from episode.cli.parser import main

__all__ = ["main"]
