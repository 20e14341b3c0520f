"""RLlib's EnvRunners, sampling through our episodes without RLlib's
per-step connector passes.

`SingleAgentEnvRunner` and `MultiAgentEnvRunner` are RLlib 2.60's runners of
the same names with their per-step loop replaced, for the usual
configuration (the default connector pipelines, stateless torch modules, no
episode callbacks, a NextStep vector env):

- the module's input is gathered straight from the env's observations (the
  single-agent env's batch itself; each multi-agent module's rows in the
  order RLlib's AgentToModuleMapping gives them), not item by item through
  the episodes and stacked again;
- the module's output goes to the env and into the episodes as RLlib's
  default module-to-env pipeline hands it over: the actions drawn as its
  GetActions draws them, converted as its TensorToNumpy converts them,
  unsquashed or clipped as its NormalizeAndClipActions does;
- the module stays in eval mode for the whole call, where RLlib's
  forward_exploration switches to it and back at every step;
- single-agent steps go into the episodes with one `VectorEpisodes` call per
  env step (`record_step` when the call counts timesteps: the episodes are
  then started, written and ended once the steps are in);
- the multi-agent step metrics (env, agent and module steps, episodes) are
  logged once per call, summed, where RLlib's loop logs them at every
  sub-env step (its single-agent runner logs them once per call too).

The episodes, the random numbers drawn and the metrics are RLlib's (same
seeds, same episodes); any other configuration runs RLlib's own loop on our
episodes (`vectorized` tells which). Use them with
`config.env_runners(env_runner_cls=SingleAgentEnvRunner)` (or
MultiAgentEnvRunner). They install our episode classes into RLlib
(`episode.rllib.install()`) when they are made.

Importing this module imports ray and torch.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, List, Optional

import gymnasium as gym
import numpy as np

from episode._extras import rllib_missing

try:
    import torch
    from ray.rllib.callbacks.callbacks import RLlibCallback
    from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (
        AddObservationsFromEpisodesToBatch)
    from ray.rllib.connectors.common.add_states_from_episodes_to_batch import (
        AddStatesFromEpisodesToBatch)
    from ray.rllib.connectors.common.add_time_dim_to_batch_and_zero_pad import (
        AddTimeDimToBatchAndZeroPad)
    from ray.rllib.connectors.common.agent_to_module_mapping import AgentToModuleMapping
    from ray.rllib.connectors.common.batch_individual_items import BatchIndividualItems
    from ray.rllib.connectors.common.module_to_agent_unmapping import ModuleToAgentUnmapping
    from ray.rllib.connectors.common.numpy_to_tensor import NumpyToTensor
    from ray.rllib.connectors.common.tensor_to_numpy import TensorToNumpy
    from ray.rllib.connectors.module_to_env.get_actions import GetActions
    from ray.rllib.connectors.module_to_env.listify_data_for_vector_env import (
        ListifyDataForVectorEnv)
    from ray.rllib.connectors.module_to_env.normalize_and_clip_actions import (
        NormalizeAndClipActions)
    from ray.rllib.connectors.module_to_env.remove_single_ts_time_rank_from_batch import (
        RemoveSingleTsTimeRankFromBatch)
    from ray.rllib.connectors.module_to_env.unbatch_to_individual_items import (
        UnBatchToIndividualItems)
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
    from ray.rllib.env.env_runner import ENV_STEP_FAILURE
    from ray.rllib.env.multi_agent_env_runner import \
        MultiAgentEnvRunner as RLlibMultiAgentEnvRunner
    from ray.rllib.env.single_agent_env_runner import \
        SingleAgentEnvRunner as RLlibSingleAgentEnvRunner
    from ray.rllib.utils.metrics import (NUM_AGENT_STEPS_SAMPLED, NUM_AGENT_STEPS_SAMPLED_LIFETIME,
                                         NUM_ENV_STEPS_SAMPLED, NUM_ENV_STEPS_SAMPLED_LIFETIME,
                                         NUM_EPISODES, NUM_EPISODES_LIFETIME,
                                         NUM_MODULE_STEPS_SAMPLED,
                                         NUM_MODULE_STEPS_SAMPLED_LIFETIME, RLMODULE_INFERENCE_TIMER,
                                         WEIGHTS_SEQ_NO)
    from ray.rllib.utils.numpy import convert_to_numpy
    from ray.rllib.utils.spaces.space_utils import batch, clip_action, unbatch, unsquash_action
    from ray.rllib.utils.torch_utils import convert_to_torch_tensor
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.runners") from e

from episode.rllib import patch
from episode.sampling import VectorEpisodes

__all__ = ["MultiAgentEnvRunner", "SingleAgentEnvRunner"]

# RLlib's default pipelines, in order: what the loops here do in one pass
# each way.
ENV_TO_MODULE = (AddObservationsFromEpisodesToBatch, AddTimeDimToBatchAndZeroPad,
                 AddStatesFromEpisodesToBatch, BatchIndividualItems, NumpyToTensor)
MODULE_TO_ENV = (GetActions, TensorToNumpy, UnBatchToIndividualItems,
                 RemoveSingleTsTimeRankFromBatch, NormalizeAndClipActions,
                 ListifyDataForVectorEnv)
MULTI_AGENT_ENV_TO_MODULE = (AddObservationsFromEpisodesToBatch, AddTimeDimToBatchAndZeroPad,
                             AddStatesFromEpisodesToBatch, AgentToModuleMapping,
                             BatchIndividualItems, NumpyToTensor)
MULTI_AGENT_MODULE_TO_ENV = (GetActions, TensorToNumpy, UnBatchToIndividualItems,
                             ModuleToAgentUnmapping, RemoveSingleTsTimeRankFromBatch,
                             NormalizeAndClipActions, ListifyDataForVectorEnv)
EPISODE_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step",
                     "on_episode_end")


class _Loop:
    """What both runners' loops share: when they apply, the module's
    forward pass and RLlib's GetActions/TensorToNumpy/NormalizeAndClip."""

    def _can_loop(self, pipelines: tuple, modules: list) -> bool:
        """Whether the loop does exactly what RLlib's does here: the default
        pipelines, stateless torch modules with RLlib's forward wrappers, no
        episode callbacks."""
        if self.env is None or not modules:
            return False
        for module in modules:
            if not isinstance(module, TorchRLModule) or module.is_stateful():
                return False
            if type(module).forward_exploration is not TorchRLModule.forward_exploration or \
                    type(module).forward_inference is not TorchRLModule.forward_inference:
                return False
        if (tuple(type(c) for c in self._env_to_module.connectors),
                tuple(type(c) for c in self._module_to_env.connectors)) != pipelines:
            return False
        for which in EPISODE_CALLBACKS:
            if getattr(self.config, f"callbacks_{which}", None):
                return False
            if any(getattr(type(cb), which) is not getattr(RLlibCallback, which)
                   for cb in self._callbacks):
                return False
        return True

    def _sample(self, *, num_timesteps: Optional[int] = None,
                num_episodes: Optional[int] = None, explore: bool,
                random_actions: bool = False, force_reset: bool = False) -> List[Any]:
        # RLlib's loop unless `vectorized` (see _can_loop).
        if not self.vectorized:
            return super()._sample(num_timesteps=num_timesteps,
                                   num_episodes=num_episodes, explore=explore,
                                   random_actions=random_actions, force_reset=force_reset)
        return self._loop_sample(num_timesteps, num_episodes, explore, random_actions,
                                 force_reset)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        # RLlib's forward_exploration/inference switch the module to eval
        # mode and back at every step: a fifth of the step's time with the
        # default PPO module. The loop does it once per call.
        module = self.module
        modules = (list(module._rl_modules.values()) if isinstance(module, MultiRLModule)
                   else [module])
        training = [m for m in modules if m.training]
        for m in modules:
            m.eval()
        try:
            yield
        finally:
            for m in training:
                m.train()

    def _forward_pass(self, module: Any, batch: dict, explore: bool, env_ts: int) -> dict:
        """forward_exploration/inference, without their switch to eval mode
        and back (see _eval_mode)."""
        if explore:
            # The global env step, as RLlib's loop counts it.
            runners = self.config.num_env_runners or 1
            t = (self.num_env_steps_sampled_lifetime // runners + env_ts) * runners
            return module._forward_exploration(batch, t=t)
        return module._forward_inference(batch)

    @staticmethod
    def _draw_actions(out: dict, module: Any, explore: bool) -> None:
        # GetActions: actions (and their logp) from the action distribution,
        # unless the module gave actions.
        if Columns.ACTIONS in out or Columns.ACTION_DIST_INPUTS not in out:
            return
        dist_cls = (module.get_exploration_action_dist_cls() if explore
                    else module.get_inference_action_dist_cls())
        dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
        if not explore:
            dist = dist.to_deterministic()
        out[Columns.ACTIONS] = dist.sample()
        if Columns.ACTION_LOGP not in out:
            out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS])

    def _for_env(self, actions: Any, struct: Any) -> Any:
        # NormalizeAndClipActions: the env gets the actions unsquashed (or
        # clipped) into its space, in its own copy; the episodes keep them as
        # drawn.
        connector = self._clip_connector
        if isinstance(struct, gym.spaces.Space) and not isinstance(struct, gym.spaces.Box):
            # Only Box leaves change: the env gets its own copy of the rest
            # (of a numeric array, deepcopy's copy is copy()'s).
            if type(actions) is np.ndarray and actions.dtype.hasobject is False:
                return actions.copy(order="K")
            return copy.deepcopy(actions)
        if connector.normalize_actions:
            for_env = unsquash_action(actions, struct)
        elif connector.clip_actions:
            for_env = clip_action(actions, struct)
        else:
            return actions
        return copy.deepcopy(for_env) if for_env is actions else for_env

    @property
    def _clip_connector(self) -> Any:
        # The pipeline's NormalizeAndClipActions (the loop runs only with it).
        return self._module_to_env.connectors[-2]

    def _space_struct(self) -> Any:
        return self._clip_connector._action_space_struct


