"""`OfflineData`: RLlib's reading of ``input_=``, for RLlib's two recorded
formats and our native one (told apart by their files), each batch of rows
mapped by the prelearner (`episode.rllib.offline.prelearner`). With a local
learner (``num_learners=0``) the data is read and mapped in this process,
the prelearner called on each batch of rows as Ray Data would call it,
without Ray Data's actors; with remote learners it goes through Ray Data
(``map_batches`` with the prelearner, ``streaming_split``) as RLlib's does.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import numpy as np

from episode._extras import rllib_missing

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.env import INPUT_ENV_SPACES
    from ray.rllib.offline.offline_data import OfflineData as RLlibOfflineData
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils import unflatten_dict
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.offline") from e

from episode.rllib import patch
from episode.rllib.offline.files import (NATIVE_COLUMN, _filesystem, _input_files,
                                         _input_paths, _native_paths, _NativeEpisodes)
from episode.rllib.offline.prelearner import _AcceptsRLlibSubclasses, OfflinePreLearner

__all__ = ["OfflineData"]


# Keyword arguments of Ray Data's read_parquet that a read in this process
# honours (with any other, Ray Data reads).
_LOCAL_READ_KWARGS = frozenset(("filesystem", "columns"))


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
