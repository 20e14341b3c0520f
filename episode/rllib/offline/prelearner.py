"""RLlib's offline API on our engine: recording with ``output=`` and
reading with ``input_=``.

`episode.rllib.install()` puts these classes in place of RLlib 2.60's:

- `OfflineSingleAgentEnvRunner` (and `OfflineMultiAgentEnvRunner`, which
  RLlib lacks): RLlib's recording runner on our `SingleAgentEnvRunner`
  (`MultiAgentEnvRunner`). What `sample()` returns is written with pyarrow,
  each file aside and then renamed into place: in RLlib's episode format
  (``output_write_episodes=True``, its default: packed episode states in a
  binary column ``item``), its row format (one row per step; the infos in
  each file's schema metadata, where RLlib's reader does not look), or our native format with
  ``output_write_method="write_episodes"``. Every sample() writes only what
  is new; with ``output_max_rows_per_file`` every full file is written;
  under ``batch_mode="complete_episodes"`` only done episodes are (a chunk
  that a ``sample(num_timesteps=...)`` call cut waits for the rest of its
  episode). A write method only Ray Data has (``write_json``, ...) goes
  through Ray Data, as RLlib writes everything.
- `OfflineData` and `OfflinePreLearner`: RLlib's reading, for RLlib's two
  recorded formats and our native one (told apart by their files). Rows
  with episode ids become whole episodes (RLlib makes one episode of each
  row); multi-agent data is read as its agents' episodes, each keeping its
  module id. With a local learner (``num_learners=0``) the data is read and
  mapped in this process, the prelearner called on each batch of rows as
  Ray Data would call it, without Ray Data's actors; with remote learners
  it goes through Ray Data (``map_batches`` with the prelearner,
  ``streaming_split``) as RLlib's does.

Classes a user passes as ``offline_data_class`` or ``prelearner_class``
keep working: subclasses of these (or of RLlib's, which RLlib's config
checks accept too) run on our episodes.

Importing this module imports ray, pyarrow and torch.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import secrets
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from episode._extras import rllib_missing

try:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray
    from ray.rllib.connectors.learner.learner_connector_pipeline import (
        LearnerConnectorPipeline)
    from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
    from ray.rllib.core.columns import Columns
    from ray.rllib.env import INPUT_ENV_SPACES
    from ray.rllib.offline.offline_data import OfflineData as RLlibOfflineData
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner as RLlibOfflinePreLearner
    from ray.rllib.offline.offline_prelearner import _validate_deprecated_map_args
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils import flatten_dict, unflatten_dict
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.offline") from e

from episode.replay import EpisodeReplayBuffer
from episode.rllib import patch
from episode.single_agent_episode import SingleAgentEpisode
from episode.rllib.runners import MultiAgentEnvRunner, SingleAgentEnvRunner

logger = logging.getLogger(__name__)

__all__ = ["NATIVE_WRITE_METHOD", "OfflineData", "OfflineMultiAgentEnvRunner",
           "OfflinePreLearner", "OfflineSingleAgentEnvRunner"]

#: The ``output_write_method`` that records in our native format
#: (`episode.offline.EpisodeWriter`; ``output_write_method_kwargs`` are its
#: keyword arguments: ``format``, ``compression``).
NATIVE_WRITE_METHOD = "write_episodes"

# The column of episode numbers that stands for a native dataset in Ray
# Data (each prelearner builds those episodes from the files).
NATIVE_COLUMN = "__episode_index"

# Keyword arguments of Ray Data's write_parquet that pyarrow's writer takes
# here (Ray passes the rest on to pyarrow.parquet.write_table, as we do).
_RAY_ONLY_WRITE_KWARGS = frozenset((
    "arrow_parquet_args_fn", "min_rows_per_file", "num_rows_per_file", "ray_remote_args",
    "concurrency", "partition_cols", "filename_provider", "mode", "block_path_provider"))
_WRITE_KWARGS_IGNORED = frozenset(("filesystem", "try_create_dir"))
# ... and of read_parquet that an in-process read honours.
_LOCAL_READ_KWARGS = frozenset(("filesystem", "columns"))


# -- files -----------------------------------------------------------------------------------


def _filesystem(kind: Any, kwargs: Optional[dict], option: str) -> Any:
    """The pyarrow filesystem of RLlib's ``input_filesystem`` /
    ``output_filesystem`` setting (None: from the path)."""
    kwargs = kwargs or {}
    if kind is None:
        return None
    if isinstance(kind, pafs.FileSystem):
        return kind
    if kind == "s3":
        return pafs.S3FileSystem(**kwargs)
    if kind == "gcs":
        import gcsfs

        return pafs.PyFileSystem(pafs.FSSpecHandler(gcsfs.GCSFileSystem(**kwargs)))
    if kind == "abs":
        import adlfs

        return pafs.PyFileSystem(pafs.FSSpecHandler(adlfs.AzureBlobFileSystem(**kwargs)))
    raise ValueError(f"Unknown `config.{option}` {kind!r}: filesystems are None for local "
                     f"files, a pyarrow.fs.FileSystem, 'gcs', 's3' or 'abs'.")


def _resolve(path: Any, filesystem: Any) -> tuple:
    """(pyarrow filesystem, path on it) of a local path or URI."""
    path = os.fspath(path)
    if path.startswith("local://"):
        path = path[len("local://"):]
    elif "://" in path:
        if filesystem is None:
            return pafs.FileSystem.from_uri(path)
        return filesystem, path.split("://", 1)[1]
    if filesystem is None or isinstance(filesystem, pafs.LocalFileSystem):
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return filesystem, path


def _is_local(filesystem: Any) -> bool:
    return isinstance(filesystem, pafs.LocalFileSystem)


def _write_parquet(filesystem: Any, path: str, table: Any, kwargs: dict) -> None:
    """Writes `table` to `path` as a Parquet file that appears whole: written
    under a hidden name beside it (readers skip names starting with '.'),
    then renamed into place."""
    folder, name = path.rsplit("/", 1)
    temp = f"{folder}/.{name}.{secrets.token_hex(4)}.tmp"
    filesystem.create_dir(folder, recursive=True)
    try:
        if _is_local(filesystem):
            with open(temp, "wb") as f:
                pq.write_table(table, f, **kwargs)
                f.flush()
                os.fsync(f.fileno())
        else:
            with filesystem.open_output_stream(temp) as sink:
                pq.write_table(table, sink, **kwargs)
        filesystem.move(temp, path)
    finally:
        if filesystem.get_file_info(temp).type != pafs.FileType.NotFound:
            filesystem.delete_file(temp)


def _input_files(paths: list, filesystem: Any, extension: Optional[str] = None) -> list:
    """(filesystem, file) of each file named by the input paths and each
    file in their folders (with `extension`, if given), in order, skipping
    hidden names (starting with '.' or '_'), as Ray Data does."""
    found = []
    for raw in paths:
        fs, path = _resolve(raw, filesystem)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"config.input_: no file or folder at {raw}")
        if info.type == pafs.FileType.File:
            found.append((fs, path))
            continue
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        for item in sorted(infos, key=lambda i: i.path):
            relative = item.path[len(path):].lstrip("/")
            if item.type == pafs.FileType.File and not any(
                    part.startswith((".", "_")) for part in relative.split("/")) and (
                    extension is None or item.path.endswith(extension)):
                found.append((fs, item.path))
    return found


def _native_paths(paths: list, filesystem: Any) -> Optional[list]:
    """The input's local paths when it holds a dataset of our native format
    (an episode table among its files), else None."""
    if filesystem is not None and not _is_local(filesystem):
        return None
    local = []
    for raw in paths:
        fs, path = _resolve(raw, filesystem)
        if not _is_local(fs):
            return None
        local.append(path)
    for fs, path in _input_files(local, None):
        stem = path.rsplit("/", 1)[-1].rpartition(".")[0]
        if stem.endswith(".episodes"):
            return local
    return None


class _NativeEpisodes:
    """The episodes of one or more native datasets (local paths), numbered
    in order."""

    def __init__(self, paths: list):
        from episode.offline import read_episodes

        self.datasets = [read_episodes(p) for p in paths]
        self.offsets = np.cumsum([0] + [len(d) for d in self.datasets])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Any:
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.datasets[k][int(i - self.offsets[k])]


# -- recording ---------------------------------------------------------------------------------


class _Recorder:
    """What a recording runner keeps until it is written, and the writing:
    RLlib's layout, ``<output>/<env>/run-<worker>-<sample call>/<file>``,
    for RLlib's formats; one dataset folder ``<output>/<env>`` for ours."""

    def __init__(self, runner: Any, subdir: str):
        config = runner.config
        self.method = config.output_write_method
        self.kwargs = dict(config.output_write_method_kwargs or {})
        self.write_episodes = bool(config.output_write_episodes)
        self.compress = list(config.output_compress_columns or [])
        self.max_rows = config.output_max_rows_per_file
        self.write_remaining = bool(config.output_write_remaining_data)
        self.complete_only = config.batch_mode == "complete_episodes"
        self.multi_agent = False
        self.output = os.fspath(config.output)
        self.subdir = subdir
        self.worker_path = "run-" + f"{runner.worker_index}".zfill(6)
        self.filesystem = _filesystem(config.output_filesystem,
                                      config.output_filesystem_kwargs, "output_filesystem")
        self.name = secrets.token_hex(6)
        self.files = 0
        self.num_cpus = config.num_cpus_per_env_runner
        self.ray_data_limited = False
        # Chunks of running episodes, until their episode is done (only
        # under complete_episodes), by id.
        self.unfinished: dict = {}
        # RLlib's formats: tables of rows waiting to be written.
        self.waiting: list = []
        self.rows = 0
        self.writer = None
        if self.method == NATIVE_WRITE_METHOD:
            from episode.offline import EpisodeWriter

            fs, folder = _resolve(self._join(self.output, subdir), self.filesystem)
            if not _is_local(fs):
                raise ValueError(f"output_write_method={NATIVE_WRITE_METHOD!r} writes into a "
                                 f"local (or mounted) folder, not {self.output!r}")
            self.writer = EpisodeWriter(folder, rows_per_file=self.max_rows or (1 << 62),
                                        **self.kwargs)

    @staticmethod
    def _join(*parts: str) -> str:
        return "/".join([parts[0].rstrip("/")] + [p.strip("/") for p in parts[1:]])

    # -- what is recorded ---------------------------------------------------------------------

    def _complete(self, samples: list) -> list:
        """The episodes of `samples` to record: under complete_episodes only
        done ones, a chunk joined to the chunks of its episode before it."""
        if not self.complete_only:
            return samples
        done = []
        for episode in samples:
            earlier = self.unfinished.pop(episode.id_, None)
            if earlier is not None:
                earlier.concat_episode(episode)
                episode = earlier
            if episode.is_done:
                done.append(episode)
            else:
                # Our own copy: the runner's caller keeps the chunk.
                self.unfinished[episode.id_] = episode if earlier is not None \
                    else copy.deepcopy(episode)
        return done

    def _table(self, episodes: list) -> Any:
        """RLlib's format of `episodes` (agents' episodes for multi-agent
        ones)."""
        from episode.offline import rllib_format

        if self.multi_agent:
            episodes = [agent for episode in episodes
                        for agent in episode.agent_episodes.values() if len(agent)]
        if self.write_episodes:
            return pa.table({"item": pa.array(rllib_format.pack_episodes(episodes),
                                              pa.binary())})
        # (The infos as a column while the rows wait: they are sliced and
        # joined; each file gets its own in its metadata.)
        return rllib_format.with_kept_infos(
            rllib_format.episode_rows(episodes, compress_columns=self.compress))

    def record(self, samples: list, sample_call: int) -> None:
        episodes = self._complete(samples)
        if self.writer is not None:
            if episodes:
                self.writer.write(episodes)
            if not self.max_rows:
                self._guarded(self.writer.flush)
            return
        if episodes:
            table = self._table(episodes)
            if table.num_rows:
                self.waiting.append(table)
                self.rows += table.num_rows
        if not self.max_rows:
            self._guarded(self._write, self.rows, sample_call)
            return
        while self.rows >= self.max_rows:
            if not self._guarded(self._write, self.max_rows, sample_call):
                break

    def finish(self, sample_call: int) -> None:
        """At stop(): what waits is written if RLlib's
        output_write_remaining_data says so."""
        if not self.write_remaining:
            return
        if self.writer is not None:
            self._guarded(self.writer.close)
        elif self.rows:
            self._guarded(self._write, self.rows, sample_call)

    @staticmethod
    def _guarded(write: Any, *args: Any) -> bool:
        """write(*args); a failed write is logged, as RLlib's runner logs it
        (sampling goes on), and its rows wait for the next write."""
        try:
            write(*args)
        except Exception as error:      # what RLlib's runner catches and logs
            logger.error(f"Recording failed, the rows wait for the next write: {error!r}")
            return False
        return True

    @property
    def waiting_rows(self) -> int:
        if self.writer is not None:
            return int(self.writer._recording.steps)
        return self.rows

    def _write(self, n: int, sample_call: int) -> None:
        """Writes the first n waiting rows as one file (kept waiting if the
        write raises)."""
        from episode.offline import rllib_format

        if not n:
            return
        table = self.waiting[0] if len(self.waiting) == 1 else pa.concat_tables(
            self.waiting, promote_options="default")
        self.waiting = [table]
        folder = self._join(self.output, self.subdir,
                            self.worker_path + f"-{sample_call}".zfill(6))
        kwargs = {k: v for k, v in self.kwargs.items() if k not in _WRITE_KWARGS_IGNORED}
        if self.method != "write_parquet" or _RAY_ONLY_WRITE_KWARGS & set(kwargs):
            # A write Ray Data has and pyarrow has not: through Ray Data.
            self._ray_write(rllib_format.infos_apart(table.slice(0, n)), folder)
        else:
            kwargs.pop("arrow_open_stream_args", None)
            fs, folder = _resolve(folder, self.filesystem)
            _write_parquet(fs, f"{folder}/{self.name}_{self.files:06d}.parquet",
                           rllib_format.infos_apart(table.slice(0, n)), kwargs)
            self.files += 1
        rest = table.slice(n)
        self.waiting = [rest] if rest.num_rows else []
        self.rows = rest.num_rows

    def _ray_write(self, table: Any, folder: str) -> None:
        """Writes `table` with Ray Data's write method into a hidden folder
        beside `folder`, then moves its files into `folder` (so they too
        appear whole). (Our rows' infos are in the table's schema metadata:
        Parquet keeps them, text formats drop them.)"""
        if not self.ray_data_limited:
            # As RLlib's runner: Ray Data gets the CPUs given to the runner.
            context = ray.data.DataContext.get_current()
            limits = context.execution_options.resource_limits
            context.execution_options.resource_limits = limits.copy(cpu=self.num_cpus)
            self.ray_data_limited = True
        fs, local_folder = _resolve(folder, self.filesystem)
        parent, name = local_folder.rsplit("/", 1)
        temp = f"{parent}/.{name}.{secrets.token_hex(4)}.tmp"
        kwargs = dict(self.kwargs)
        kwargs["filesystem"] = fs
        try:
            getattr(ray.data.from_arrow(table), self.method)(temp, **kwargs)
            fs.create_dir(local_folder, recursive=True)
            for info in fs.get_file_info(pafs.FileSelector(temp, recursive=True)):
                if info.type == pafs.FileType.File:
                    fs.move(info.path, f"{local_folder}/{info.path.rsplit('/', 1)[1]}")
        finally:
            if fs.get_file_info(temp).type != pafs.FileType.NotFound:
                fs.delete_dir(temp)