class SingleAgentEnvRunner(_Loop, RLlibSingleAgentEnvRunner):
    """RLlib's SingleAgentEnvRunner, sampling through `VectorEpisodes`
    where its configuration allows (`vectorized`), RLlib's loop otherwise."""

    def __init__(self, *, config: Any, **kwargs: Any):
        patch.install()
        super().__init__(config=config, **kwargs)
        self._vector: Optional[VectorEpisodes] = None
        # The observations of the last reset or step: the module's next input.
        self._last_obs: Any = None
        mode = self.env.metadata.get("autoreset_mode", "NextStep") if self.env else None
        # VectorEpisodes follows the NextStep autoreset RLlib's loop expects.
        self.vectorized = (getattr(mode, "value", mode) == "NextStep"
                           and self._can_loop((ENV_TO_MODULE, MODULE_TO_ENV), [self.module]))

    def make_env(self) -> None:
        super().make_env()
        # A new env starts over (RLlib's loop resets it too).
        self._vector = None

    def _loop_sample(self, num_timesteps: Optional[int], num_episodes: Optional[int],
                     explore: bool, random_actions: bool, force_reset: bool) -> List[Any]:
        if force_reset or num_episodes is not None or self._needs_initial_reset \
                or self._vector is None:
            self._reset_vector()
        if num_episodes is not None:
            # As RLlib's loop: the next call starts over, seeded again.
            self._needs_initial_reset = True
        with self._eval_mode():
            ts, done_episodes = self._run(num_timesteps, num_episodes, explore, random_actions)
        self._done_episodes_for_metrics.extend(done_episodes)
        vector = self._vector
        chunks = []
        if num_timesteps is not None:
            for ep in vector.cut(len_lookback_buffer=self.config.episode_lookback_horizon):
                ep.validate()
                self._ongoing_episodes_for_metrics[ep.id_].append(ep)
                chunks.append(ep.to_numpy() if self.episodes_to_numpy else ep)
        self._ongoing_episodes = vector.episodes
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=ts)
        self._increase_sampled_metrics(ts, len(done_episodes))
        return done_episodes + chunks

    def _run(self, num_timesteps: Optional[int], num_episodes: Optional[int], explore: bool,
             random_actions: bool) -> tuple:
        """The env steps of one sample() call: (env steps, ended episodes)."""
        vector = self._vector
        ts = 0
        done_episodes: list = []
        # Counting timesteps, the loop reads no episode: they are started,
        # written and ended once the steps are in (record_step).
        defer = num_timesteps is not None
        while (ts < num_timesteps) if defer else (len(done_episodes) < num_episodes):
            if random_actions:
                actions = actions_for_env = self.env.action_space.sample()
                outputs: dict = {}
            else:
                actions, actions_for_env, outputs = self._compute_actions(explore, ts)
            results = self._try_env_step(actions_for_env)
            if results is ENV_STEP_FAILURE:
                # The env was made anew: start over, as RLlib's loop does.
                ts = 0
                if defer:
                    done_episodes += self._take_ended(vector)
                self._reset_vector()
                vector = self._vector
                continue
            observations, rewards, terminateds, truncateds, infos = results
            # A Python int per step, as RLlib's loop adds it.
            outputs[WEIGHTS_SEQ_NO] = [self._weights_seq_no] * self.num_envs
            self._last_obs = observations
            if defer:
                ts += vector.record_step(observations, actions, rewards, terminateds,
                                         truncateds, infos if any(infos) else None,
                                         extra_model_outputs=outputs)
                continue
            ended = vector.add_step(observations, actions, rewards, terminateds, truncateds,
                                    infos if any(infos) else None,
                                    extra_model_outputs=outputs)
            ts += vector.steps_added
            for ep in ended:
                if len(done_episodes) >= num_episodes:
                    break
                done_episodes.append(ep.to_numpy() if self.episodes_to_numpy else ep)
        if defer:
            done_episodes += self._take_ended(vector)
        return ts, done_episodes

    def _take_ended(self, vector: VectorEpisodes) -> list:
        """The episodes that ended in vector's record_step() calls, in order."""
        done, _ = vector.take_ended()
        return [ep.to_numpy() for ep in done] if self.episodes_to_numpy else done

    def _reset_vector(self) -> None:
        """RLlib's reset of every sub-env: new episodes (the running ones are
        dropped), seeded on the first reset."""
        self._ongoing_episodes_for_metrics.clear()
        self._shared_data = {}
        observations, infos = self._try_env_reset(
            seed=self._seed if self._needs_initial_reset else None, options=None)
        self._vector = VectorEpisodes.for_env(self.env)
        self._vector.add_reset(observations, infos)
        self._ongoing_episodes = self._vector.episodes
        self._last_obs = observations
        self._needs_initial_reset = False

    def _compute_actions(self, explore: bool, ts: int) -> tuple:
        """(actions for the episodes, actions for the env, the other outputs
        as batches) for the last observations: what RLlib's default
        pipelines give, with the env's observation batch as the module's
        input (the rows its pipeline gathers back out of the episodes)."""
        module = self.module
        batch = {Columns.OBS: self._obs_tensor(self._last_obs)}
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            out = self._forward_pass(module, batch, explore, ts)
        self._draw_actions(out, module, explore)
        out = _to_numpy(out)
        actions = out.pop(Columns.ACTIONS)
        actions_for_env = out.pop(Columns.ACTIONS_FOR_ENV, None)
        if actions_for_env is None:
            actions_for_env = self._for_env(actions, self._space_struct())
        return actions, actions_for_env, out

    def _obs_tensor(self, obs: Any) -> Any:
        """convert_to_torch_tensor(obs, device=self._device): for a float32
        array on the CPU that is a tensor over the array's memory, made
        here without the function's tree walk (a twentieth of the step)."""
        if (type(obs) is np.ndarray and obs.dtype == np.float32 and obs.flags.writeable
                and self._on_cpu):
            return torch.from_numpy(obs)
        return convert_to_torch_tensor(obs, device=self._device)

    @property
    def _on_cpu(self) -> bool:
        # (torch.device() takes microseconds: asked once per device.)
        device = self._device
        if getattr(self, "_cpu_of", (None,))[0] is not device:
            self._cpu_of = (device, device is None or torch.device(device).type == "cpu")
        return self._cpu_of[1]


