"""Writing episodes into a dataset in the native format (see `format`)."""
from __future__ import annotations

import os
import re
import secrets
import socket
import time
from typing import Any, Iterable, Optional

import numpy as np

from episode._column import KINDS
from episode._dataset import GroupRows, signature
from episode.offline import format as fmt

__all__ = ["EpisodeWriter", "write_episodes"]

_COMPRESSIONS = (None, "none", "snappy", "gzip", "brotli", "lz4", "zstd")


class EpisodeWriter:
    """Writes episodes into the dataset folder `path` (made if missing).

    ``format`` is ``"parquet"`` or ``"arrow"`` (Arrow IPC files, which
    `read_episodes` memory-maps: their arrays are read in place);
    ``compression`` a Parquet codec (``"zstd"``, ``"snappy"``, ``"lz4"``,
    ``"gzip"``, ``"brotli"``, None) or, for Arrow files, None (the default
    there, so that reads need no copy), ``"lz4"`` or ``"zstd"``. Episodes
    are kept until ``rows_per_file`` rows wait (then a part of the dataset
    is written: its step files, then its episode table), and at `flush()`
    and `close()`. Each file is written aside and renamed into place, so a
    writer killed mid-write leaves every earlier part whole and no partial
    file; several writers (processes, Ray actors) can write one folder, each
    under names of its own.

    Use it as a context manager (closed at the end of the block, also when
    the block raises: the episodes handed to `write` are kept)::

        with EpisodeWriter("data/cartpole") as writer:
            writer.write(episodes)
    """

    def __init__(self, path: Any, *, format: str = "parquet", compression: Any = "default",
                 rows_per_file: int = 1 << 20):
        if format not in fmt.EXTENSIONS:
            raise ValueError(f"format must be 'parquet' or 'arrow', not {format!r}")
        if compression == "default":
            compression = "zstd" if format == "parquet" else None
        if compression not in _COMPRESSIONS or (format == "arrow" and compression not in
                                                (None, "none", "lz4", "zstd")):
            raise ValueError(f"no {compression!r} compression for {format} files")
        if isinstance(rows_per_file, bool) or not isinstance(rows_per_file, (int, np.integer)) \
                or rows_per_file < 1:
            raise ValueError(f"rows_per_file must be a positive int, not {rows_per_file!r}")
        _pyarrow()
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.format = format
        self.compression = None if compression == "none" else compression
        self.rows_per_file = int(rows_per_file)
        host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40]
        self._name = f"{time.strftime('%Y%m%dT%H%M%S')}-{host}-{os.getpid()}-" \
                     f"{secrets.token_hex(3)}"
        self._parts = 0
        self._groups: dict = {}
        self._table: list = []
        self._rows = 0
        self.closed = False
        self.files: list = []

    # -- writing -------------------------------------------------------------------

    def write(self, episodes: Iterable[Any]) -> None:
        """Adds `episodes` (Single- or MultiAgentEpisodes, ours or RLlib's;
        one or a list) to the dataset. A bad episode raises (ValueError,
        TypeError or AssertionError) and leaves the writer as it was before
        it: the episodes before it in the list are kept."""
        if self.closed:
            raise ValueError("write() on a closed EpisodeWriter")
        from episode.replay.stored import _as_ours, _as_ours_multi, _force_list

        for episode in _force_list(episodes):
            kept = (len(self._table), {g: g.rows.nrows for g in self._groups.values()},
                    self._rows)
            try:
                if hasattr(episode, "agent_episodes"):
                    self._add_multi(_as_ours_multi(episode))
                else:
                    self._add(_as_ours(episode))
            except BaseException:
                self._rollback(*kept)
                raise
            if self._rows >= self.rows_per_file:
                self.flush()

    def _rollback(self, entries: int, groups: dict, rows: int) -> None:
        # Back to before an episode that failed part-way (a multi-agent one
        # whose third agent has an item no file can hold).
        del self._table[entries:]
        self._groups = {sig: g for sig, g in self._groups.items() if g in groups}
        for group, nrows in groups.items():
            group.rows.truncate(nrows)
        self._rows = rows

    def _add_multi(self, episode) -> None:
        episode.validate()
        state = fmt.multi_state(episode)
        parent = len(self._table)
        entry = _Entry(None, 0, 0, len(episode), (0,) * 5, episode.env_t_started,
                       bool(episode.is_terminated), bool(episode.is_truncated),
                       (fmt.pack_value(episode.id_),) + (None,) * 5, (None, None),
                       episode._start_time, episode._last_step_time)
        entry.multi_state = state
        self._table.append(entry)
        for agent_episode in episode.agent_episodes.values():
            self._add(agent_episode, parent)

    def _add(self, episode, parent: int = -1) -> None:
        episode.validate()
        sig = signature(episode)
        group = self._groups.get(sig)
        if group is None:
            group = self._groups[sig] = _Group(sig)
        lookbacks = (episode.observations.lookback, episode.infos.lookback,
                     episode.actions.lookback, episode.rewards.lookback,
                     _extras_lookback(episode))
        last = max(lookbacks)
        rows = last + len(episode) + 1 if episode.observations.len_incl_lookback() else 0
        # Everything that can refuse the episode runs before its rows are kept.
        packed = tuple(None if v is None else fmt.pack_value(v) for v in (
            episode.id_, episode.agent_id, episode.module_id, episode.multi_agent_episode_id,
            episode.custom_data or None, _details(episode)))
        spaces = (fmt.space_text(episode.observation_space),
                  fmt.space_text(episode.action_space))
        first = group.rows.add(episode, rows, last, fmt.pack_value)
        self._table.append(_Entry(group, first, rows, len(episode), lookbacks,
                                  episode.t_started, bool(episode.is_terminated),
                                  bool(episode.is_truncated), packed, spaces,
                                  episode._start_time, episode._last_step_time))
        self._table[-1].parent = parent
        self._rows += rows

    def flush(self) -> None:
        """Writes the episodes kept so far as one part of the dataset: its
        step files, then its episode table (which makes the part exist)."""
        if not self._table:
            return
        part = f"{self._name}-{self._parts:06d}"
        names = []
        for number, group in enumerate(self._groups.values()):
            name = f"{part}.steps-{number}.{self.format}"
            group.number = number
            self._write_file(name, group.table([e for e in self._table if e.group is group]))
            names.append(name)
        self._write_file(f"{part}.episodes.{self.format}", self._episode_table(names))
        self._parts += 1
        self._groups = {}
        self._table = []
        self._rows = 0

    def close(self) -> None:
        """Writes what is kept and closes the writer (closing twice is fine)."""
        if not self.closed:
            self.flush()
            self.closed = True

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- files ---------------------------------------------------------------------

    def _episode_table(self, step_files: list):
        pa = _pyarrow()
        table = self._table

        def numbers(values, dtype):
            return pa.array(np.array(values, dtype))

        def times(values):
            return numbers([np.nan if t is None else t for t in values], np.float64)

        packed = list(zip(*[e.packed for e in table]))
        lookbacks = np.array([e.lookbacks for e in table], np.int32).reshape(len(table), 5)
        columns = {
            "kind": numbers([SINGLE if e.multi_state is None else MULTI for e in table],
                            np.int8),
            "parent": numbers([e.parent for e in table], np.int64),
            "group": numbers([-1 if e.group is None else e.group.number for e in table],
                             np.int32),
            "row": numbers([e.first for e in table], np.int64),
            "rows": numbers([e.rows for e in table], np.int64),
            "length": numbers([e.length for e in table], np.int64),
            "t_started": numbers([e.t_started for e in table], np.int64),
            "terminated": numbers([e.terminated for e in table], np.bool_),
            "truncated": numbers([e.truncated for e in table], np.bool_),
            "return": numbers([e.episode_return for e in table], np.float64),
            "start_time": times([e.start_time for e in table]),
            "last_step_time": times([e.last_step_time for e in table]),
            "observation_space": pa.array([e.spaces[0] for e in table],
                                          pa.string()).dictionary_encode(),
            "action_space": pa.array([e.spaces[1] for e in table],
                                     pa.string()).dictionary_encode(),
        }
        for name, values in zip(IDS, packed):
            columns[name] = pa.array(values, pa.binary())
        columns["multi_state"] = pa.array([e.multi_state for e in table], pa.binary())
        for i, name in enumerate(LOOKBACKS):
            columns[name] = pa.array(lookbacks[:, i])
        schema = pa.schema([pa.field(k, v.type) for k, v in columns.items()],
                           metadata=fmt.metadata("episodes", step_files=step_files))
        return pa.Table.from_arrays(list(columns.values()), schema=schema)

    def _write_file(self, name: str, table) -> None:
        pa = _pyarrow()
        final = os.path.join(self.path, name)
        temp = os.path.join(self.path, f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            if self.format == "parquet":
                import pyarrow.parquet as pq

                pq.write_table(table, temp, compression=self.compression or "none",
                               row_group_size=max(1, table.num_rows))
            else:
                options = pa.ipc.IpcWriteOptions(compression=self.compression)
                with pa.OSFile(temp, "wb") as sink:
                    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
                        writer.write_table(table, max_chunksize=max(1, table.num_rows))
            with open(temp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(temp, final)
        finally:
            if os.path.exists(temp):
                os.remove(temp)
        self.files.append(final)


# The episode table's lookback columns, in make_episode's order, and its
# columns of packed values, in _Entry.packed's.
LOOKBACKS = ("lookback_obs", "lookback_infos", "lookback_actions", "lookback_rewards",
             "lookback_extras")
IDS = ("id", "agent_id", "module_id", "multi_agent_episode_id", "custom_data", "details")


# The episode table's kinds of rows: a single-agent episode (an agent's of a
# multi-agent one when its parent is not -1), a multi-agent episode.
SINGLE, MULTI = 0, 1


class _Entry:
    """An episode waiting in a writer: its row of the episode table."""

    __slots__ = ("group", "first", "rows", "length", "lookbacks", "t_started", "terminated",
                 "truncated", "packed", "spaces", "start_time", "last_step_time",
                 "episode_return", "parent", "multi_state")

    def __init__(self, group, first, rows, length, lookbacks, t_started, terminated,
                 truncated, packed, spaces, start_time, last_step_time):
        self.group, self.first, self.rows, self.length = group, first, rows, length
        self.lookbacks, self.t_started = lookbacks, t_started
        self.terminated, self.truncated = terminated, truncated
        self.packed, self.spaces = packed, spaces
        self.start_time, self.last_step_time = start_time, last_step_time
        self.episode_return = np.nan
        self.parent = -1
        self.multi_state = None


def _details(episode) -> Optional[dict]:
    """What the episode table keeps of an episode only where it is not the
    usual: its last added observation and infos where they are not its last
    rows (add_env_step leaves them so; a made or restored episode has none),
    and the spaces of its buffers that are not its own (slice() drops the
    rewards' space; a user may set any), track -> the space's text. None
    when all is as usual."""
    from episode._episode import REWARDS_SPACE, last_added

    details: dict = {}
    added = last_added(episode)
    if added is not True:
        details["last_added"] = added
    usual = (("observations", episode.observation_space), ("actions", episode.action_space),
             ("rewards", REWARDS_SPACE), ("infos", None))
    spaces = {}
    for name, space in usual:
        have = getattr(episode, name).space
        if have is not space and not (type(have) is type(space) and have == space):
            spaces[name] = fmt.space_text(have)
    for key, buf in episode.extra_model_outputs.items():
        if buf.space is not None:
            spaces[("extra_model_outputs", key)] = fmt.space_text(buf.space)
    if spaces:
        details["spaces"] = spaces
    return details or None


def _extras_lookback(episode) -> int:
    # One lookback for all extra outputs (they are cut and sliced together).
    lookbacks = {b.lookback for b in episode.extra_model_outputs.values()}
    if len(lookbacks) > 1:
        raise ValueError(f"the extra model outputs have different lookbacks {sorted(lookbacks)}")
    return lookbacks.pop() if lookbacks else episode.actions.lookback


class _Group:
    """The episodes of one signature waiting in a writer: their rows, and
    the step file made of them."""

    def __init__(self, sig):
        self.signature = sig
        self.trees = [_tree(s) for s in sig[:3]] + [_tree(s) for _, s in sig[3]]
        self.names = list(fmt.TRACKS) + [_extra_column(k, i) for i, (k, _) in enumerate(sig[3])]
        leaves = [leaf for tree in self.trees for leaf in fmt.tree_leaves(tree)]
        self.rows = GroupRows(sig, [leaf["codec"] for leaf in leaves],
                              [fmt.leaf_dtype(leaf) for leaf in leaves],
                              [tuple(leaf["shape"]) for leaf in leaves])
        self.number = -1

    def table(self, entries: list):
        """The step file's table (and each entry's return, set on it)."""
        pa = _pyarrow()
        n = self.rows.nrows
        arrays = iter([rows if rows is None or isinstance(rows, list) else rows.array()
                       for rows in self.rows.leaves])
        columns = {name: self._column(tree, arrays, n)
                   for name, tree in zip(self.names, self.trees)}
        self._set_returns(columns["rewards"], entries)
        columns[fmt.INFOS] = pa.array(self.rows.infos, pa.binary())
        terminateds, truncateds = np.zeros(n, np.bool_), np.zeros(n, np.bool_)
        for e in entries:
            if e.length:
                last_step = e.first + max(e.lookbacks) + e.length - 1
                terminateds[last_step], truncateds[last_step] = e.terminated, e.truncated
        columns[fmt.TERMINATEDS] = pa.array(terminateds)
        columns[fmt.TRUNCATEDS] = pa.array(truncateds)
        meta = {
            "tracks": [{"column": name, "tree": fmt.tree_to_json(tree)}
                       for name, tree in zip(self.names[:3], self.trees[:3])],
            "extras": [{"column": name, "key": fmt.key_to_json(key),
                        "tree": fmt.tree_to_json(tree)}
                       for name, (key, _), tree in zip(self.names[3:], self.signature[3],
                                                       self.trees[3:])],
            "extras_defaultdict": bool(self.signature[4]),
        }
        schema = pa.schema([pa.field(k, v.type) for k, v in columns.items()],
                           metadata=fmt.metadata("steps", **meta))
        return pa.Table.from_arrays(list(columns.values()), schema=schema)

    def _column(self, tree, arrays, n: int):
        pa = _pyarrow()
        if isinstance(tree, dict):
            return fmt.leaf_array(tree, next(arrays), n)
        if tree[0] == "tuple":
            names, subs = [str(i) for i in range(len(tree[1]))], tree[1]
        else:
            names, subs = _field_names([k for k, _ in tree[1]]), [v for _, v in tree[1]]
        if not subs:
            return pa.nulls(n)      # an empty dict or tuple (Parquet has no empty struct)
        children = [self._column(sub, arrays, n) for sub in subs]
        return pa.StructArray.from_arrays(children, names=names)

    def _set_returns(self, rewards, entries: list) -> None:
        # Each episode's return (its rewards after the lookback, summed) for
        # the episode table, where the rewards are plain numbers (else NaN).
        tree = self.trees[2]
        if not (isinstance(tree, dict) and tree["codec"] == fmt.ARROW and not tree["shape"]):
            return
        values = rewards.to_numpy(zero_copy_only=False)
        for e in entries:
            start = e.first + max(e.lookbacks)
            e.episode_return = float(np.sum(values[start:start + e.length], dtype=np.float64))


def _field_names(keys: list) -> list:
    names = [str(k) for k in keys]
    # Struct fields need names of their own; the real keys are in the metadata.
    return names if len(set(names)) == len(names) else [f"f{i}" for i in range(len(keys))]


def _extra_column(key: Any, i: int) -> str:
    if isinstance(key, str) and key not in fmt.RESERVED and not key.startswith("__extra"):
        return key
    return f"__extra{i}"


def _tree(sig):
    # A track's signature as the format's tree of leaf dicts.
    if sig and sig[0] == "dict":
        return ("dict", tuple((k, _tree(v)) for k, v in sig[1]))
    if sig and sig[0] == "tuple":
        return ("tuple", tuple(_tree(v) for v in sig[1]))
    kind, finalized, open_, dtype, shape = sig
    codec = fmt.VALUE if kind == KINDS["object"] else fmt.leaf_codec(dtype, shape)
    if kind == KINDS["empty_dict"]:
        codec = fmt.NONE
    return {"kind": kind, "finalized": finalized, "open": open_,
            "dtype": fmt.dtype_text(dtype) if codec in fmt.STORED else None,
            "shape": list(shape) if codec in fmt.STORED else [],
            "codec": codec}


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            'episode.offline needs pyarrow: pip install "episode[offline]"') from error
    return pyarrow


def write_episodes(episodes: Iterable[Any], path: Any, **kwargs: Any) -> list:
    """Writes `episodes` into the dataset folder `path` in one call (the
    keyword arguments are EpisodeWriter's); returns the files written."""
    with EpisodeWriter(path, **kwargs) as writer:
        writer.write(episodes)
    return writer.files