class _Recording:
    """The recording half of both recording runners (see the module
    docstring): sample() writes what it returns; stop() writes what waits."""

    _multi_agent = False

    def _start_recording(self) -> None:
        config = self.config
        # RLlib's recording runner hands on episodes as they are sampled
        # (list-mode), not numpy'd.
        self.episodes_to_numpy = False
        self.output_path = config.output
        self.output_write_method = config.output_write_method
        self.output_write_method_kwargs = config.output_write_method_kwargs
        self.output_write_episodes = config.output_write_episodes
        self.output_compress_columns = config.output_compress_columns
        self.output_max_rows_per_file = config.output_max_rows_per_file
        self.write_remaining_data = config.output_write_remaining_data
        self.filesystem = config.output_filesystem
        self.filesystem_kwargs = config.output_filesystem_kwargs
        self.worker_path = "run-" + f"{self.worker_index}".zfill(6)
        self._sample_counter = 0
        self._recorder: Optional[_Recorder] = None
        if self.env is not None:
            self.subdir_path = self._get_subdir_path()
            self._recorder = _Recorder(self, self.subdir_path)
            self._recorder.multi_agent = self._multi_agent
            self.filesystem_object = self._recorder.filesystem
        elif (config.create_env_on_local_worker and self.worker_index == 0) \
                or self.worker_index > 0:
            raise ValueError("To set up the output path, the environment `env` must be "
                             "provided when creating the recording EnvRunner.")

    def _get_subdir_path(self) -> str:
        """RLlib's folder for this env's recordings: the env's class name,
        lower case."""
        env = self.env.unwrapped
        envs = getattr(env, "envs", None)
        if envs:
            return type(envs[0].unwrapped).__name__.lower()
        mode = getattr(self.config, "gym_env_vectorize_mode", "sync")
        mode = getattr(mode, "value", mode)
        if str(mode).lower() == "async":
            return type(env.get_attr("unwrapped")[0]).__name__.lower()
        return type(env).__name__.lower()

    def sample(self, *, num_timesteps: Optional[int] = None, num_episodes: Optional[int] = None,
               explore: Optional[bool] = None, random_actions: bool = False,
               force_reset: bool = False) -> List[Any]:
        """RLlib's sample(), whose episodes are also recorded (see the module
        docstring)."""
        samples = super().sample(num_timesteps=num_timesteps, num_episodes=num_episodes,
                                 explore=explore, random_actions=random_actions,
                                 force_reset=force_reset)
        self._sample_counter += 1
        self._recorder.record(samples, self._sample_counter)
        self.metrics.log_value(key="recording_buffer_size", value=self._recorder.waiting_rows)
        return samples

    def stop(self) -> None:
        """Writes what waits (with output_write_remaining_data), then stops
        as the runner does (closing the env)."""
        if self._recorder is not None:
            self._sample_counter += 1
            self._recorder.finish(self._sample_counter)
        super().stop()


