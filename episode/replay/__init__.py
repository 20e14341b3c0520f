"""Replay buffers on the compiled store: RLlib's four episode buffers as
drop-ins, and a native batch sampler.

`EpisodeReplayBuffer`, `PrioritizedEpisodeReplayBuffer`,
`MultiAgentEpisodeReplayBuffer` and `MultiAgentPrioritizedEpisodeReplayBuffer`
have RLlib 2.60's constructor arguments, methods, counters, metrics and
`get_state()` keys. They keep their episodes' rows in a `Store` (typed
Columns, each observation once, the oldest episodes evicted whole) instead
of deep-copied episode objects, and draw with the same calls on the same
`rng` (a numpy Generator) as RLlib's buffers: the same seed gives the same
samples, so an algorithm trains with RLlib's curve.

`sample_batch()` is the path that builds no episode objects: a dict of
arrays per call (uniform or prioritized, n-step returns, sequences with a
mask); on the multi-agent buffers one such dict per module.

One module per buffer family (`uniform`, `prioritized`, `multi_agent`,
`multi_agent_prioritized`); beside them what they share: `stored`
(episodes into and out of a Store), `draws` (argument checks, n-step
transitions, the learner's columns) and `metrics`. The compiled half (the
Store, its sum trees and gathers) is `episode._replay`.

Importing this package does not import ray; RLlib's MetricsLogger is used
for the metrics when ray is installed (else a small logger of ours).
"""
from episode.replay.multi_agent import MultiAgentEpisodeReplayBuffer
from episode.replay.multi_agent_prioritized import MultiAgentPrioritizedEpisodeReplayBuffer
from episode.replay.prioritized import PrioritizedEpisodeReplayBuffer
from episode.replay.uniform import EpisodeReplayBuffer

__all__ = [
    "EpisodeReplayBuffer",
    "MultiAgentEpisodeReplayBuffer",
    "MultiAgentPrioritizedEpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer",
]

from episode.replay import kinds as _kinds

_kinds.register(EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer,
                MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer)

# The buffers pickle by reference to their class: under the package's name,
# so that a pickle does not depend on which module of the package defines it.
for _cls in (EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
             MultiAgentPrioritizedEpisodeReplayBuffer):
    _cls.__module__ = __name__
del _cls