class MultiAgentEnvRunner(_Loop, RLlibMultiAgentEnvRunner):
    """RLlib's MultiAgentEnvRunner, gathering each module's input from the
    episodes' last observations in one pass and handing the outputs to the
    env and the episodes without RLlib's per-step connector passes, where
    its configuration allows (`vectorized`); RLlib's loop otherwise."""

    def __init__(self, *, config: Any, **kwargs: Any):
        patch.install()
        super().__init__(config=config, **kwargs)
        module = self.module
        self.vectorized = (
            isinstance(module, MultiRLModule)
            and type(module)._forward_exploration is MultiRLModule._forward_exploration
            and type(module)._forward_inference is MultiRLModule._forward_inference
            and self._can_loop((MULTI_AGENT_ENV_TO_MODULE, MULTI_AGENT_MODULE_TO_ENV),
                               list(module._rl_modules.values())))

    def _loop_sample(self, num_timesteps: Optional[int], num_episodes: Optional[int],
                     explore: bool, random_actions: bool, force_reset: bool) -> List[Any]:
        if force_reset or num_episodes is not None or self._needs_initial_reset:
            self._reset_envs_and_episodes(explore)
        if num_episodes is not None:
            # As RLlib's loop: the next call starts over, seeded again.
            self._needs_initial_reset = True
        with self._eval_mode():
            done_episodes = self._run(num_timesteps, num_episodes, explore, random_actions)
        self._done_episodes_for_metrics.extend(done_episodes)
        chunks = []
        if num_timesteps is not None:
            running = self._ongoing_episodes
            self._ongoing_episodes = [
                e.cut(len_lookback_buffer=self.config.episode_lookback_horizon) for e in running]
            for e in running:
                if e.env_t == 0:
                    continue
                e.validate()
                self._ongoing_episodes_for_metrics[e.id_].append(e)
                self._prune_zero_len_sa_episodes(e)
                chunks.append(e.to_numpy() if self.episodes_to_numpy else e)
        return done_episodes + chunks

    def _run(self, num_timesteps: Optional[int], num_episodes: Optional[int], explore: bool,
             random_actions: bool) -> list:
        """The env steps of one sample() call: the episodes that ended."""
        env_ts = agent_ts = 0
        done_episodes: list = []
        # What RLlib's loop logs at every sub-env step, summed over the call
        # and logged at its end (RLlib's single-agent runner does so too).
        counts = _Counts()
        by_agent_steps = self.config.count_steps_by != "env_steps"
        while (len(done_episodes) < num_episodes) if num_timesteps is None \
                else ((agent_ts if by_agent_steps else env_ts) < num_timesteps):
            episodes = self._ongoing_episodes
            if random_actions:
                actions = [{aid: self.env.envs[i].unwrapped.get_action_space(aid).sample()
                            for aid in e.get_agents_to_act()} for i, e in enumerate(episodes)]
                actions_for_env, outputs = actions, [{} for _ in episodes]
            else:
                actions, actions_for_env, outputs = self._compute_actions(explore, env_ts)
            results = self._try_env_step(actions_for_env)
            if results is ENV_STEP_FAILURE:
                # The env was made anew: start over, as RLlib's loop does.
                env_ts = agent_ts = 0
                self._reset_envs_and_episodes(explore)
                continue
            observations, rewards, terminateds, truncateds, infos = results
            for i, e in enumerate(episodes):
                if not e.is_reset:
                    # NextStep: this step reset the sub-env.
                    e.add_env_reset(observations=observations[i], infos=infos[i])
                    continue
                e.add_env_step(observations=observations[i], actions=actions[i],
                               rewards=rewards[i], infos=infos[i],
                               terminateds=terminateds[i], truncateds=truncateds[i],
                               extra_model_outputs=outputs[i])
                counts.add_step(observations[i], e)
                env_ts += 1
                agent_ts += len(observations[i])
            for i, e in enumerate(episodes):
                if not e.is_done:
                    continue
                self._prune_zero_len_sa_episodes(e)
                done_episodes.append(e.to_numpy() if self.episodes_to_numpy else e)
                self._new_episode(i, episodes)
                if num_episodes is not None and len(done_episodes) >= num_episodes:
                    break
        counts.log(self)
        return done_episodes

    def _compute_actions(self, explore: bool, env_ts: int) -> tuple:
        """(each sub-env's {agent: action} for the episodes and for the env,
        each sub-env's {agent: {column: output}}): what RLlib's default
        pipelines give for the running episodes."""
        episodes = self._ongoing_episodes
        # AgentToModuleMapping's batches: per module, the last observation
        # of each agent that stepped and is to act, episode by episode.
        rows: dict = {}
        for i, e in enumerate(episodes):
            if not e.agent_episodes:
                continue
            to_act = e.get_agents_to_act()
            for aid in e.get_agents_that_stepped():
                if aid in to_act:
                    sa = e.agent_episodes[aid]
                    rows.setdefault(sa.module_id, []).append((i, aid, sa.get_observations(-1)))
        actions: list = [{} for _ in episodes]
        for_env: list = [{} for _ in episodes]
        outputs: list = [{} for _ in episodes]
        module = self.module
        rows = {mid: r for mid, r in rows.items() if mid in module}
        if not rows:
            return actions, for_env, outputs
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            out = {mid: self._forward_pass(
                module[mid], convert_to_torch_tensor(
                    {Columns.OBS: batch([obs for _, _, obs in r],
                                        individual_items_already_have_batch_dim="auto")},
                    device=self._device), explore, env_ts) for mid, r in rows.items()}
        for mid, module_out in out.items():
            self._draw_actions(module_out, module[mid], explore)
        # Item by item, in the order RLlib's unbatching and unmapping give:
        # module by module, each module's rows in turn.
        structs = self._space_struct()
        seq_no = self._weights_seq_no
        columns: dict = {}
        for mid, module_out in out.items():
            for col, value in _to_numpy(module_out).items():
                columns.setdefault(col, []).append((rows[mid], unbatch(value)))
        for col, parts in columns.items():
            for r, items in parts:
                for (i, aid, _), item in zip(r, items):
                    if col == Columns.ACTIONS:
                        actions[i][aid] = item
                        if Columns.ACTIONS_FOR_ENV not in columns:
                            for_env[i][aid] = self._for_env(item, structs[aid])
                    elif col == Columns.ACTIONS_FOR_ENV:
                        for_env[i][aid] = item
                    else:
                        extras = outputs[i].setdefault(aid, {})
                        extras[col] = item
                        extras.setdefault(WEIGHTS_SEQ_NO, seq_no)
        return actions, for_env, outputs


