"""The learner's side of a replayed batch.

RLlib's DQN and SAC learners turn the episodes a replay buffer sampled into
a train batch with their default learner connector pipeline
(AddObservationsFromEpisodesToBatch, AddNextObservationsFromEpisodesToTrainBatch,
AddColumnsFromEpisodesToTrainBatch, AddTimeDimToBatchAndZeroPad,
AddStatesFromEpisodesToBatch, BatchIndividualItems, NumpyToTensor): item by
item, episode by episode. Episodes sampled from our buffers were made of a
few batch arrays (`episode.replay`), so while they are unchanged the same
batch is those arrays: `learner_call` builds it from them (same keys, order,
dtypes and values; the same episode ids RLlib's connector gives them, the
same metrics keys), runs the pipeline's NumpyToTensor on it, and leaves
every other pipeline, module or episode list to RLlib's connectors.

`episode.rllib.install()` puts `learner_call` in place of
`LearnerConnectorPipeline.__call__`.

`drawn_columns` goes one step further for a caller that holds the buffer
and hands the drawn episodes to that default pipeline right away (the
offline prelearner): it draws as `sample(sample_episodes=True)` would and
gathers the same columns without making the episodes at all.

Importing this module imports ray.
"""
from __future__ import annotations

from typing import Any, Optional

from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (
    AddObservationsFromEpisodesToBatch)
from ray.rllib.connectors.common.add_states_from_episodes_to_batch import (
    AddStatesFromEpisodesToBatch)
from ray.rllib.connectors.common.add_time_dim_to_batch_and_zero_pad import (
    AddTimeDimToBatchAndZeroPad)
from ray.rllib.connectors.common.batch_individual_items import BatchIndividualItems
from ray.rllib.connectors.common.numpy_to_tensor import NumpyToTensor
from ray.rllib.connectors.learner.add_columns_from_episodes_to_train_batch import (
    AddColumnsFromEpisodesToTrainBatch)
from ray.rllib.connectors.learner.add_next_observations_from_episodes_to_train_batch import (
    AddNextObservationsFromEpisodesToTrainBatch)
from ray.rllib.connectors.learner.learner_connector_pipeline import LearnerConnectorPipeline
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    CONNECTOR_PIPELINE_TIMER,
    CONNECTOR_TIMERS,
    LEARNER_CONNECTOR,
    LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_IN,
    LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_OUT,
    TIMERS,
)
from ray.rllib.utils.metrics.utils import to_snake_case

from episode.replay import EpisodeReplayBuffer
from episode.replay.draws import replayed_columns
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["drawn_columns", "learner_call", "rllib_learner_call"]

# RLlib's default DQN/SAC learner pipeline, connector by connector.
DEFAULT_PIPELINE = (
    AddObservationsFromEpisodesToBatch,
    AddNextObservationsFromEpisodesToTrainBatch,
    AddColumnsFromEpisodesToTrainBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    BatchIndividualItems,
    NumpyToTensor,
)

# RLlib's own __call__ (install() keeps it here while ours is in place).
rllib_learner_call = LearnerConnectorPipeline.__call__


def learner_call(self, *, rl_module, batch: Optional[dict] = None, episodes: list,
                 explore: bool = False, shared_data: Optional[dict] = None,
                 metrics: Any = None, **kwargs):
    """LearnerConnectorPipeline.__call__ with the fast path for replayed
    episodes (see the module docstring)."""
    columns = None
    if not batch and not kwargs and _default_pipeline(self, rl_module) and episodes \
            and type(episodes) is list and type(episodes[0]) is SingleAgentEpisode:
        columns = replayed_columns(episodes)
    if columns is None:
        return rllib_learner_call(self, rl_module=rl_module, batch=batch, episodes=episodes,
                                  explore=explore, shared_data=shared_data, metrics=metrics,
                                  **kwargs)
    shared_data = shared_data if shared_data is not None else {}
    prefix = (ALL_MODULES, LEARNER_CONNECTOR)
    if metrics:
        metrics.log_value((ALL_MODULES, LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_IN),
                          len(episodes))
        pipeline_timer = metrics.log_time(prefix + (CONNECTOR_PIPELINE_TIMER,))
        pipeline_timer.__enter__()
    # What AddObservationsFromEpisodesToBatch does to the episodes' ids (so
    # that each is its own key), and what BatchIndividualItems shares.
    for i, episode in enumerate(episodes):
        if "_" not in episode.id_:
            episode.id_ += "_" + str(i)
    shared_data["memorized_map_structure"] = [episode.id_ for episode in episodes]
    out: dict = {DEFAULT_MODULE_ID: columns} if isinstance(rl_module, MultiRLModule) \
        else columns
    for connector in self.connectors:
        timer = None
        if metrics:
            timer = metrics.log_time(prefix + (TIMERS, CONNECTOR_TIMERS,
                                               to_snake_case(type(connector).__name__)))
            timer.__enter__()
        if type(connector) is NumpyToTensor:
            out = connector(rl_module=rl_module, batch=out, episodes=episodes, explore=explore,
                            shared_data=shared_data, metrics=metrics, data=out,
                            metrics_prefix_key=prefix)
        if timer is not None:
            timer.__exit__(None, None, None)
    if metrics:
        pipeline_timer.__exit__(None, None, None)
        metrics.log_value((ALL_MODULES, LEARNER_CONNECTOR_SUM_EPISODES_LENGTH_OUT),
                          len(episodes))
    return out


def _default_pipeline(pipeline, rl_module) -> bool:
    # RLlib's default pipeline, as configured for a stateless module of one
    # agent (nothing for the time-dim and state connectors to do).
    if tuple(type(c) for c in pipeline.connectors) != DEFAULT_PIPELINE:
        return False
    observations, batching = pipeline.connectors[0], pipeline.connectors[5]
    if not observations._as_learner_connector or batching._multi_agent:
        return False
    modules = rl_module.values() if isinstance(rl_module, MultiRLModule) else [rl_module]
    modules = list(modules)
    if isinstance(rl_module, MultiRLModule) and list(rl_module.keys()) != [DEFAULT_MODULE_ID]:
        return False
    return all(not module.is_stateful() for module in modules)


def drawn_columns(buffer: Any, num_items: int, n_step: Any, min_batch_length_T: Any = 0,
                  gamma: float = 0.99) -> Optional[dict]:
    """The columns RLlib's default learner pipeline (before its
    NumpyToTensor) makes of ``buffer.sample(num_items=num_items,
    n_step=n_step, min_batch_length_T=..., sample_episodes=True)``'s
    one-step episodes: drawn exactly as that call draws (the same random
    numbers, and the same counts and metrics left in the buffer), gathered
    from the stored rows without making an episode each. obs, new_obs,
    actions, rewards (the discounted n-step sums), terminateds and
    truncateds (set where a transition ends exactly at its episode's end),
    n_step (int64) and weights (float64 ones).

    None, before anything is drawn, where this does not apply: a buffer
    other than our plain EpisodeReplayBuffer (a subclass, a user's class),
    an n-step other than a positive int, an empty buffer, observations or
    actions that are not one numeric leaf (Dict/Tuple items, objects). The
    caller then samples the episodes as usual."""
    if type(buffer) is not EpisodeReplayBuffer or type(n_step) is not int or n_step < 1 \
            or type(num_items) is not int or num_items < 1 \
            or type(min_batch_length_T) is not int or min_batch_length_T < 0:
        return None
    return buffer._transition_columns(num_items, n_step, min_batch_length_T, gamma)