class OfflineSingleAgentEnvRunner(_Recording, SingleAgentEnvRunner):
    """RLlib's OfflineSingleAgentEnvRunner on our SingleAgentEnvRunner:
    samples as it does and records every sample() (see the module
    docstring for the formats and options)."""

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self._start_recording()


class OfflineMultiAgentEnvRunner(_Recording, MultiAgentEnvRunner):
    """A recording MultiAgentEnvRunner (RLlib has none): our native format
    keeps the multi-agent episodes whole; RLlib's formats hold each agent's
    episode (with its agent and module ids and the multi-agent episode's id
    as ``multi_agent_episode_id``)."""

    _multi_agent = True

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self._start_recording()


# -- reading -------------------------------------------------------------------------------------


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


def _input_paths(config: Any) -> list:
    """config.input_ as a list of paths (RLlib takes one or a list)."""
    paths = config.input_ if isinstance(config.input_, (list, tuple)) else [config.input_]
    return [os.fspath(p) for p in paths]


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


class OfflineData(RLlibOfflineData, metaclass=_AcceptsRLlibSubclasses):
    """RLlib's OfflineData on our reading path (see the module docstring).

    Its attributes are RLlib's; ``data`` (the Ray dataset) is made when
    first asked for, which a local learner's reading never does.
    """

    _replaces = RLlibOfflineData

    def __init__(self, config: Any):
        patch.install()
        self.config = config
        self.is_multi_agent = config.is_multi_agent
        self.path = config.input_ if isinstance(config.input_, list) else Path(config.input_)
        self.data_read_method = config.input_read_method
        self.data_read_method_kwargs = dict(config.input_read_method_kwargs or {})
        self.data_read_batch_size = config.input_read_batch_size
        self.materialize_data = config.materialize_data
        self.materialize_mapped_data = config.materialize_mapped_data
        self.data_is_mapped = False
        self.filesystem = config.input_filesystem
        self.filesystem_kwargs = config.input_filesystem_kwargs
        self.filesystem_object = _filesystem(self.filesystem, self.filesystem_kwargs,
                                             "input_filesystem")
        if self.filesystem_object:
            self.data_read_method_kwargs["filesystem"] = self.filesystem_object
        # Our native format (a folder of episode tables) or RLlib's files.
        self.native_paths = _native_paths(_input_paths(config), self.filesystem_object)
        self._data: Any = None
        self.batch_iterators = None
        self.map_batches_kwargs = self.default_map_batches_kwargs | config.map_batches_kwargs
        self.iter_batches_kwargs = self.default_iter_batches_kwargs | config.iter_batches_kwargs
        self.returned_streaming_split = False
        self.prelearner_class = config.prelearner_class or OfflinePreLearner
        self.locality_hints = None
        self.learner_handles = None
        self.module_spec = None
        self._local: Optional[_LocalData] = None

    @property
    def data(self) -> Any:
        """The Ray dataset of the input (RLlib's ``input_read_method`` over
        its files; for a native dataset, its episode numbers), made on first
        use and materialized if ``materialize_data``."""
        if self._data is None:
            if self.native_paths is not None:
                count = len(_NativeEpisodes(self.native_paths))
                data = ray.data.range(count).rename_columns({"id": NATIVE_COLUMN})
            else:
                paths = _input_paths(self.config)
                data = getattr(ray.data, self.data_read_method)(
                    paths if len(paths) > 1 else paths[0], **self.data_read_method_kwargs)
            self._data = data.materialize() if self.materialize_data else data
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = value

    def sample(self, num_samples: int, return_iterator: bool = False, num_shards: int = 1,
               module_state: Optional[Dict[str, Any]] = None) -> Any:
        """RLlib's sample(): a MultiAgentBatch of `num_samples` rows, or (with
        `return_iterator`) a list of iterators over such batches. With a
        local learner (`num_shards` 0) read in this process; otherwise
        through Ray Data as RLlib does."""
        if num_shards >= 1:
            return super().sample(num_samples, return_iterator=return_iterator,
                                  num_shards=num_shards, module_state=module_state)
        if self._local is None:
            if not module_state:
                module_state = self.learner_handles[0].get_state(
                    component=COMPONENT_RL_MODULE)[COMPONENT_RL_MODULE]
            self._local = _LocalData(self, num_samples, module_state)
        if return_iterator:
            return [self._local.iterator]
        return self._local.next_batch(num_samples)


