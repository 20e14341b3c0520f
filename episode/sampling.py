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

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import gymnasium as gym
import numpy as np

from episode._checks import in_box
from episode._episode import started_episode
from episode._vector import PendingRows, VectorCore
from episode.single_agent_episode import SingleAgentEpisode
from episode.spaces import batch_size, space_contains
from episode.typing import BatchMode, CountStepsBy, TrainingBatch

if TYPE_CHECKING:
    from episode.multi_agent_episode import MultiAgentEpisode
    from episode.views import ViewRequirement

__all__ = ["Sampler", "VectorEpisodes", "default_view_requirements"]

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
    likewise), or out of a list of one dict per sub-env (as RLlib's
    DictInfoToList wrapper hands them out)."""
    if not infos:
        return {}
    if isinstance(infos, list):
        return infos[index]
    out = {}
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_"):
            continue
        mask = infos.get("_" + key) if isinstance(key, str) else None
        if mask is not None and not mask[index]:
            continue
        out[key] = sub_env_infos(value, index) if isinstance(value, dict) else value[index]
    return out


class VectorEpisodes(VectorCore):
    """The running episodes of a vector env's sub-envs, stepped together.

    Args:
        num_envs: The number of sub-envs.
        observation_space: Each sub-env's observation space (optional).
        action_space: Each sub-env's action space (optional).
        autoreset_mode: "NextStep" or "SameStep" (or gymnasium's AutoresetMode).
        writer: An `episode.offline.EpisodeWriter` that records every
            episode handed on (by add_step, take_ended and cut), or None.

    After `add_reset()`, `episodes[k]` is sub-env k's running episode. Each
    `add_step()` returns the episodes that ended in it.
    """

    def __init__(self, num_envs: int, *, observation_space: Any = None,
                 action_space: Any = None, autoreset_mode: Any = "NextStep",
                 writer: Any = None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
                or num_envs <= 0:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        # (The fields are the compiled half's, VectorCore.)
        self.num_envs = int(num_envs)
        self.observation_space = observation_space
        self.action_space = action_space
        self.autoreset_mode = _mode_name(autoreset_mode)
        self._episodes = [None] * self.num_envs
        # The latest steps, until the episodes are read (see `episodes`).
        self._pending = PendingRows()
        self._resetting = np.zeros(self.num_envs, dtype=bool)
        self._episode_class = SingleAgentEpisode
        self.steps_added = 0
        self.ended_envs = []
        self.writer = writer

    def __reduce__(self) -> tuple:
        # The pending steps go into their episodes first.
        self._pending.flush_all(self._episodes)
        state = {name: getattr(self, name) for name in _VECTOR_FIELDS}
        return _restore_vector, (type(self), state, self.__dict__)

    @property
    def episodes(self) -> List[Optional[SingleAgentEpisode]]:
        """Sub-env k's running episode at k (None before add_reset), with
        every step added so far written into it."""
        self._pending.flush_all(self._episodes)
        return self._episodes

    @classmethod
    def for_env(cls, env: Any) -> "VectorEpisodes":
        """VectorEpisodes for gymnasium vector env `env` (its sub-env count,
        single spaces and autoreset mode)."""
        return cls(env.num_envs, observation_space=env.single_observation_space,
                   action_space=env.single_action_space,
                   autoreset_mode=env.metadata.get("autoreset_mode", "NextStep"))

    def _new_episode(self, observation: Any, infos: dict) -> SingleAgentEpisode:
        return started_episode(SingleAgentEpisode, self.observation_space, self.action_space,
                               observation, infos)

    def _check_batch(self, **batches: Any) -> None:
        for name, batch in batches.items():
            try:
                n = batch_size(batch)
            except TypeError:
                raise ValueError(f"{name} must have a leading axis of {self.num_envs} "
                                 f"sub-envs, got {type(batch).__name__}") from None
            if n != self.num_envs:
                raise ValueError(f"{name} must have a leading axis of {self.num_envs} "
                                 f"sub-envs, got {n}")

    def _check_infos(self, infos: Any) -> None:
        # A list of infos has one dict per sub-env; it carries no SameStep
        # final observations.
        if not isinstance(infos, list) or not infos:
            return
        if len(infos) != self.num_envs or not all(isinstance(i, dict) for i in infos):
            raise ValueError(f"infos as a list must hold one dict per sub-env "
                             f"({self.num_envs}), got {len(infos)} items")
        if self.autoreset_mode == "SameStep":
            raise ValueError("a SameStep vector env's infos must be gymnasium's dict of "
                             "batches (with 'final_obs'), not a list")

    def add_reset(self, observations: Any, infos: Optional[dict] = None) -> None:
        """Starts one episode per sub-env with `env.reset()`'s result."""
        self._check_batch(observations=observations)
        self._check_infos(infos)
        self._pending.flush_all(self._episodes)
        self._episodes = [self._new_episode(_row(observations, k), sub_env_infos(infos, k))
                          for k in range(self.num_envs)]
        self._resetting = np.zeros(self.num_envs, dtype=bool)

    # add_step() is compiled (VectorCore): the usual step there, the rest here.

    def _add_step_general(self, observations: Any, actions: Any, rewards: Any,
                          terminateds: Any, truncateds: Any, infos: Optional[dict],
                          extra_model_outputs: Optional[dict]) -> list:
        if self._episodes[0] is None:
            raise RuntimeError("add_step() before add_reset(): call it with env.reset()'s "
                               "result first")
        same_step = self.autoreset_mode == "SameStep"
        self._check_infos(infos)
        if (not infos or not _without_final(infos)) and \
                (extra_model_outputs is None or type(extra_model_outputs) is dict):
            # ndarray batches without infos: kept in one block, written into
            # the episodes a few dozen steps at a time.
            found = self._add_rows(self._episodes, observations, actions, rewards,
                                   terminateds, truncateds, self._resetting, same_step,
                                   bool(infos) and infos.get("final_obs") is not None, None,
                                   extra_model_outputs)
            if found is not None:
                return self._close(found, observations, actions, rewards, terminateds,
                                   truncateds, infos, extra_model_outputs)
        self._pending.flush_all(self._episodes)
        outputs = extra_model_outputs or {}
        self._check_batch(observations=observations, actions=actions, rewards=rewards,
                          terminateds=terminateds, truncateds=truncateds,
                          **{f"extra_model_outputs[{k!r}]": v for k, v in outputs.items()})
        final_obs, final_infos = self._finals(terminateds, truncateds, infos)
        done: list = []
        self.steps_added = self.num_envs - int(self._resetting.sum())
        self.ended_envs = []
        for k in range(self.num_envs):
            self._sub_env_step(k, observations, actions, rewards, terminateds, truncateds,
                               infos, outputs, final_obs, final_infos, done, appended=False)
        return done

    def _finals(self, terminateds: Any, truncateds: Any, infos: Optional[dict]) -> tuple:
        """A SameStep step's final observations and infos (None otherwise);
        ValueError if an episode ended without them."""
        if self.autoreset_mode != "SameStep":
            return None, None
        final_obs = infos.get("final_obs") if infos else None
        final_infos = infos.get("final_info") if infos else None
        if final_obs is None and any(bool(terminateds[k]) or bool(truncateds[k])
                                     for k in range(self.num_envs) if not self._resetting[k]):
            raise ValueError("a SameStep vector env ended an episode without "
                             "infos['final_obs']")
        return final_obs, final_infos

    def _close(self, found: tuple, observations, actions, rewards, terminateds, truncateds,
               infos, outputs: Optional[dict]) -> list:
        """After the compiled pass: the resets and ends, sub-env by sub-env."""
        resets, ends = found
        done: list = []
        self.steps_added = self.num_envs - len(resets)
        self.ended_envs = []
        if not resets and not ends:
            return done
        final_obs, final_infos = self._finals(terminateds, truncateds, infos)
        for k in sorted(resets + ends):
            self._sub_env_step(k, observations, actions, rewards, terminateds, truncateds,
                               infos, outputs, final_obs, final_infos, done,
                               appended=self.autoreset_mode != "SameStep")
        return done

    def _sub_env_step(self, k, observations, actions, rewards, terminateds, truncateds,
                      infos, outputs, final_obs, final_infos, done, appended) -> None:
        """Sub-env k's part of a step: its NextStep reset, or its step (unless
        the batch pass `appended` it) and, if its episode ended, the end."""
        if self._resetting[k]:
            # NextStep: this step reset the sub-env (its action was ignored).
            self._episodes[k] = self._new_episode(_row(observations, k), sub_env_infos(infos, k))
            self._resetting[k] = False
            return
        terminated, truncated = terminateds[k], truncateds[k]
        ended = bool(terminated) or bool(truncated)
        same_step = self.autoreset_mode == "SameStep"
        episode = self._episodes[k]
        if not appended:
            if ended and same_step:
                last_obs, last_infos = _row(final_obs, k), sub_env_infos(final_infos, k)
            else:
                last_obs, last_infos = _row(observations, k), sub_env_infos(infos, k)
            episode.add_env_step(last_obs, _row(actions, k), rewards[k], last_infos,
                                 terminated=terminated, truncated=truncated,
                                 extra_model_outputs={key: _row(value, k)
                                                      for key, value in outputs.items()}
                                 if outputs else None)
        if ended:
            done.append(episode)
            self.ended_envs.append(k)
            if same_step:
                self._episodes[k] = self._new_episode(
                    _row(observations, k), sub_env_infos(_without_final(infos), k))
            else:
                self._resetting[k] = True

    def cut(self, len_lookback_buffer: int = 0) -> List[SingleAgentEpisode]:
        """The running episodes' chunks so far (those with steps, and not
        waiting for their NextStep reset); each sub-env goes on in its
        chunk's successor (`cut(len_lookback_buffer)`)."""
        chunks = []
        episodes, resetting = self.episodes, self._resetting.tolist()
        for k, episode in enumerate(episodes):
            if episode is None or resetting[k] or len(episode) == 0:
                continue
            episodes[k] = episode.cut(len_lookback_buffer=len_lookback_buffer)
            chunks.append(episode)
        if self.writer is not None and chunks:
            self.writer.write(chunks)
        return chunks


# VectorCore's fields, as pickled.
_VECTOR_FIELDS = ("num_envs", "observation_space", "action_space", "autoreset_mode",
                  "_episodes", "_pending", "_resetting", "_episode_class", "steps_added",
                  "ended_envs")


def _restore_vector(cls: type, state: dict, extra: dict) -> VectorEpisodes:
    vec = cls.__new__(cls)
    for name, value in state.items():
        setattr(vec, name, value)
    vec.__dict__.update(extra)
    return vec


def _row(batch: Any, k: int) -> Any:
    """Sub-env k's item of a batch: a vector env batches Dict/Tuple items
    leaf by leaf (a dict or tuple of arrays with a leading sub-env axis)."""
    if isinstance(batch, dict):
        return {key: _row(value, k) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(value, k) for value in batch)
    return batch[k]


def _without_final(infos: Optional[dict]) -> Optional[dict]:
    # A SameStep step's infos minus the ended episodes' final entries: the
    # reset infos of the sub-envs' next episodes.
    if not infos or isinstance(infos, list):
        return infos
    return {k: v for k, v in infos.items()
            if k not in ("final_obs", "_final_obs", "final_info", "_final_info")}


# -- the sampler ----------------------------------------------------------------

BATCH_MODES = ("truncate_episodes", "complete_episodes")
# What every episode a Sampler hands on has (besides the policy's outputs).
SAMPLER_COLUMNS = ("obs", "actions", "rewards", "infos", "terminateds", "truncateds", "t",
                   "eps_id", "env_id", "agent_index", "unroll_id")
COUNT_STEPS_BY = ("env_steps", "agent_steps")


def default_view_requirements(observation_space: Any = None,
                              action_space: Any = None) -> Dict[str, ViewRequirement]:
    """The views RLlib's policies start from: the observation the action was
    taken on and the next one, the action, reward, done flags, infos and the
    sampler's bookkeeping columns. Only "obs" is read for computing actions."""
    from episode.views import ViewRequirement

    obs = {} if observation_space is None else {"space": observation_space}
    act = {} if action_space is None else {"space": action_space}
    train_only = {"used_for_compute_actions": False}
    return {
        "obs": ViewRequirement(**obs),
        "new_obs": ViewRequirement("obs", shift=1, **obs, **train_only),
        "actions": ViewRequirement(**act, **train_only),
        "rewards": ViewRequirement(**train_only),
        "terminateds": ViewRequirement(**train_only),
        "truncateds": ViewRequirement(**train_only),
        "infos": ViewRequirement(**train_only),
        "eps_id": ViewRequirement(**train_only),
        "unroll_id": ViewRequirement(**train_only),
        "agent_index": ViewRequirement(**train_only),
        "t": ViewRequirement(**train_only),
    }


def _is_multi_agent(env: Any) -> bool:
    # An RLlib MultiAgentEnv (get_action_space) or a PettingZoo parallel env
    # (possible_agents, not a gymnasium Env); a class is not an env.
    if isinstance(env, type):
        return False
    return (hasattr(env, "possible_agents") and not isinstance(env, gym.Env)) or \
        callable(getattr(env, "get_action_space", None))


class _MultiAgentEnv:
    """A PettingZoo parallel env or an RLlib MultiAgentEnv behind one API:
    RLlib's, with "__all__" in the done dicts."""

    def __init__(self, env: Any):
        self.env = env
        self.rllib = callable(getattr(env, "get_action_space", None))
        self._spaces: dict = {}

    @property
    def possible_agents(self) -> list:
        return list(self.env.possible_agents)

    def action_space(self, agent_id: Any) -> Any:
        if agent_id not in self._spaces:
            self._spaces[agent_id] = (self.env.get_action_space(agent_id) if self.rllib
                                      else self.env.action_space(agent_id))
        return self._spaces[agent_id]

    def observation_space(self, agent_id: Any) -> Any:
        return (self.env.get_observation_space(agent_id) if self.rllib
                else self.env.observation_space(agent_id))

    def reset(self, seed: Optional[int]) -> tuple:
        return self.env.reset(seed=seed)

    def step(self, actions: dict) -> tuple:
        obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
        if "__all__" not in terminateds:
            # PettingZoo: the episode ends once no agent is left.
            left = getattr(self.env, "agents", None)
            ended = not left
            terminateds = {**terminateds, "__all__": ended and any(terminateds.values())}
            truncateds = {**truncateds, "__all__": ended and not terminateds["__all__"]}
        return obs, rewards, terminateds, truncateds, infos

    def close(self) -> None:
        self.env.close()


def _vector_env(env: Any, num_envs: int) -> Any:
    if isinstance(env, str):
        return gym.make_vec(env, num_envs=num_envs, vectorization_mode="sync")
    if isinstance(env, gym.vector.VectorEnv):
        if num_envs not in (1, env.num_envs):
            raise ValueError(f"num_envs={num_envs} but the vector env has {env.num_envs} "
                             f"sub-envs")
        return env
    if isinstance(env, gym.Env):
        if num_envs != 1:
            raise ValueError(f"num_envs={num_envs} needs as many envs: pass a gymnasium id, "
                             f"a VectorEnv or a function making one env, not one Env")
        return gym.vector.SyncVectorEnv([lambda: env])
    if callable(env):
        return gym.vector.SyncVectorEnv([env] * num_envs)
    raise TypeError(f"env must be a gymnasium id, Env or VectorEnv, a function making an "
                    f"Env, or a multi-agent env, got {type(env).__name__}")


def _check_in_space(space: Any, value: Any, what: str) -> None:
    if not space_contains(space, value):
        raise ValueError(f"{what} outside {space}: {value!r}")


def _describe(value: Any) -> str:
    """What a policy returned, in a few words (for error messages)."""
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} ({value.dtype})"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"{value!r:.60} ({type(value).__name__})" if value is not None else "None"


