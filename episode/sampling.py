"""Sampling from gymnasium vector envs into episodes.

`VectorEpisodes` keeps one running SingleAgentEpisode per sub-env of a
`gymnasium.vector.VectorEnv` and adds each `env.step()` result to all of them
in one call. It follows the env's autoreset mode, so that no reset
observation is lost or recorded twice:

- ``NextStep`` (gymnasium's default): the step after a sub-env's episode
  ended resets that sub-env and ignores its action; its observation starts
  the sub-env's next episode and no step is recorded.
- ``SameStep``: the step that ends an episode already returns the next
  episode's reset observation; the last observation of the ended episode is
  in ``infos["final_obs"]`` (its infos in ``infos["final_info"]``).

Rows are stored as the env hands them out (rewards as numpy scalars, done
flags as numpy bools), as RLlib's SingleAgentEnvRunner appends them.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from episode._episode import append_rows
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["VectorEpisodes"]

AUTORESET_MODES = ("NextStep", "SameStep")


def _mode_name(mode: Any) -> str:
    name = getattr(mode, "value", mode)
    if name not in AUTORESET_MODES:
        raise ValueError(f"autoreset_mode must be one of {AUTORESET_MODES} (or gymnasium's "
                         f"AutoresetMode of them), got {mode!r}")
    return name


def sub_env_infos(infos: Any, index: int) -> dict:
    """Sub-env `index`'s infos out of a vector env's infos dict (each key an
    array over sub-envs, masked by the ``"_" + key`` array; nested dicts
    likewise)."""
    if not infos:
        return {}
    out = {}
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_"):
            continue
        mask = infos.get("_" + key) if isinstance(key, str) else None
        if mask is not None and not mask[index]:
            continue
        out[key] = sub_env_infos(value, index) if isinstance(value, dict) else value[index]
    return out


class VectorEpisodes:
    """The running episodes of a vector env's sub-envs, stepped together.

    Args:
        num_envs: The number of sub-envs.
        observation_space: Each sub-env's observation space (optional).
        action_space: Each sub-env's action space (optional).
        autoreset_mode: "NextStep" or "SameStep" (or gymnasium's AutoresetMode).

    After `add_reset()`, `episodes[k]` is sub-env k's running episode. Each
    `add_step()` returns the episodes that ended in it.
    """

    def __init__(self, num_envs: int, *, observation_space: Any = None,
                 action_space: Any = None, autoreset_mode: Any = "NextStep"):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
                or num_envs <= 0:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        self.num_envs = int(num_envs)
        self.observation_space = observation_space
        self.action_space = action_space
        self.autoreset_mode = _mode_name(autoreset_mode)
        self.episodes: list = [None] * self.num_envs
        # NextStep: sub-envs whose next step is their reset.
        self._resetting = np.zeros(self.num_envs, dtype=bool)

    @classmethod
    def for_env(cls, env: Any) -> "VectorEpisodes":
        """VectorEpisodes for gymnasium vector env `env` (its sub-env count,
        single spaces and autoreset mode)."""
        return cls(env.num_envs, observation_space=env.single_observation_space,
                   action_space=env.single_action_space,
                   autoreset_mode=env.metadata.get("autoreset_mode", "NextStep"))

    def _new_episode(self, observation: Any, infos: dict) -> SingleAgentEpisode:
        episode = SingleAgentEpisode(observation_space=self.observation_space,
                                     action_space=self.action_space)
        episode.add_env_reset(observation, infos)
        return episode

    def _check_batch(self, **batches: Any) -> None:
        for name, batch in batches.items():
            try:
                n = len(batch)
            except TypeError:
                raise ValueError(f"{name} must have a leading axis of {self.num_envs} "
                                 f"sub-envs, got {type(batch).__name__}") from None
            if n != self.num_envs:
                raise ValueError(f"{name} must have a leading axis of {self.num_envs} "
                                 f"sub-envs, got {n}")

    def add_reset(self, observations: Any, infos: Optional[dict] = None) -> None:
        """Starts one episode per sub-env with `env.reset()`'s result."""
        self._check_batch(observations=observations)
        self.episodes = [self._new_episode(observations[k], sub_env_infos(infos, k))
                         for k in range(self.num_envs)]
        self._resetting = np.zeros(self.num_envs, dtype=bool)

    def add_step(self, observations: Any, actions: Any, rewards: Any, terminateds: Any,
                 truncateds: Any, infos: Optional[dict] = None, *,
                 extra_model_outputs: Optional[dict] = None) -> list:
        """Adds one `env.step(actions)` result to every sub-env's episode
        (batches with a leading axis of num_envs; `extra_model_outputs` a
        dict of such batches). Returns the episodes that ended in this step;
        their sub-envs go on in new episodes. Checks every batch before
        anything is added."""
        if self.episodes[0] is None:
            raise RuntimeError("add_step() before add_reset(): call it with env.reset()'s "
                               "result first")
        outputs = extra_model_outputs or {}
        self._check_batch(observations=observations, actions=actions, rewards=rewards,
                          terminateds=terminateds, truncateds=truncateds,
                          **{f"extra_model_outputs[{k!r}]": v for k, v in outputs.items()})
        same_step = self.autoreset_mode == "SameStep"
        final_obs = final_infos = None
        if same_step and infos:
            final_obs = infos.get("final_obs")
            final_infos = infos.get("final_info")
        if same_step and final_obs is None and any(
                bool(terminateds[k]) or bool(truncateds[k])
                for k in range(self.num_envs) if not self._resetting[k]):
            raise ValueError("a SameStep vector env ended an episode without "
                             "infos['final_obs']")
        if not outputs and self._batchable(observations, actions, rewards, terminateds,
                                           truncateds, infos):
            return self._add_batch(observations, actions, rewards, terminateds, truncateds,
                                   infos, final_obs, final_infos)
        done = []
        for k in range(self.num_envs):
            self._sub_env_step(k, observations, actions, rewards, terminateds, truncateds,
                               infos, outputs, final_obs, final_infos, done, appended=False)
        return done

    def _sub_env_step(self, k, observations, actions, rewards, terminateds, truncateds,
                      infos, outputs, final_obs, final_infos, done, appended) -> None:
        """Sub-env k's part of a step: its NextStep reset, or its step (unless
        the batch pass `appended` it) and, if its episode ended, the end."""
        if self._resetting[k]:
            # NextStep: this step reset the sub-env (its action was ignored).
            self.episodes[k] = self._new_episode(observations[k], sub_env_infos(infos, k))
            self._resetting[k] = False
            return
        terminated, truncated = terminateds[k], truncateds[k]
        ended = bool(terminated) or bool(truncated)
        same_step = self.autoreset_mode == "SameStep"
        episode = self.episodes[k]
        if not appended:
            if ended and same_step:
                last_obs, last_infos = final_obs[k], sub_env_infos(final_infos, k)
            else:
                last_obs, last_infos = observations[k], sub_env_infos(infos, k)
            episode.add_env_step(last_obs, actions[k], rewards[k], last_infos,
                                 terminated=terminated, truncated=truncated,
                                 extra_model_outputs={key: value[k]
                                                      for key, value in outputs.items()}
                                 if outputs else None)
        if ended:
            done.append(episode)
            if same_step:
                self.episodes[k] = self._new_episode(
                    observations[k], sub_env_infos(_without_final(infos), k))
            else:
                self._resetting[k] = True

    def _batchable(self, observations, actions, rewards, terminateds, truncateds,
                   infos) -> bool:
        """Whether the compiled pass takes this step: ndarray batches, bool
        flags, and no infos but a SameStep env's final entries."""
        return (type(observations) is np.ndarray and observations.flags.c_contiguous
                and type(actions) is np.ndarray and actions.flags.c_contiguous
                and type(rewards) is np.ndarray and rewards.flags.c_contiguous
                and type(terminateds) is np.ndarray and terminateds.dtype == np.bool_
                and terminateds.ndim == 1
                and type(truncateds) is np.ndarray and truncateds.dtype == np.bool_
                and truncateds.ndim == 1
                and not _without_final(infos))

    def _add_batch(self, observations, actions, rewards, terminateds, truncateds, infos,
                   final_obs, final_infos) -> list:
        """add_step() of ndarray batches without infos or extra outputs: the
        ongoing sub-envs' rows in one compiled pass (append_rows), the
        resets and ends after it, sub-env by sub-env."""
        resetting = self._resetting.copy()
        ended = terminateds | truncateds
        same_step = self.autoreset_mode == "SameStep"
        todo = ~resetting & ~ended if same_step else ~resetting
        append_rows(self.episodes, observations, actions, rewards, terminateds, truncateds,
                    todo)
        done = []
        # NextStep ends were appended above, SameStep ends need their final
        # observation: the resets and ends, sub-env by sub-env.
        for k in np.flatnonzero(resetting | ended).tolist():
            self._sub_env_step(k, observations, actions, rewards, terminateds, truncateds,
                               infos, None, final_obs, final_infos, done,
                               appended=not same_step)
        return done

    def cut(self, len_lookback_buffer: int = 0) -> list:
        """The running episodes' chunks so far (those with steps, and not
        waiting for their NextStep reset); each sub-env goes on in its
        chunk's successor (`cut(len_lookback_buffer)`)."""
        chunks = []
        for k, episode in enumerate(self.episodes):
            if episode is None or self._resetting[k] or len(episode) == 0:
                continue
            self.episodes[k] = episode.cut(len_lookback_buffer=len_lookback_buffer)
            chunks.append(episode)
        return chunks


def _without_final(infos: Optional[dict]) -> Optional[dict]:
    # A SameStep step's infos minus the ended episodes' final entries: the
    # reset infos of the sub-envs' next episodes.
    if not infos:
        return infos
    return {k: v for k, v in infos.items()
            if k not in ("final_obs", "_final_obs", "final_info", "_final_info")}
