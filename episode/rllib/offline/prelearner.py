"""`OfflinePreLearner`: RLlib's prelearner on our episodes, a batch of a
dataset's rows (RLlib's two recorded formats or our native one) to a train
batch. Rows with episode ids become whole episodes (RLlib makes one episode
of each row); multi-agent data is read as its agents' episodes, each keeping
its module id."""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from episode._extras import rllib_missing

try:
    import pyarrow as pa
    from ray.rllib.connectors.learner.learner_connector_pipeline import (
        LearnerConnectorPipeline)
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
    from ray.rllib.core.columns import Columns
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner as RLlibOfflinePreLearner
    from ray.rllib.offline.offline_prelearner import _validate_deprecated_map_args
    from ray.rllib.utils import flatten_dict
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.offline") from e

from episode.replay import EpisodeReplayBuffer
from episode.rllib import patch
from episode.rllib.offline.files import NATIVE_COLUMN, _input_paths, _NativeEpisodes, _resolve
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["OfflinePreLearner"]


class _AcceptsRLlibSubclasses(type):
    """The metaclass of a class that stands in for one of RLlib's (named by
    its `_replaces`): RLlib's config checks ``issubclass(user_class,
    <the class in RLlib's module>)``, which is ours once installed, and a
    user's subclass of RLlib's own class passes it too."""

    def __subclasscheck__(cls, sub: Any) -> bool:
        if type.__subclasscheck__(cls, sub):
            return True
        replaces = cls.__dict__.get("_replaces")
        return replaces is not None and isinstance(sub, type) and issubclass(sub, replaces)