class _LocalData:
    """A local learner's reading, in this process: the input in batches of
    rows as Ray Data's map_batches hands them to the prelearner (kept after
    a first pass with ``materialize_data``), each mapped by one prelearner
    made here for the whole run (Ray Data makes new ones each time its map
    runs again: RLlib's connectors take a tenth of a second to make; the
    mapped batches kept after a first pass with ``materialize_mapped_data``),
    the mapped rows handed out in batches as Ray Data's iter_batches does (``local_shuffle_buffer_size``,
    ``local_shuffle_seed`` and ``drop_last`` of ``iter_batches_kwargs``
    honoured; the rest is about Ray Data's prefetching)."""

    def __init__(self, owner: OfflineData, num_samples: int, module_state: Any):
        self.owner = owner
        self.read_batch_size = owner.data_read_batch_size or num_samples
        self.prelearner_kwargs = {
            "config": owner.config,
            "spaces": owner.spaces[INPUT_ENV_SPACES],
            "module_spec": owner.module_spec,
            "module_state": module_state,
        }
        self.prelearner: Any = None
        self.raw_kept: Optional[list] = None
        self.mapped_kept: Optional[list] = None
        self.running: Optional[Iterator] = None
        self.iterator = _LocalIterator(self)

    # -- the input's rows ------------------------------------------------------------------

    def _raw(self) -> Iterator[Any]:
        """One pass over the input in batches of rows."""
        if self.raw_kept is not None:
            yield from self.raw_kept
            return
        keep: Optional[list] = [] if self.owner.materialize_data else None
        for raw in self._read():
            if keep is not None:
                keep.append(raw)
            yield raw
        if keep is not None:
            self.raw_kept = keep

    def _read(self) -> Iterator[Any]:
        owner, size = self.owner, self.read_batch_size
        if owner.native_paths is not None:
            count = len(_NativeEpisodes(owner.native_paths))
            for start in range(0, count, size):
                yield {NATIVE_COLUMN: np.arange(start, min(start + size, count))}
            return
        kwargs = owner.data_read_method_kwargs
        if owner.data_read_method != "read_parquet" or set(kwargs) - _LOCAL_READ_KWARGS:
            # A read only Ray Data has: its rows, mapped here.
            yield from owner.data.iter_batches(batch_size=size, batch_format="numpy")
            return
        yield from _parquet_batches(_input_paths(owner.config), owner.filesystem_object,
                                    kwargs.get("columns"), size)

    # -- mapped --------------------------------------------------------------------------

    def _mapped(self) -> Iterator[dict]:
        """One pass over the mapped batches (flat dicts of numpy arrays)."""
        if self.mapped_kept is not None:
            yield from self.mapped_kept
            return
        keep: Optional[list] = [] if self.owner.materialize_mapped_data else None
        if self.prelearner is None:
            self.prelearner = self.owner.prelearner_class(**self.prelearner_kwargs)
        for raw in self._raw():
            mapped = {k: _numpy(v) for k, v in self.prelearner(raw).items()}
            if not mapped:
                continue
            if keep is not None:
                keep.append(mapped)
            yield mapped
        if keep is not None:
            self.mapped_kept = keep

    def batches(self, batch_size: int, *, local_shuffle_buffer_size: Optional[int] = None,
                local_shuffle_seed: Optional[int] = None, drop_last: bool = False,
                **ignored: Any) -> Iterator[dict]:
        """One pass over the mapped rows in batches of `batch_size` rows."""
        rng = np.random.default_rng(local_shuffle_seed) if local_shuffle_buffer_size else None
        need = max(batch_size, local_shuffle_buffer_size or 0)
        pending: list = []
        count = 0
        for mapped in self._mapped():
            n = _equal_rows(mapped)
            if n is None or (pending and mapped.keys() != pending[0].keys()):
                # Columns of different lengths (or other columns than the
                # rows before): handed on as they are.
                if pending:
                    yield _concat(pending)
                    pending, count = [], 0
                if n is None:
                    yield mapped
                    continue
            if not pending and n == batch_size and rng is None:
                yield mapped
                continue
            pending.append(mapped)
            count += n
            while count >= need:
                batch, pending, count = _split_off(pending, count, batch_size, rng)
                yield batch
        while count and (count >= batch_size or not drop_last):
            batch, pending, count = _split_off(pending, count, min(batch_size, count), rng)
            yield batch

    def next_batch(self, num_samples: int) -> Any:
        """The next batch of `num_samples` rows as a MultiAgentBatch (a new
        pass when one ends)."""
        for _ in range(2):
            if self.running is None:
                self.running = self.batches(num_samples, **self.owner.iter_batches_kwargs)
            for flat in self.running:
                return _collate(flat)
            self.running = None
        raise ValueError(f"config.input_={self.owner.config.input_!r}: no rows to train on")


