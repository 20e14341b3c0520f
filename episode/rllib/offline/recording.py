"""Recording with ``output=``: `OfflineSingleAgentEnvRunner` (and
`OfflineMultiAgentEnvRunner`, which RLlib lacks): RLlib's recording runner
on our `SingleAgentEnvRunner` (`MultiAgentEnvRunner`). What `sample()`
returns is written with pyarrow, each file aside and then renamed into
place: in RLlib's episode format (``output_write_episodes=True``, its
default: packed episode states in a binary column ``item``), its row format
(one row per step; the infos in each file's schema metadata, where RLlib's
reader does not look), or our native format with
``output_write_method="write_episodes"``. Every sample() writes only what is
new; with ``output_max_rows_per_file`` every full file is written; under
``batch_mode="complete_episodes"`` only done episodes are (a chunk that a
``sample(num_timesteps=...)`` call cut waits for the rest of its episode). A
write method only Ray Data has (``write_json``, ...) goes through Ray Data,
as RLlib writes everything.
"""
from __future__ import annotations

import copy
import logging
import os
import secrets
from typing import Any, List, Optional

from episode._extras import rllib_missing

try:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.offline") from e

from episode.rllib.offline.files import _filesystem, _is_local, _resolve
from episode.rllib.runners import MultiAgentEnvRunner, SingleAgentEnvRunner

logger = logging.getLogger(__name__)

__all__ = ["NATIVE_WRITE_METHOD", "OfflineMultiAgentEnvRunner", "OfflineSingleAgentEnvRunner"]


#: The ``output_write_method`` that records in our native format
#: (`episode.offline.EpisodeWriter`; ``output_write_method_kwargs`` are its
#: keyword arguments: ``format``, ``compression``).
NATIVE_WRITE_METHOD = "write_episodes"

# Keyword arguments of Ray Data's write_parquet that pyarrow's writer takes
# here (Ray passes the rest on to pyarrow.parquet.write_table, as we do).
_RAY_ONLY_WRITE_KWARGS = frozenset((
    "arrow_parquet_args_fn", "min_rows_per_file", "num_rows_per_file", "ray_remote_args",
    "concurrency", "partition_cols", "filename_provider", "mode", "block_path_provider"))
_WRITE_KWARGS_IGNORED = frozenset(("filesystem", "try_create_dir"))


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