class OfflinePreLearner(RLlibOfflinePreLearner, metaclass=_AcceptsRLlibSubclasses):
    """RLlib's OfflinePreLearner on our episodes: a batch of a dataset's rows
    (as Ray Data's map_batches hands them) to a flattened train batch.

    A batch of RLlib's episode format (a column ``item``) or of our native
    format is decoded without msgpack_numpy, the episodes go into the
    prelearner's replay buffer (ours unless ``prelearner_buffer_class``
    says otherwise) and ``train_batch_size_per_learner`` transitions are
    drawn from it, as RLlib does (for RLlib's default learner pipeline, a
    stateless module of one agent and our plain buffer, gathered straight
    into the train batch, without an episode per transition); a batch of
    RLlib's row format becomes
    whole episodes where it has episode ids (RLlib: one episode per row),
    which go to the learner connector as they are. Multi-agent data is
    read as its agents' episodes, each with its module id.
    """

    _replaces = RLlibOfflinePreLearner
    default_prelearner_buffer_class = EpisodeReplayBuffer

    def __init__(self, *, config: Any, spaces: Any = None, module_state: Any = None,
                 **kwargs: Any):
        # (In a Ray worker started before install(), as the runners do.)
        patch.install()
        super().__init__(config=config, spaces=spaces, module_state=module_state, **kwargs)

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The train batch (flattened: ``"<module>/<column>"`` keys) of a
        batch of rows."""
        from episode.offline.rllib_format import no_collections

        # The episodes read and the transitions drawn (a thousand objects
        # each) die with this call: the cyclic collector, off until then,
        # never walks them (with it on, they set off full collections of
        # the learner's heap: two thirds of the call).
        with no_collections():
            return self._train_batch(batch)

    def _train_batch(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        if NATIVE_COLUMN in batch:
            # A native dataset's episodes need not be done (a recording's
            # chunks join when read).
            episodes = self._unique(self._native_episodes(batch[NATIVE_COLUMN]))
            if self._draws_train_batch():
                return self._drawn_train_batch(episodes)
            episodes = self._sample_from_buffer(episodes)
        elif "item" in batch:
            episodes = self._unpack_episodes(batch["item"])
            if self._draws_train_batch():
                return self._drawn_train_batch(self._validate_episodes(episodes))
            episodes = self._postprocess_and_sample(episodes)
        elif self.config.input_read_sample_batches:
            episodes = self._postprocess_and_sample(
                self._map_sample_batch_to_episode(batch, to_numpy=True)["episodes"])
        elif self.config.is_multi_agent:
            # Each module gets as many rows (Ray Data's batches are tables).
            episodes = self._sample_from_buffer(
                self._unique(self._map_to_episodes(batch, to_numpy=False)["episodes"]))
        else:
            episodes = self._map_to_episodes(batch, to_numpy=False)["episodes"]
            train_batch = self._columns_of_whole_episodes(episodes)
            if train_batch is not None:
                return train_batch
        batch = self._learner_connector(rl_module=self._module, batch={}, episodes=episodes,
                                        shared_data={}, metrics=None)
        for module_id in list(batch):
            if not self._should_module_be_updated(module_id, batch):
                del batch[module_id]
        return flatten_dict(batch)

    def _draws_train_batch(self) -> bool:
        """Whether the episodes read can go into the buffer and the train
        batch come straight from its draw (`_drawn_train_batch`): for a
        single-agent config whose learner pipeline is RLlib's default one
        for a stateless module (BC's, MARWIL's without its GAE, CQL's),
        our plain buffer, and this class's own ways of adding and drawing
        (a subclass that overrides them is called as RLlib calls them)."""
        from episode.rllib.learner import _default_pipeline

        cls = type(self)
        if any(getattr(cls, name) is not getattr(OfflinePreLearner, name)
               for name in ("_postprocess_and_sample", "_sample_from_buffer",
                            "_drawn_train_batch")):
            return False
        pipeline = self._learner_connector
        return (not self.config.is_multi_agent
                and type(pipeline) is LearnerConnectorPipeline
                and _default_pipeline(pipeline, self._module)
                and type(self._buffer()) is EpisodeReplayBuffer)

    def _drawn_train_batch(self, episodes: list) -> Dict[str, Any]:
        """The flattened train batch of the episodes read, as adding them to
        the buffer, drawing ``train_batch_size_per_learner`` transitions and
        running the learner pipeline on them makes it: the same draws and
        values, gathered from the buffer's rows without an episode per
        transition (`episode.rllib.learner.drawn_columns`); through those
        episodes where the stored layout is not one it gathers."""
        from episode.rllib.learner import drawn_columns

        buffer = self._buffer()
        buffer.add(episodes)
        columns = drawn_columns(buffer, self.config.train_batch_size_per_learner,
                                self.config.get("n_step", 1),
                                getattr(self.config, "burnin_len", 0))
        if columns is None:
            batch = self._learner_connector(
                rl_module=self._module, batch={}, episodes=buffer.sample(**self._draw_args()),
                shared_data={}, metrics=None)
        else:
            data = {DEFAULT_MODULE_ID: columns} if isinstance(self._module, MultiRLModule) \
                else columns
            batch = self._learner_connector.connectors[-1](
                rl_module=self._module, batch=data, episodes=[], shared_data={}, metrics=None)
        for module_id in list(batch):
            if not self._should_module_be_updated(module_id, batch):
                del batch[module_id]
        return flatten_dict(batch)

    def _columns_of_whole_episodes(self, episodes: list) -> Optional[Dict[str, Any]]:
        """The flattened train batch RLlib's default learner connectors (BC's,
        CQL's) make of rows' whole episodes, from their columns: each step's
        observation, next observation, action, reward and extra model
        outputs, the done flags on each episode's last step. None (the
        connectors run) for other pipelines, a stateful module, episodes
        that are not our numpy'able single-agent ones with array tracks, or
        extra outputs that differ between episodes."""
        from episode.rllib.learner import _default_pipeline

        episodes = [e for e in episodes if len(e)]
        if not episodes or not _default_pipeline(self._learner_connector, self._module) \
                or any(type(e) is not SingleAgentEpisode for e in episodes):
            return None
        keys = list(episodes[0].extra_model_outputs)
        if any(list(e.extra_model_outputs) != keys for e in episodes) \
                or {Columns.STATE_IN, Columns.STATE_OUT} & set(keys):
            return None
        for e in episodes:
            e.to_numpy()

        def column(get: Any) -> Optional[np.ndarray]:
            parts = [get(e, slice(0, len(e))) for e in episodes]
            if not all(type(p) is np.ndarray for p in parts):
                return None
            return np.concatenate(parts)

        columns = {
            Columns.OBS: column(lambda e, s: e.get_observations(s)),
            Columns.NEXT_OBS: column(lambda e, s: e.get_observations(slice(1, s.stop + 1))),
            Columns.ACTIONS: column(lambda e, s: e.get_actions(s)),
            Columns.REWARDS: column(lambda e, s: e.get_rewards(s)),
        }
        ends = np.cumsum([len(e) for e in episodes]) - 1
        for name, flag in ((Columns.TERMINATEDS, "is_terminated"),
                           (Columns.TRUNCATEDS, "is_truncated")):
            done = np.zeros(ends[-1] + 1, dtype=bool)
            done[ends] = [bool(getattr(e, flag)) for e in episodes]
            columns[name] = done
        for key in keys:
            if key not in columns:
                columns[key] = column(lambda e, s, key=key: e.get_extra_model_outputs(key, s))
        if any(value is None for value in columns.values()):
            return None
        module_id = next(iter(self._module.keys()))
        tensors = self._learner_connector.connectors[-1](
            rl_module=self._module, batch={module_id: columns}, episodes=episodes,
            shared_data={}, metrics=None)
        return flatten_dict({m: b for m, b in tensors.items()
                             if self._should_module_be_updated(m, tensors)})

    # -- episodes from the batch ------------------------------------------------------------

    def _unpack_episodes(self, items: Any) -> list:
        from episode.offline import rllib_format

        return rllib_format.unpack_episodes(items)

    def _native_episodes(self, numbers: Any) -> list:
        # The dataset is opened once per prelearner (its episode tables).
        dataset = self.__dict__.get("_native")
        if dataset is None:
            paths = [_resolve(p, None)[1] for p in _input_paths(self.config)]
            dataset = self._native = _NativeEpisodes(paths)
        episodes = []
        for i in np.asarray(numbers).tolist():
            episode = dataset[i]
            if hasattr(episode, "agent_episodes"):
                episodes.extend(a for a in episode.agent_episodes.values() if len(a))
            else:
                episodes.append(episode)
        return episodes

    def _map_to_episodes(self, batch: Dict[str, Any], to_numpy: bool = False,
                         **kwargs: Any) -> Dict[str, List[Any]]:
        """RLlib's rows to episodes: whole episodes where the rows have
        episode ids (``eps_id``), one per row otherwise; multi-agent rows
        by their agent and module."""
        from episode.offline import rllib_format

        is_multi_agent, schema, compress = _validate_deprecated_map_args(kwargs, self.config)
        schema = rllib_format.SCHEMA | dict(schema)
        whole = schema[Columns.EPS_ID] in batch
        episodes = []
        for part, agent_id, module_id in _by_agent(batch, schema, is_multi_agent):
            made = rllib_format.rows_to_episodes(
                part, schema=schema, compress_columns=compress,
                ignore_final_observation=self.config.ignore_final_observation,
                whole_episodes=whole)
            for episode in made:
                if agent_id is not None:
                    episode.agent_id = agent_id
                if module_id is not None:
                    episode.module_id = module_id
                if to_numpy:
                    episode.to_numpy()
            episodes.extend(made)
        return {"episodes": episodes}

    def _map_sample_batch_to_episode(self, batch: Dict[str, Any], to_numpy: bool = False,
                                     **kwargs: Any) -> Dict[str, List[Any]]:
        """Old-stack SampleBatch rows to episodes, as RLlib reads them."""
        from episode.offline import rllib_format

        _, schema, compress = _validate_deprecated_map_args(kwargs, self.config)
        return {"episodes": rllib_format.sample_batches_to_episodes(
            batch, schema=schema, compress_columns=compress or [], to_numpy=to_numpy)}

    # -- through the buffer ------------------------------------------------------------------

    def _validate_episodes(self, episodes: list) -> list:
        """RLlib's checks of read episodes: each must be done (RLlib's
        ValueError otherwise); an episode whose id came before (in this batch
        or the buffer) is dropped. Keeps their order (RLlib's gives a set)."""
        if not all(episode.is_done for episode in episodes):
            raise ValueError(
                "When sampling from episodes (`input_read_episodes=True`) all recorded "
                "episodes must be done (i.e. either `terminated=True`) or `truncated=True`).")
        return self._unique(episodes)

    def _unique(self, episodes: list) -> list:
        stored: dict = {}   # module id -> ids in its buffer (looked up once per call)
        seen: set = set()
        kept = []
        for episode in episodes:
            key = (episode.module_id, episode.id_)
            ids = stored.get(episode.module_id)
            if ids is None:
                ids = stored[episode.module_id] = self._buffer(
                    episode.module_id).episode_id_to_index
            if key not in seen and episode.id_ not in ids:
                seen.add(key)
                kept.append(episode)
        return kept

    def _buffer(self, module_id: Any = None) -> Any:
        """The buffer of the episodes read (of a module's agents' episodes
        for multi-agent data): RLlib makes one only when its config says
        the data are episodes; here the data itself can say so."""
        if not self.config.is_multi_agent:
            buffer = getattr(self, "episode_buffer", None)
            if buffer is None:
                buffer = self.episode_buffer = self._new_buffer()
            return buffer
        buffers = self.__dict__.setdefault("episode_buffers", {})
        buffer = buffers.get(module_id)
        if buffer is None:
            buffer = buffers[module_id] = self._new_buffer()
        return buffer

    def _new_buffer(self) -> Any:
        buffer_class = self.config.prelearner_buffer_class or self.default_prelearner_buffer_class
        kwargs = {"capacity": self.config.train_batch_size_per_learner * 10,
                  "batch_size_B": self.config.train_batch_size_per_learner} | \
            self.config.prelearner_buffer_kwargs
        return buffer_class(**kwargs)

    def _postprocess_and_sample(self, episodes: list) -> list:
        """RLlib's: the episodes checked (`_validate_episodes`) and added to
        the buffer, then ``train_batch_size_per_learner`` items drawn from
        it (that many for each module of multi-agent data, as RLlib's
        multi-agent buffer draws)."""
        return self._sample_from_buffer(self._validate_episodes(episodes))

    def _sample_from_buffer(self, episodes: list) -> list:
        if self._module.is_stateful() and not self.config.prelearner_use_recorded_module_states:
            for episode in episodes:
                episode.extra_model_outputs.pop(Columns.STATE_OUT, None)
                episode.extra_model_outputs.pop(Columns.STATE_IN, None)
        draw = self._draw_args()
        if not self.config.is_multi_agent:
            buffer = self._buffer()
            buffer.add(episodes)
            return buffer.sample(**draw)
        by_module: dict = {}
        for episode in episodes:
            by_module.setdefault(episode.module_id, []).append(episode)
        sampled = []
        # The algorithm's modules only (agents of others are not trained).
        for module_id in self._module.keys():
            buffer = self._buffer(module_id)
            if module_id in by_module:
                buffer.add(by_module[module_id])
            if buffer.get_num_timesteps():
                sampled.extend(buffer.sample(**draw))
        return sampled

    def _draw_args(self) -> dict:
        # RLlib's arguments of the buffer's sample().
        return {
            "num_items": self.config.train_batch_size_per_learner,
            "batch_length_T": (self.config.model_config.get("max_seq_len", 0)
                               if self._module.is_stateful() else None),
            "n_step": self.config.get("n_step", 1),
            "sample_episodes": True,
            "to_numpy": True,
            "lookback": self.config.episode_lookback_horizon,
            "min_batch_length_T": getattr(self.config, "burnin_len", 0),
        }


def _rows_of(batch: Any) -> int:
    first = next(iter(batch.values()), None) if isinstance(batch, dict) else None
    return batch.num_rows if first is None and hasattr(batch, "num_rows") else len(first)


def _by_agent(batch: Any, schema: dict, multi_agent: bool) -> Iterator[tuple]:
    """(rows, agent id, module id) of each agent in a batch of multi-agent
    rows, in order of first appearance; the whole batch for single-agent
    rows or rows without agent ids."""
    agents = batch.get(schema[Columns.AGENT_ID]) if multi_agent else None
    modules = batch.get(schema[Columns.MODULE_ID]) if multi_agent else None
    if agents is None and modules is None:
        yield batch, None, None
        return
    n = _rows_of(batch)
    keys = list(zip(_ids(agents, n), _ids(modules, n)))
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for (agent_id, module_id), rows in groups.items():
        index = np.asarray(rows)
        if len(groups) == 1:
            part = batch
        elif isinstance(batch, dict):
            part = {k: (v[index] if isinstance(v, np.ndarray) else [v[i] for i in rows])
                    for k, v in batch.items()}
        else:
            part = batch.take(pa.array(index))
        yield part, agent_id, module_id


def _ids(values: Any, n: int) -> list:
    # A column of ids as Python values; a null column (Ray Data gives
    # floats NaN for it) as Nones.
    if values is None:
        return [None] * n
    out = values.tolist() if hasattr(values, "tolist") else list(values)
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in out]