class _LocalIterator:
    """What a learner iterates over when the algorithm hands it an iterator
    (RLlib hands a Ray DataIterator): `iter_torch_batches` and
    `iter_batches` give iterables that make a new pass over the local data
    each time they are iterated."""

    def __init__(self, local: _LocalData):
        self.local = local

    def iter_batches(self, *, batch_size: int = 256, **kwargs: Any) -> "_Passes":
        """Batches of `batch_size` rows (flat dicts of numpy arrays)."""
        return _Passes(self.local, batch_size, kwargs, None)

    def iter_torch_batches(self, *, batch_size: int = 256, device: Any = "cpu",
                           **kwargs: Any) -> "_Passes":
        """Batches of `batch_size` rows (flat dicts of torch tensors on `device`)."""
        return _Passes(self.local, batch_size, kwargs, device or "cpu")


class _Passes:
    def __init__(self, local: _LocalData, batch_size: int, kwargs: dict, device: Any):
        self.local, self.batch_size, self.kwargs, self.device = local, batch_size, kwargs, device

    def __iter__(self) -> Iterator[dict]:
        import torch

        for flat in self.local.batches(self.batch_size, **self.kwargs):
            if self.device is None:
                yield flat
            else:
                yield {k: torch.as_tensor(v, device=self.device) for k, v in flat.items()}


