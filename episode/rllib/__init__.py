"""RLlib on our episode classes.

`install()` makes every loaded `ray.rllib` module use our
`SingleAgentEpisode`, `MultiAgentEpisode` and `InfiniteLookbackBuffer`, and
our four episode replay buffers (`episode.replay`), in place of RLlib's
own: each module attribute that is one of RLlib's classes becomes ours
(RLlib's string names of the buffers in a `replay_buffer_config` then make
ours too). The modules that define them are among those, so a module
imported later gets ours too. Learner connector pipelines get the fast
path for replayed episodes (`episode.rllib.learner`). Ray worker processes
started afterwards do the same before they run anything (`ray.init()` gets
a worker setup hook). `uninstall()` puts RLlib's classes back; `installed()` is both as a
context manager::

    import episode.rllib
    episode.rllib.install()      # before building the algorithm
    algo = PPOConfig().environment("CartPole-v1").build_algo()

RLlib's own code tells episodes apart by their class, so one process must
not mix the two kinds: `install()` refuses while an episode or buffer of
RLlib's classes is alive.

The package holds that switch (`patch`), the env runners that sample
through our episodes (`runners`: `SingleAgentEnvRunner`,
`MultiAgentEnvRunner`), the learner's side of a replayed batch
(`learner`) and RLlib's offline API on our datasets (`offline`: its
recording runners, `OfflineData` and `OfflinePreLearner`).

Importing this package does not import ray; `install()` does, and so
does importing `episode.rllib.runners` or `episode.rllib.learner`.
"""
from episode.rllib.patch import install, installed, is_installed, uninstall, worker_setup

__all__ = ["install", "installed", "is_installed", "uninstall", "worker_setup"]