class _Counts:
    """The steps, episodes and agent and module steps of a multi-agent
    sample() call, for RLlib's metrics: the same keys and sums as RLlib's
    loop logs one sub-env step at a time."""

    def __init__(self) -> None:
        self.env_steps = 0
        self.episodes = 0
        self.agent_steps: dict = {}
        self.module_steps: dict = {}

    def add_step(self, observations: dict, episode: Any) -> None:
        self.env_steps += 1
        self.episodes += episode.is_done
        for aid in observations:
            self.agent_steps[aid] = self.agent_steps.get(aid, 0) + 1
            mid = episode.module_for(aid)
            self.module_steps[mid] = self.module_steps.get(mid, 0) + 1

    def log(self, runner: Any) -> None:
        if not self.env_steps:
            return
        metrics = runner.metrics
        runner._log_env_steps(metric=runner._metrics_num_env_steps_sampled,
                              num_steps=self.env_steps)
        metrics.log_value(NUM_ENV_STEPS_SAMPLED, self.env_steps, reduce="sum")
        metrics.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, self.env_steps,
                          reduce="lifetime_sum", with_throughput=True)
        if self.episodes:
            metrics.log_value(NUM_EPISODES, self.episodes, reduce="sum")
            metrics.log_value(NUM_EPISODES_LIFETIME, self.episodes, reduce="lifetime_sum")
        for aid, n in self.agent_steps.items():
            metrics.log_value((NUM_AGENT_STEPS_SAMPLED, str(aid)), n, reduce="sum")
            metrics.log_value((NUM_AGENT_STEPS_SAMPLED_LIFETIME, str(aid)), n,
                              reduce="lifetime_sum")
        for mid, n in self.module_steps.items():
            metrics.log_value((NUM_MODULE_STEPS_SAMPLED, mid), n, reduce="sum")
            metrics.log_value((NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), n,
                              reduce="lifetime_sum")


def _to_numpy(outputs: dict) -> dict:
    """RLlib's convert_to_numpy (its TensorToNumpy connector) of a flat dict
    of tensors: arrays, floats as float32 and ints as int32, 0-d tensors as
    Python numbers; anything else goes through RLlib's function."""
    out = {}
    for key, value in outputs.items():
        if not isinstance(value, torch.Tensor):
            return convert_to_numpy(outputs)
        if value.dim() == 0:
            out[key] = value.item()
            continue
        array = value.detach().cpu().numpy()
        # (np.issubdtype's tests, without its dtype conversions: int is int64.)
        kind = array.dtype.type
        if issubclass(kind, np.floating):
            array = array.astype(np.float32)
        elif issubclass(kind, np.int64):
            array = array.astype(np.int32)
        out[key] = array
    return out
