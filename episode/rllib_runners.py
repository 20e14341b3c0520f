"""RLlib's EnvRunners, sampling through our vector appends.

`SingleAgentEnvRunner` is RLlib 2.60's runner of the same name with its
per-step loop replaced, for the usual configuration (the default connector
pipelines, a stateless module, no episode callbacks, a NextStep vector env):

- one `VectorEpisodes.add_step` per env step instead of one `add_env_step`
  per sub-env;
- the module's input is the env's observation batch itself (what RLlib's
  default env-to-module pipeline gathers back out of the episodes, row by
  row), as one tensor;
- the module's output goes to the env and into the episodes as batches: the
  actions drawn as RLlib's GetActions draws them, converted as its
  TensorToNumpy converts them, unsquashed or clipped as its
  NormalizeAndClipActions does, without splitting the batch into items and
  stacking it again.

The episodes, the random numbers drawn and the metrics are RLlib's (same
seeds, same episodes); any other configuration runs RLlib's own loop on our
episodes. Use it with `config.env_runners(env_runner_cls=SingleAgentEnvRunner)`.
It installs our episode classes into RLlib (`episode.rllib.install()`)
when it is made.

Importing this module imports ray.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (
    AddObservationsFromEpisodesToBatch)
from ray.rllib.connectors.common.add_states_from_episodes_to_batch import (
    AddStatesFromEpisodesToBatch)
from ray.rllib.connectors.common.add_time_dim_to_batch_and_zero_pad import (
    AddTimeDimToBatchAndZeroPad)
from ray.rllib.connectors.common.batch_individual_items import BatchIndividualItems
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
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.env.env_runner import ENV_STEP_FAILURE
from ray.rllib.env.single_agent_env_runner import \
    SingleAgentEnvRunner as RLlibSingleAgentEnvRunner
from ray.rllib.utils.metrics import RLMODULE_INFERENCE_TIMER, WEIGHTS_SEQ_NO
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import clip_action, unsquash_action
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

import episode.rllib
from episode.sampling import VectorEpisodes

__all__ = ["SingleAgentEnvRunner"]

# RLlib's default pipelines for a single-agent env, in order: what the
# vector loop does in one pass each way.
ENV_TO_MODULE = (AddObservationsFromEpisodesToBatch, AddTimeDimToBatchAndZeroPad,
                 AddStatesFromEpisodesToBatch, BatchIndividualItems, NumpyToTensor)
MODULE_TO_ENV = (GetActions, TensorToNumpy, UnBatchToIndividualItems,
                 RemoveSingleTsTimeRankFromBatch, NormalizeAndClipActions,
                 ListifyDataForVectorEnv)
EPISODE_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step",
                     "on_episode_end")


class SingleAgentEnvRunner(RLlibSingleAgentEnvRunner):
    """RLlib's SingleAgentEnvRunner, sampling through `VectorEpisodes`
    where its configuration allows (`vectorized`), RLlib's loop otherwise."""

    def __init__(self, *, config: Any, **kwargs: Any):
        episode.rllib.install()
        super().__init__(config=config, **kwargs)
        self._vector: Optional[VectorEpisodes] = None
        # The observations of the last reset or step: the module's next input.
        self._last_obs: Any = None
        self.vectorized = self._can_vectorize()

    def make_env(self) -> None:
        super().make_env()
        # A new env starts over (RLlib's loop resets it too).
        self._vector = None
        if hasattr(self, "vectorized"):
            self.vectorized = self._can_vectorize()

    def _can_vectorize(self) -> bool:
        """Whether the vector loop does exactly what RLlib's loop does here."""
        env, module = self.env, self.module
        if env is None or not isinstance(module, TorchRLModule) or module.is_stateful():
            return False
        # Its forward passes are RLlib's wrappers (switching to eval mode and
        # back), which the vector loop does once per call.
        if type(module).forward_exploration is not TorchRLModule.forward_exploration or \
                type(module).forward_inference is not TorchRLModule.forward_inference:
            return False
        if env.metadata.get("autoreset_mode", "NextStep") not in ("NextStep",) and \
                getattr(env.metadata.get("autoreset_mode"), "value", None) != "NextStep":
            return False
        if tuple(type(c) for c in self._env_to_module.connectors) != ENV_TO_MODULE or \
                tuple(type(c) for c in self._module_to_env.connectors) != MODULE_TO_ENV:
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
        if not self.vectorized:
            return super()._sample(num_timesteps=num_timesteps, num_episodes=num_episodes,
                                   explore=explore, random_actions=random_actions,
                                   force_reset=force_reset)
        ts = 0
        if force_reset or num_episodes is not None or self._needs_initial_reset \
                or self._vector is None:
            self._reset_vector()
        if num_episodes is not None:
            # As RLlib's loop: the next call starts over, seeded again.
            self._needs_initial_reset = True
        # The module stays in eval mode for the call (its forward_exploration
        # and forward_inference switch to it and back at every step: a fifth
        # of the step's time with RLlib's default PPO module).
        module = self.module
        was_training = module.training
        module.eval()
        try:
            ts, done_episodes = self._run(ts, num_timesteps, num_episodes, explore,
                                          random_actions)
        finally:
            if was_training:
                module.train()
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

    def _run(self, ts: int, num_timesteps: Optional[int], num_episodes: Optional[int],
             explore: bool, random_actions: bool) -> tuple:
        """The env steps of one sample() call: (env steps, ended episodes)."""
        vector = self._vector
        done_episodes: list = []
        while (ts < num_timesteps) if num_timesteps is not None \
                else (len(done_episodes) < num_episodes):
            if random_actions:
                actions = actions_for_env = self.env.action_space.sample()
                outputs: dict = {}
            else:
                actions, actions_for_env, outputs = self._compute_actions(explore, ts)
            results = self._try_env_step(actions_for_env)
            if results is ENV_STEP_FAILURE:
                # The env was made anew: start over, as RLlib's loop does.
                ts = 0
                self._reset_vector()
                vector = self._vector
                continue
            observations, rewards, terminateds, truncateds, infos = results
            # A Python int per step, as RLlib's loop adds it.
            outputs[WEIGHTS_SEQ_NO] = [self._weights_seq_no] * self.num_envs
            ended = vector.add_step(observations, actions, rewards, terminateds, truncateds,
                                    infos if any(infos) else None,
                                    extra_model_outputs=outputs)
            ts += vector.steps_added
            self._last_obs = observations
            for ep in ended:
                if num_episodes is not None and len(done_episodes) >= num_episodes:
                    break
                done_episodes.append(ep.to_numpy() if self.episodes_to_numpy else ep)
        return ts, done_episodes

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
        as batches) for the last observations, as RLlib's default pipelines
        and the module give them."""
        module = self.module
        batch = {Columns.OBS: convert_to_torch_tensor(self._last_obs, device=self._device)}
        # forward_exploration/inference without their switch to eval mode and
        # back: the module is in eval mode already (see _sample).
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            if explore:
                runners = self.config.num_env_runners or 1
                t = (self.num_env_steps_sampled_lifetime // runners + ts) * runners
                out = module._forward_exploration(batch, t=t)
            else:
                out = module._forward_inference(batch)
        if Columns.ACTIONS not in out and Columns.ACTION_DIST_INPUTS in out:
            dist_cls = (module.get_exploration_action_dist_cls() if explore
                        else module.get_inference_action_dist_cls())
            dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
            if not explore:
                dist = dist.to_deterministic()
            out[Columns.ACTIONS] = dist.sample()
            if Columns.ACTION_LOGP not in out:
                out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS])
        out = _to_numpy(out)
        actions = out.pop(Columns.ACTIONS)
        actions_for_env = out.pop(Columns.ACTIONS_FOR_ENV, None)
        if actions_for_env is None:
            actions_for_env = self._for_env(actions)
        return actions, actions_for_env, out

    def _for_env(self, actions: Any) -> Any:
        # NormalizeAndClipActions: the env gets the actions unsquashed (or
        # clipped) into its space, the episodes keep them as drawn.
        connector = self._module_to_env.connectors[MODULE_TO_ENV.index(NormalizeAndClipActions)]
        if connector.normalize_actions:
            for_env = unsquash_action(actions, connector._action_space_struct)
        elif connector.clip_actions:
            for_env = clip_action(actions, connector._action_space_struct)
        else:
            return actions
        # The env gets its own copy, as RLlib's connector hands it one.
        return for_env.copy() if for_env is actions else for_env


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
        if np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32)
        elif np.issubdtype(array.dtype, int):
            array = array.astype(np.int32)
        out[key] = array
    return out