def check_sampler_args(policy: Optional[Callable], batch_mode: str,
                       rollout_fragment_length: int, count_steps_by: str, num_envs: int,
                       seed: Optional[int]) -> None:
    """Sampler's checks of its arguments other than the env and the views
    (ValueError, TypeError for a policy that is not callable)."""
    if batch_mode not in BATCH_MODES:
        raise ValueError(f"batch_mode must be one of {BATCH_MODES}, got {batch_mode!r}")
    if count_steps_by not in COUNT_STEPS_BY:
        raise ValueError(f"count_steps_by must be one of {COUNT_STEPS_BY}, "
                         f"got {count_steps_by!r}")
    for name, value in (("rollout_fragment_length", rollout_fragment_length),
                        ("num_envs", num_envs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    if policy is not None and not callable(policy):
        raise TypeError(f"policy must be callable or None, got {type(policy).__name__}")


class Sampler:
    """Runs an env and a policy and collects episodes and training batches,
    with the semantics of RLlib 2.60's EnvRunners.

    Args:
        env: A gymnasium id, Env, VectorEnv or function making an Env; or a
            multi-agent env (an RLlib MultiAgentEnv, or a PettingZoo
            ParallelEnv) or a function making one (num_envs > 1).
        policy: Called with the inference input (a dict of batched views,
            one row per sub-env: the view requirements used for computing
            actions) and returning the actions, a batch with one row per
            sub-env, or (actions, extra model outputs as a dict of such
            batches). For a multi-agent env: called once per sub-env with
            {agent_id: input dict of one row} for the agents to act, and
            returning {agent_id: action} for exactly those agents, or
            (that, {agent_id: {name: extra output}}). None: random actions
            from seeded action spaces. Anything else it returns raises
            ValueError before the step reaches the env.
        view_requirements: The views of the inference input and of
            `sample()`'s batches (default: RLlib's default views). The
            policy's extra outputs are columns of the batches too, unless
            a requirement of the same name says otherwise.
        batch_mode: "truncate_episodes": each call covers
            rollout_fragment_length x num_envs steps; running episodes are
            cut and go on in the next call. "complete_episodes": only
            finished episodes, at least that many steps of them; running
            episodes go on in the next call.
        rollout_fragment_length: Steps per sub-env and call.
        count_steps_by: "env_steps" or "agent_steps" (multi-agent envs).
        num_envs: Sub-envs (a gymnasium id or a function making an env).
        seed: Sub-env i is reset with seed + i the first time.
        writer: An `episode.offline.EpisodeWriter` that records every
            episode (and chunk) sample_episodes() and sample() hand on, as
            they hand it on (numpy'ized), or None.
        check_observations: Whether the env's observations must lie in its
            observation space (ValueError naming the sub-env, the agent and
            the space otherwise). RLlib's runners do not check; False lets
            such observations in.
    """

    def __init__(self, env: Any, policy: Optional[Callable] = None, *,
                 view_requirements: Optional[Dict[str, ViewRequirement]] = None,
                 batch_mode: BatchMode = "truncate_episodes", rollout_fragment_length: int = 200,
                 count_steps_by: CountStepsBy = "env_steps", num_envs: int = 1,
                 seed: Optional[int] = None, writer: Any = None,
                 check_observations: bool = True):
        check_sampler_args(policy, batch_mode, rollout_fragment_length, count_steps_by,
                           num_envs, seed)
        if type(check_observations) is not bool:
            raise TypeError(f"check_observations must be a bool, got {check_observations!r}")
        self.check_observations = check_observations
        self.batch_mode = batch_mode
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.count_steps_by = count_steps_by
        self.seed = None if seed is None else int(seed)
        self.policy = policy
        self.writer = writer
        made, env = _resolve_env(env, int(num_envs))
        self.multi_agent = made is not None
        if self.multi_agent:
            self.envs = [_MultiAgentEnv(e) for e in made]
            self.num_envs = len(self.envs)
            self._episodes: list = [None] * self.num_envs
            # RLlib draws random actions from each agent's space; seeded per
            # sub-env, as a Dict of them (one seed each, agents distinct).
            self._action_spaces = [gym.spaces.Dict({aid: e.action_space(aid)
                                                    for aid in e.possible_agents})
                                   for e in self.envs]
            if seed is not None:
                for i, spaces in enumerate(self._action_spaces):
                    spaces.seed(int(seed) + i)
            default_views = default_view_requirements()
        else:
            self.env = _vector_env(env, int(num_envs))
            self.num_envs = self.env.num_envs
            self._vector = VectorEpisodes.for_env(self.env)
            default_views = default_view_requirements(self.env.single_observation_space,
                                                      self.env.single_action_space)
        self.view_requirements = view_requirements if view_requirements is not None \
            else default_views
        from episode.views import ViewRequirement
        for key, vr in self.view_requirements.items():
            if not isinstance(vr, ViewRequirement) and not hasattr(vr, "shift_arr"):
                raise TypeError(f"view_requirements[{key!r}] must be a ViewRequirement, "
                                f"got {type(vr).__name__}")
        # The rows before a chunk's first timestep its views read (at least
        # one, as RLlib's episode_lookback_horizon).
        self._lookback = max([1] + [int(-min(vr.shift_arr.min(), 0))
                                    for vr in self.view_requirements.values()])
        self._started = False
        self._closed = False
        self._views_checked = False
        # Episodes that ended and wait to be handed on (after a rollout that
        # raised, until the next call).
        self._done: list = []
        self._env_ids: dict = {}
        self._metrics = _Metrics()

    # -- public -----------------------------------------------------------------

    def sample_episodes(self) -> List[Union[SingleAgentEpisode, MultiAgentEpisode]]:
        """One rollout's episodes (finished ones, then the chunks of running
        ones in truncate mode), numpy'ized. In truncate mode, the episodes
        that ended in a rollout that raised (a bad action or observation)
        come with the next one."""
        self._require_open()
        # The sub-env of each episode handed on, for the batches' env_id.
        self._env_ids = {}
        if self.multi_agent:
            episodes = self._sample_multi_agent()
            for e in episodes:
                e.to_numpy()
        else:
            done, chunks = self._sample_single_agent()
            episodes = done + chunks
            for e in episodes:
                e.to_numpy()
            # (Numpy'ized, their returns are sums over arrays.)
            self._metrics.add_episodes(done, chunks)
        if self.writer is not None:
            self.writer.write(episodes)
        return episodes

    def sample(self) -> TrainingBatch:
        """One rollout as a training batch, a dict of columns (per module id
        for multi-agent envs): the view requirements used for training, and
        each extra output of the policy that no requirement names (as
        RLlib's policies add a view for each extra action output)."""
        from episode.views import build_training_batch

        episodes = self.sample_episodes()
        env_ids = [self._env_ids.get(e.id_, 0) for e in episodes]
        return build_training_batch(episodes, self._training_views(episodes), env_ids=env_ids)

    def _training_views(self, episodes: list) -> dict:
        """The view requirements used for training, and a view of each extra
        output of the policy that no requirement names (as RLlib's policies
        add one for each extra action output)."""
        from episode.views import ViewRequirement

        views = {k: vr for k, vr in self.view_requirements.items() if vr.used_for_training}
        agent_episodes = [a for e in episodes for a in e.agent_episodes.values()] \
            if self.multi_agent else episodes
        for e in agent_episodes:
            for key in e.extra_model_outputs:
                if key not in self.view_requirements:
                    views[key] = ViewRequirement(used_for_compute_actions=False)
        return views

    def get_metrics(self) -> Dict[str, Any]:
        """What was sampled since the last call: "episodes_done",
        "episode_returns", "episode_lengths", "env_steps", "agent_steps"."""
        metrics = self._metrics.as_dict()
        self._metrics = _Metrics(self._metrics.partial_returns)
        return metrics

    def take_pending(self) -> List[Union[SingleAgentEpisode, MultiAgentEpisode]]:
        """Hands on now what the next call would start from: the episodes
        that ended and were not handed on (a rollout raised) and the chunks
        of the running ones (each goes on in its successor), numpy'ized and
        written to the writer, as sample_episodes() hands episodes on. For
        ending a run early without losing a sampled step."""
        self._require_open()
        if not self._started:
            return []
        done, self._done = self._done, []
        if self.multi_agent:
            episodes = done + self._multi_agent_chunks()
        else:
            ended, envs = self._vector.take_ended()
            self._env_ids.update(zip([e.id_ for e in ended], envs))
            chunks = self._vector.cut(self._lookback)
            self._metrics.add_episodes(done + ended, chunks)
            episodes = done + ended + chunks
        for e in episodes:
            e.to_numpy()
        if self.writer is not None:
            self.writer.write(episodes)
        return episodes

    def ongoing_episodes(self) -> List[Union[SingleAgentEpisode, MultiAgentEpisode]]:
        """The episodes still being filled (a multi-agent env's one, or each
        sub-env's that is not waiting for its reset)."""
        if self.multi_agent:
            return [e for e in self._episodes if e is not None]
        if not self._started:
            return []
        return [e for k, e in enumerate(self._vector.episodes) if not self._vector._resetting[k]]

    def close(self) -> None:
        """Closes the envs; sampling afterwards raises RuntimeError."""
        self._closed = True
        for env in self.envs if self.multi_agent else [self.env]:
            env.close()

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("the Sampler is closed: make a new one to sample again")

    # -- single-agent ----------------------------------------------------------------

    def _target(self) -> int:
        return self.rollout_fragment_length * self.num_envs

    def _reset_vector(self) -> None:
        obs, infos = self.env.reset(seed=self.seed)
        self._check_observations(obs)
        self._vector.add_reset(obs, infos)
        if self.seed is not None:
            self.env.action_space.seed(self.seed)
        self._started = True

    def _actions(self) -> tuple:
        if self.policy is None:
            return self.env.action_space.sample(), None
        from episode.views import build_inference_batch

        views = {k: vr for k, vr in self.view_requirements.items()
                 if vr.used_for_compute_actions}
        inputs = build_inference_batch(self._vector.episodes, views,
                                       env_ids=list(range(self.num_envs)))
        out = self.policy(inputs)
        actions, extras = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        batch = np.asarray(actions)
        if batch.shape[:1] != (self.num_envs,):
            raise ValueError(
                f"the policy returned {_describe(actions)} as the actions; expected a batch of "
                f"{self.num_envs} actions (a leading axis of one row per sub-env), or a "
                f"tuple (actions, {{name: batch of extra outputs}})")
        if not space_contains(self.env.action_space, batch):
            space = self.env.single_action_space
            k = next((k for k in range(self.num_envs)
                      if not space_contains(space, _row(batch, k))), 0)
            raise ValueError(f"the policy returned sub-env {k} the action {_row(batch, k)!r}, "
                             f"outside its action space {space}")
        self._check_view_columns(extras)
        return batch, extras

    def _check_view_columns(self, extras: Optional[dict]) -> None:
        """Once the policy has said which outputs it makes: ValueError for an
        inference view of a column no episode will have."""
        if self._views_checked:
            return
        known = set(SAMPLER_COLUMNS) | set(extras or ())
        if extras and self.multi_agent:
            known |= {key for outputs in extras.values() for key in outputs}
        for key, vr in self.view_requirements.items():
            data_col = vr.data_col or key
            if vr.used_for_compute_actions and data_col not in known:
                raise ValueError(
                    f"view {key!r} reads {data_col!r}, which no episode has: the columns are "
                    f"{sorted(SAMPLER_COLUMNS)} and the policy's outputs "
                    f"{sorted(extras or ())}")
        self._views_checked = True

    def _sample_single_agent(self) -> tuple:
        """(the episodes that ended, the chunks of the running ones)."""
        if not self._started:
            self._reset_vector()
        vector = self._vector
        target = self._target()
        counted = 0
        if self.batch_mode == "complete_episodes":
            # Counts the steps of the episodes as they end.
            done = self._done
            while counted < target:
                actions, extras = self._actions()
                obs, rewards, terminateds, truncateds, infos = self.env.step(actions)
                self._check_observations(obs)
                ended = vector.add_step(obs, actions, rewards, terminateds, truncateds,
                                        infos, extra_model_outputs=extras)
                self._metrics.add_steps(vector.steps_added, vector.steps_added)
                if ended:
                    self._env_ids.update(zip([e.id_ for e in ended], vector.ended_envs))
                    done.extend(ended)
                    counted += sum([len(e) for e in ended])
            self._done = []
            return done, []
        # Truncate: the episodes are read once the steps are in (record_step).
        act, step, check, record = self._actions, self.env.step, self._check_observations, \
            vector.record_step
        try:
            while counted < target:
                actions, extras = act()
                obs, rewards, terminateds, truncateds, infos = step(actions)
                check(obs)
                counted += record(obs, actions, rewards, terminateds, truncateds, infos,
                                  extra_model_outputs=extras)
        finally:
            self._metrics.add_steps(counted, counted)
        done, envs = vector.take_ended()
        self._env_ids.update(zip([e.id_ for e in done], envs))
        resetting = vector._resetting.tolist()
        ongoing = [k for k, e in enumerate(vector.episodes) if not resetting[k] and len(e)]
        chunks = vector.cut(self._lookback)
        self._env_ids.update(zip([c.id_ for c in chunks], ongoing))
        return done, chunks

    def _check_observations(self, obs: Any) -> None:
        if not self.check_observations:
            return
        space = self.env.observation_space
        inside = in_box(obs, space.low, space.high) if type(space) is gym.spaces.Box else None
        if inside is None:
            inside = space_contains(space, obs)
        if not inside:
            single = self.env.single_observation_space
            for k in range(self.num_envs):
                row = _row(obs, k)
                if not space_contains(single, row):
                    raise ValueError(f"sub-env {k} returned an observation outside its space "
                                     f"{single}: {row!r} (Sampler(check_observations=False) "
                                     f"lets it in)")
            raise ValueError(f"the env returned observations outside {space}: {obs!r}")

    # -- multi-agent -----------------------------------------------------------------
    #
    # RLlib's MultiAgentEnvRunner over num_envs sub-envs: each pass steps every
    # sub-env once (NextStep autoreset: a sub-env whose episode ended is reset
    # in the next pass, which counts no step), and a rollout goes on until
    # rollout_fragment_length x num_envs env steps (or agent steps: the agents
    # that observed) are counted at the top of a pass.

    def _new_multi_agent_episode(self, i: int, seed: Optional[int]) -> None:
        from episode.multi_agent_episode import MultiAgentEpisode

        env = self.envs[i]
        obs, infos = env.reset(seed=seed)
        if self.check_observations:
            for aid, o in obs.items():
                _check_in_space(env.observation_space(aid), o,
                                f"sub-env {i}'s agent {aid!r}'s reset observation is")
        episode = MultiAgentEpisode(
            observation_space={aid: env.observation_space(aid) for aid in env.possible_agents},
            action_space={aid: env.action_space(aid) for aid in env.possible_agents})
        episode.add_env_reset(observations=obs, infos=infos)
        self._episodes[i] = episode

    def _multi_agent_actions(self, i: int, to_act: Any) -> tuple:
        spaces = self._action_spaces[i]
        if self.policy is None:
            return {aid: spaces[aid].sample() for aid in to_act}, None
        from episode.views import build_inference_batch

        views = {k: vr for k, vr in self.view_requirements.items()
                 if vr.used_for_compute_actions}
        agents = self._episodes[i].agent_episodes
        inputs = {aid: build_inference_batch([agents[aid]], views) for aid in to_act}
        out = self.policy(inputs)
        actions, extras = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
        if not isinstance(actions, dict) or set(actions) != set(to_act):
            got = sorted(actions, key=str) if isinstance(actions, dict) else type(actions).__name__
            raise ValueError(f"the policy must return one action for each agent to act "
                             f"({sorted(to_act, key=str)}), got {got}")
        for aid, action in actions.items():
            if aid in spaces.spaces:
                _check_in_space(spaces[aid], action,
                                f"the policy returned agent {aid!r} an action")
        self._check_view_columns(extras)
        return actions, extras

    def _sample_multi_agent(self) -> list:
        if not self._started:
            for i in range(self.num_envs):
                self._new_multi_agent_episode(i, None if self.seed is None else self.seed + i)
            self._started = True
        complete = self.batch_mode == "complete_episodes"
        by_agents = self.count_steps_by == "agent_steps"
        target = self.rollout_fragment_length * self.num_envs
        done_episodes = self._done
        counted = 0
        while counted < target:
            for i, env in enumerate(self.envs):
                episode = self._episodes[i]
                if episode is None:
                    self._new_multi_agent_episode(i, None)
                    continue
                actions, extras = self._multi_agent_actions(i, episode.get_agents_to_act())
                obs, rewards, terminateds, truncateds, infos = env.step(actions)
                if self.check_observations:
                    for aid, o in obs.items():
                        _check_in_space(env.observation_space(aid), o,
                                        f"sub-env {i} returned agent {aid!r} an observation")
                episode.add_env_step(obs, actions, rewards, infos, terminateds=terminateds,
                                     truncateds=truncateds, extra_model_outputs=extras)
                self._metrics.add_steps(1, len(obs))
                if not complete:
                    counted += len(obs) if by_agents else 1
                if episode.is_done:
                    _prune(episode)
                    self._metrics.add_episodes([episode], [])
                    self._env_ids[episode.id_] = i
                    done_episodes.append(episode)
                    if complete:
                        counted += episode.agent_steps() if by_agents else episode.env_steps()
                    self._episodes[i] = None
        self._done = []
        if complete:
            return done_episodes
        return done_episodes + self._multi_agent_chunks()

    def _multi_agent_chunks(self) -> list:
        # The running episodes' chunks; each goes on in its successor.
        chunks = []
        for i, episode in enumerate(self._episodes):
            if episode is None:
                continue
            self._episodes[i] = episode.cut(len_lookback_buffer=self._lookback)
            if episode.env_t != 0:
                _prune(episode)
                self._metrics.add_episodes([], [episode])
                self._env_ids[episode.id_] = i
                chunks.append(episode)
        return chunks


def _prune(episode: Any) -> None:
    # Agents without a step leave the episode handed on (their env-step
    # mapping stays), as in RLlib's runner.
    for aid in [aid for aid, e in episode.agent_episodes.items() if len(e) == 0]:
        del episode.agent_episodes[aid]


def _resolve_env(env: Any, num_envs: int) -> tuple:
    """(multi-agent sub-envs, None) for a multi-agent env (num_envs 1) or a
    function making one (called num_envs times); else (None, what
    _vector_env takes). A function is called once to tell; the env it made
    is the first sub-env."""
    if _is_multi_agent(env):
        if num_envs != 1:
            raise ValueError(f"num_envs={num_envs} needs as many multi-agent envs: pass a "
                             f"function making one, not one env")
        return [env], None
    if isinstance(env, (str, gym.Env, gym.vector.VectorEnv)) or not callable(env):
        return None, env
    first = env()
    if _is_multi_agent(first):
        return [first] + [env() for _ in range(num_envs - 1)], None
    if num_envs == 1:
        return None, first
    made = iter([first])
    return None, lambda: next(made, None) or env()


class _Metrics:
    """What was sampled: steps, and each finished episode's return and
    length over all its chunks."""

    def __init__(self, partial_returns: Optional[dict] = None):
        self.returns: list = []
        self.lengths: list = []
        self.env_steps = 0
        self.agent_steps = 0
        # Returns of the chunks handed on so far, by episode id.
        self.partial_returns = partial_returns if partial_returns is not None else {}

    def add_steps(self, env_steps: int, agent_steps: int) -> None:
        self.env_steps += env_steps
        self.agent_steps += agent_steps

    def add_episodes(self, done: list, chunks: list) -> None:
        """The finished episodes `done` (their return over all their chunks,
        and length) and the chunks `chunks` of running ones (their returns
        so far)."""
        pop, returns = self.partial_returns.pop, self.partial_returns
        self.returns.extend([pop(e.id_, 0.0) + float(e.get_return()) for e in done])
        # t (env_t) counts the env steps of all the episode's chunks (it
        # started at 0).
        self.lengths.extend([e.t if isinstance(e, SingleAgentEpisode) else int(e.env_t)
                             for e in done])
        for e in chunks:
            returns[e.id_] = returns.get(e.id_, 0.0) + float(e.get_return())

    def as_dict(self) -> dict:
        return {"episodes_done": len(self.returns), "episode_returns": self.returns,
                "episode_lengths": self.lengths, "env_steps": self.env_steps,
                "agent_steps": self.agent_steps}