def _numpy(value: Any) -> np.ndarray:
    # A prelearner's column (torch tensors from its NumpyToTensor) as Ray
    # Data keeps it.
    if isinstance(value, np.ndarray):
        return value
    detach = getattr(value, "detach", None)
    if detach is not None:
        return detach().cpu().numpy()
    return np.asarray(value)


def _equal_rows(flat: dict) -> Optional[int]:
    lengths = {len(v) for v in flat.values()}
    return lengths.pop() if len(lengths) == 1 else None


def _concat(parts: list) -> dict:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _split_off(parts: list, count: int, n: int, rng: Any) -> tuple:
    """(n rows of the pending parts: the first, or drawn at random with
    `rng`; the other rows as the pending parts; their count)."""
    merged = _concat(parts)
    if rng is None:
        batch = {k: v[:n] for k, v in merged.items()}
        rest = {k: v[n:] for k, v in merged.items()}
    else:
        chosen = np.zeros(count, dtype=bool)
        chosen[rng.choice(count, n, replace=False)] = True
        batch = {k: v[chosen] for k, v in merged.items()}
        rest = {k: v[~chosen] for k, v in merged.items()}
    left = count - n
    return batch, ([rest] if left else []), left


def _collate(flat: dict) -> Any:
    """RLlib's collation of a flat batch (``"<module>/<column>"`` keys)
    into a MultiAgentBatch."""
    nested = unflatten_dict(flat)
    return MultiAgentBatch(
        {module_id: SampleBatch(data) for module_id, data in nested.items()},
        env_steps=sum(len(next(iter(data.values()))) for data in nested.values()))


def _parquet_batches(paths: list, filesystem: Any, columns: Any, size: int) -> Iterator[dict]:
    """The rows of the Parquet files under `paths`, in batches of `size`
    (the last one shorter), as Ray Data's numpy batches."""
    from episode.offline import rllib_format
    from episode.offline.format import DatasetError

    pending: list = []
    count = 0
    for fs, path in _input_files(paths, filesystem, ".parquet"):
        try:
            with fs.open_input_file(path) as source:
                reader = pq.ParquetFile(source)
                for record_batch in reader.iter_batches(batch_size=size, columns=columns):
                    pending.append(pa.Table.from_batches([record_batch]))
                    count += record_batch.num_rows
                    while count >= size:
                        table = pa.concat_tables(pending, promote_options="default")
                        pending, count = [table.slice(size)], count - size
                        yield rllib_format.to_numpy_batch(table.slice(0, size))
        except (OSError, pa.ArrowException) as error:
            raise DatasetError(f"{path}: not a readable parquet file ({error})") from None
    if count:
        yield rllib_format.to_numpy_batch(pa.concat_tables(pending, promote_options="default"))
