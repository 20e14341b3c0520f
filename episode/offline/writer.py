"""Writing episodes into a dataset in the native format (see `format`)."""
from __future__ import annotations

import collections.abc
import json
import math
import os
import re
import secrets
import socket
import sys
import threading
import time
import zlib
from typing import Any, Iterable, Optional

import numpy as np

from episode._column import KINDS
from episode._dataset import SINGLE, GroupRows, Recording
from episode._episode import EpisodeCore
from episode.offline import format as fmt

__all__ = ["EpisodeWriter", "write_episodes"]

_COMPRESSIONS = (None, "none", "snappy", "gzip", "brotli", "lz4", "zstd")


class EpisodeWriter:
    """Writes episodes into the dataset folder `path` (made if missing).

    ``format`` is ``"arrow"`` (Arrow IPC files, the default) or
    ``"parquet"``; ``compression`` for Arrow files ``"lz4"`` (the default:
    of every format and codec measured, the fastest to write and to read,
    on image and on vector data; see the benchmarks page), ``"zstd"`` or
    None (uncompressed files, which `read_episodes` memory-maps: their
    arrays are read in place), for Parquet a Parquet codec (``"zstd"``, the
    default there, ``"snappy"``, ``"lz4"``, ``"gzip"``, ``"brotli"``, None). Episodes
    are kept until ``rows_per_file`` rows or ``bytes_per_file`` bytes of
    fixed-size rows (256 MiB: what a reader holds of a file once it is
    decoded) wait (then a part of the dataset is written: its step files,
    then its episode table), and at `flush()`
    and `close()`. Each file is written aside and renamed into place, so a
    writer killed mid-write leaves every earlier part whole and no partial
    file; several writers (processes, Ray actors) can write one folder, each
    under names of its own.

    A part is also written once the first episode waiting in memory has
    waited ``seconds_per_file`` seconds (checked at each `write`; None: by
    rows only): a writer killed without warning (kill -9, a lost machine)
    loses at most about that many seconds of episodes, at the price of more,
    smaller parts (more files to open when reading).

    A writer closed without any episode leaves an empty part (the folder is
    then a dataset of no episodes). Episodes whose observation or action
    spaces differ from those of the dataset already in the folder, for the
    same agent (another environment, most likely), are refused with
    ValueError unless ``mixed_spaces=True``; an episode without spaces
    matches any, and so does an agent the dataset does not have yet.

    Use it as a context manager (closed at the end of the block, also when
    the block raises: the episodes handed to `write` are kept)::

        with EpisodeWriter("data/cartpole") as writer:
            writer.write(episodes)
    """

    def __init__(self, path: Any, *, format: str = "arrow", compression: Any = "default",
                 rows_per_file: int = 1 << 20, seconds_per_file: Optional[float] = 5.0,
                 mixed_spaces: bool = False, bytes_per_file: int = 1 << 28):
        if format not in fmt.EXTENSIONS:
            raise ValueError(f"format must be 'parquet' or 'arrow', not {format!r}")
        if compression == "default":
            compression = "zstd" if format == "parquet" else "lz4"
        if compression not in _COMPRESSIONS or (format == "arrow" and compression not in
                                                (None, "none", "lz4", "zstd")):
            raise ValueError(f"no {compression!r} compression for {format} files")
        for name, value in (("rows_per_file", rows_per_file), ("bytes_per_file", bytes_per_file)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if seconds_per_file is not None and (
                isinstance(seconds_per_file, bool) or not isinstance(seconds_per_file, (int, float))
                or not seconds_per_file > 0):
            raise ValueError(f"seconds_per_file must be a positive number or None, not "
                             f"{seconds_per_file!r}")
        _pyarrow()
        self.path = os.fspath(path)
        # The spaces of the dataset there, per agent (read before the folder is made).
        self.mixed_spaces = bool(mixed_spaces)
        self._spaces = {} if self.mixed_spaces else _spaces_in(self.path)
        os.makedirs(self.path, exist_ok=True)
        self.format = format
        self.compression = None if compression == "none" else compression
        self.rows_per_file = int(rows_per_file)
        self.bytes_per_file = int(bytes_per_file)
        self.seconds_per_file = None if seconds_per_file is None else float(seconds_per_file)
        self._waiting_since: Optional[float] = None   # when the first kept episode came
        host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40]
        # Parts sort by when their writer started (to the nanosecond), then
        # by their number: that is the dataset's stored order.
        now = time.time_ns()
        self._name = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now // 10 ** 9))}." \
                     f"{now % 10 ** 9:09d}-{host}-{os.getpid()}-{secrets.token_hex(3)}"
        self._parts = 0
        self._ends: dict = {}
        self._recording = self._new_recording()
        self._writing: list = []        # parts written in the background: (job, recording, name)
        self._failed: list = []         # parts whose write failed, to write again: (recording, name)
        self._spare: Optional[Recording] = None    # the last part written: its groups, reused
        self.closed = False
        self.files: list = []

    def _new_recording(self, last: Optional[Recording] = None) -> Recording:
        # `last`: the part just written, whose groups the new one reuses.
        return Recording(_new_group, fmt.pack_value, _details, fmt.space_text, self._ends,
                         last)

    # -- writing -------------------------------------------------------------------

    def write(self, episodes: Iterable[Any]) -> None:
        """Adds `episodes` (Single- or MultiAgentEpisodes, ours or RLlib's;
        one or a list) to the dataset. A bad episode raises (ValueError,
        TypeError or AssertionError) and leaves the writer as it was before
        it: the episodes before it in the list are kept."""
        if self.closed:
            raise ValueError("write() on a closed EpisodeWriter")
        try:
            self._add(_episode_list(episodes, "EpisodeWriter.write()"))
        finally:
            # Image rows of the parts not written yet are views of the
            # episodes' storage (see Rows.refer), which may change once
            # they are back in the caller's hands.
            try:
                self._wait()
            finally:
                self._recording.own()

    def _add(self, episodes: list) -> None:
        from episode.replay.stored import _as_ours, _as_ours_multi

        i = 0
        while i < len(episodes):
            episode = episodes[i]
            recording = self._recording       # a new one after each flush
            if isinstance(episode, EpisodeCore) and not self._spaces:
                # A run of our single-agent episodes, added in one compiled
                # loop up to this part's limits.
                if self._waiting_since is None:
                    self._waiting_since = time.monotonic()
                deadline = math.inf if self.seconds_per_file is None \
                    else self._waiting_since + self.seconds_per_file
                i = recording.add_run(episodes, i, min(self.rows_per_file, sys.maxsize),
                                      min(self.bytes_per_file, sys.maxsize), deadline)
                self._flush_if_due(more=i < len(episodes))
                continue
            i += 1
            mark = recording.mark()
            try:
                if not isinstance(episode, EpisodeCore) and hasattr(episode, "agent_episodes"):
                    episode = _as_ours_multi(episode)
                    episode.validate()
                    self._check_episodes(episode.agent_episodes.values())
                    parent = recording.add_multi(episode, fmt.multi_state(episode))
                    for agent_episode in episode.agent_episodes.values():
                        recording.add(agent_episode, parent)
                else:
                    episode = _as_ours(episode)
                    self._check_episodes([episode])
                    recording.add(episode)
            except BaseException:
                recording.rollback(mark)
                raise
            if self._waiting_since is None:
                self._waiting_since = time.monotonic()
            self._flush_if_due(more=i < len(episodes))

    def _flush_if_due(self, more: bool) -> None:
        # A part is written once its rows, bytes or the time its first
        # episode has waited reach their limits: in the background if
        # `more` episodes of this call follow (write() waits for it before
        # it returns; the next part fills meanwhile, in other blocks), else
        # here (the next part then reuses its blocks).
        recording = self._recording
        if recording.steps >= self.rows_per_file or recording.nbytes >= self.bytes_per_file or (
                self.seconds_per_file is not None and self._waiting_since is not None
                and time.monotonic() - self._waiting_since >= self.seconds_per_file):
            self._write_part(background=more)

    def check_spaces(self, observation_space: Any, action_space: Any,
                     agent_id: Any = None) -> None:
        """Raises ValueError if episodes of these spaces (of agent
        `agent_id`; None: single-agent episodes) would be refused: spaces
        other than those in the dataset for that agent (see the class)."""
        self._check_pair(agent_id, (fmt.space_text(observation_space),
                                    fmt.space_text(action_space)))

    def _check_episodes(self, agent_episodes: Iterable[Any]) -> None:
        if self._spaces:
            for e in agent_episodes:
                self._check_pair(e.agent_id, (fmt.space_text(e.observation_space),
                                              fmt.space_text(e.action_space)))

    def _check_pair(self, agent_id: Any, pair: tuple) -> None:
        known = self._spaces.get(agent_id)
        if self.mixed_spaces or not known or any(_matches(pair, k) for k in known):
            return
        who = "" if agent_id is None else f" of agent {agent_id!r}"
        have = "; ".join(f"observations {_space_name(o)}, actions {_space_name(a)}"
                         for o, a in sorted(known, key=repr))
        raise ValueError(f"{self.path}: the dataset holds episodes{who} with {have}; these "
                         f"have observations {_space_name(pair[0])}, actions "
                         f"{_space_name(pair[1])} (another environment?). "
                         f"EpisodeWriter(..., mixed_spaces=True) writes them anyway")

    def flush(self) -> None:
        """Writes the episodes kept so far as one part of the dataset: its
        step files, then its episode table (which makes the part exist)."""
        if self._recording.n:
            self._write_part()
        else:
            self._wait()
            self._retry_failed()

    def _write_part(self, background: bool = False) -> None:
        """Writes the part kept so far (after any whose write failed) on a
        thread of its own, while the part before it may still be written
        (Arrow compresses each on a core of its own); with `background`,
        returns once the part before it is written (the next part fills
        meanwhile, in that part's blocks), else once both are."""
        self._retry_failed()
        recording = self._recording
        part = f"{self._name}-{self._parts:06d}"
        self._writing.append((InThread(self._part_files, recording, part, daemon=False),
                              recording, part))
        self._parts += 1
        try:
            self._wait(keep=1 if background else 0)
        finally:
            # The next part reuses the groups of the last part written.
            last, self._spare = self._spare, None
            self._recording = self._new_recording(last)
            self._waiting_since = None

    def _wait(self, keep: int = 0) -> None:
        """Waits for the parts being written, oldest first, until `keep` are
        left: their files are then the dataset's. A part whose write failed
        is kept (written again before the next part) and its error raised."""
        while len(self._writing) > keep:
            job, recording, part = self._writing[0]
            job.thread.join()       # (interrupted: the part is still being written)
            self._writing.pop(0)
            try:
                self.files.extend(job.result())
            except BaseException:
                recording.own()     # (the caller gets its episodes back)
                self._failed.append((recording, part))
                raise
            self._spare = recording

    def _retry_failed(self) -> None:
        while self._failed:
            recording, part = self._failed[0]
            self.files.extend(self._part_files(recording, part))
            self._failed.pop(0)

    def _part_files(self, recording: Recording, part: str) -> list:
        """Writes a part's files (`recording`'s episodes, under the name
        `part`): its step files, then its episode table; returns them."""
        names, sums, written = [], [], []       # written: (temp, final), renamed in order
        files = []
        try:
            for group in recording.groups.values():
                name = f"{part}.steps-{group.number}.{self.format}"
                sums.append(self._write_temp(name, _step_table(group), written))
                names.append(name)
            # The step files reach the disk while the episode table is made
            # and written; every file is renamed into place once all are
            # there, the episode table (which makes the part exist) last.
            syncing = InThread(_fsync_all, [temp for temp, _ in written])
            try:
                table = _episode_table(recording, names, sums)
                if self.format == "arrow":
                    table = _with_batches_crc(table, self._ipc_options(table))
                self._write_temp(f"{part}.episodes.{self.format}", table, written)
                _fsync(written[-1][0])
            finally:
                syncing.result()
            for temp, final in written:
                os.replace(temp, final)
                files.append(final)
        finally:
            for temp, _ in written:
                if os.path.exists(temp):
                    os.remove(temp)
        return files

    def close(self) -> None:
        """Writes what is kept and closes the writer (closing twice is fine).
        A writer that wrote nothing leaves an empty part: a dataset of no
        episodes."""
        if not self.closed:
            if self._recording.n or not self._parts:
                self._write_part()
            else:
                self.flush()
            self.closed = True

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- files ---------------------------------------------------------------------

    def _ipc_options(self, table):
        # Arrow compresses a table's buffers on its thread pool. Handing them
        # over costs about 0.3 ms, more than compressing a small table does:
        # an episode table of 2,855 rows takes 0.26 ms on one thread, 0.69 ms
        # on the pool; CartPole's step file of 100k rows (3.7 MB) 2.4 ms on
        # one thread, 1.9 ms on the pool.
        return _pyarrow().ipc.IpcWriteOptions(compression=self.compression,
                                              use_threads=table.nbytes >= 1 << 21)

    def _write_temp(self, name: str, table, written: list) -> list:
        """Writes `table` aside, under a temporary name, for the file `name`
        (appending (temp, final) to `written` first); returns its [size,
        CRC-32], summed as it is written."""
        pa = _pyarrow()
        temp = os.path.join(self.path, f".{name}.{secrets.token_hex(4)}.tmp")
        written.append((temp, os.path.join(self.path, name)))
        with open(temp, "wb", buffering=0) as raw:
            summed = _Summed(raw)
            with pa.PythonFile(summed, mode="w") as sink:
                if self.format == "parquet":
                    import pyarrow.parquet as pq

                    pq.write_table(table, sink, compression=self.compression or "none",
                                   row_group_size=max(1, table.num_rows), **fmt.PARQUET_WRITE)
                else:
                    _write_ipc(sink, table, self._ipc_options(table))
        return [summed.size, summed.crc]


class _Summed:
    """A binary file that sums (CRC-32) and counts the bytes written to it:
    a written file's checksum without reading it back."""

    def __init__(self, raw: Any):
        self.raw = raw
        self.size = 0
        self.crc = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        self.crc = zlib.crc32(view, self.crc)
        while view.nbytes:              # a raw file may write less than asked
            view = view[self.raw.write(view):]
        self.size += n
        return n

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def tell(self) -> int:
        return self.size

    def writable(self) -> bool:
        return True


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


class InThread:
    """`work(*args)` run on a thread of its own (for work that lets go of the
    GIL: fsync, Arrow inflating a file), while the caller does something
    else; result() waits for it and returns its value, or raises the error
    it met. `daemon`: whether a program may end while it runs."""

    def __init__(self, work: Any, *args: Any, daemon: bool = True):
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(work, args), daemon=daemon)
        self.thread.start()

    def _run(self, work: Any, args: tuple) -> None:
        try:
            self.value = work(*args)
        except BaseException as error:  # noqa: BLE001 - raised by result()
            self.error = error

    def result(self) -> Any:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


def _fsync_all(paths: list) -> None:
    for path in paths:
        _fsync(path)


def _write_ipc(sink, table, options) -> None:
    with _pyarrow().ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(1, table.num_rows))


def _with_batches_crc(table, options):
    """An Arrow episode table with the CRC-32 of its messages in its
    metadata (see format.arrow_batches_crc): written to memory first, which
    costs little for a table of a row per episode."""
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    _write_ipc(sink, table, options)
    meta = json.loads(table.schema.metadata[fmt.METADATA_KEY])
    meta["batches_crc32"] = fmt.arrow_batches_crc(sink.getvalue())
    return table.replace_schema_metadata(
        {fmt.METADATA_KEY: json.dumps(meta, separators=(",", ":")).encode()})


def _matches(pair: tuple, known: tuple) -> bool:
    # Spaces as text; None (no space) matches any.
    return all(a is None or b is None or a == b for a, b in zip(pair, known))


def _space_name(text: Optional[str]) -> str:
    return "none" if text is None else " ".join(str(fmt.space_of(text, "space")).split())


def _spaces_in(path: str) -> dict:
    """agent id (None: single-agent episodes) -> {(observation space, action
    space) as text} of the dataset of ours at `path` (empty where there is
    none): from its episode tables (what a reader checks besides their
    checksums: the reader checks those)."""
    tables = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        tables += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")
                   and n.rpartition(".")[0].endswith(".episodes")
                   and n.rpartition(".")[2] in fmt.EXTENSIONS]
    spaces: dict = {}
    for table_path in tables:
        table, _ = fmt.read_episode_table(table_path, verify=False)
        try:
            kinds = table.column("kind").to_numpy()
            parents = table.column("parent").to_numpy()
            texts = [table.column(name).cast(_pyarrow().string()).to_pylist()
                     for name in ("observation_space", "action_space")]
            agent_ids = table.column("agent_id")
        except (KeyError, ValueError, TypeError) as error:
            raise fmt.DatasetError(f"{table_path}: not an episode table ({error})") from None
        for i in (int(i) for i in np.flatnonzero(kinds == SINGLE)):
            blob = agent_ids[i].as_py() if parents[i] >= 0 else None
            try:
                agent_id = None if blob is None else fmt.unpack_value(blob)
            except ValueError as error:
                raise fmt.DatasetError(f"{table_path}: column 'agent_id', episode {i}: "
                                       f"{error}") from None
            spaces.setdefault(agent_id, set()).add((texts[0][i], texts[1][i]))
    return spaces


def _episode_list(episodes: Any, what: str) -> list:
    """`episodes` (one episode, or an iterable of them) as a list; TypeError
    for anything else."""
    def is_episode(e: Any) -> bool:
        return isinstance(e, EpisodeCore) or hasattr(e, "agent_episodes") or (
            hasattr(e, "get_state") and hasattr(e, "extra_model_outputs"))

    if is_episode(episodes):
        return [episodes]
    if isinstance(episodes, (str, bytes, dict)) or not isinstance(episodes,
                                                                  collections.abc.Iterable):
        raise TypeError(f"{what} takes episodes (a SingleAgentEpisode or MultiAgentEpisode, "
                        f"ours or RLlib's, or an iterable of them), not "
                        f"{type(episodes).__name__}")
    episodes = list(episodes)
    for e in episodes:
        if not is_episode(e):
            raise TypeError(f"{what} takes episodes (Single- or MultiAgentEpisodes, ours or "
                            f"RLlib's), not {type(e).__name__}")
    return episodes


def _details(episode) -> Optional[dict]:
    """What the episode table keeps of an episode only where it is not the
    usual: its done flags where they are not two Python or two numpy bools,
    its last added
    observation and infos where they are not its last
    rows (add_env_step leaves them so; a made or restored episode has none),
    and the spaces of its buffers that are not its own (slice() drops the
    rewards' space; a user may set any), track -> the space's text. None
    when all is as usual."""
    from episode._episode import REWARDS_SPACE, last_added

    details: dict = {}
    flags = (episode.is_terminated, episode.is_truncated)
    if not (all(type(flag) is bool for flag in flags)
            or all(type(flag) is np.bool_ for flag in flags)):
        details["flags"] = flags      # (the table keeps Python or numpy bools)
    added = last_added(episode)
    if added is not True:
        details["last_added"] = added
    usual = (("observations", episode.observation_space), ("actions", episode.action_space),
             ("rewards", REWARDS_SPACE), ("infos", None))
    spaces = {}
    for name, space in usual:
        have = getattr(episode, name).space
        if have is not space and fmt.space_text(have) != fmt.space_text(space):
            spaces[name] = fmt.space_text(have)
    for key, buf in episode.extra_model_outputs.items():
        if buf.space is not None:
            spaces[("extra_model_outputs", key)] = fmt.space_text(buf.space)
    if spaces:
        details["spaces"] = spaces
    return details or None


def _new_group(sig, number: int) -> GroupRows:
    """The rows of a new group of alike episodes, with the format's trees of
    their leaves (`spec`) for its step file."""
    trees = [_tree(s) for s in sig[:3]] + [_tree(s) for _, s in sig[3]]
    names = list(fmt.TRACKS) + [_extra_column(k, i) for i, (k, _) in enumerate(sig[3])]
    leaves = [leaf for tree in trees for leaf in fmt.tree_leaves(tree)]
    rewards = trees[2]
    rewards_leaf = len(fmt.tree_leaves(trees[0])) + len(fmt.tree_leaves(trees[1])) \
        if isinstance(rewards, dict) and rewards["codec"] == fmt.ARROW and not rewards["shape"] \
        else -1
    group = GroupRows(sig, number, [leaf["codec"] for leaf in leaves],
                      [fmt.leaf_dtype(leaf) for leaf in leaves],
                      [tuple(leaf["shape"]) for leaf in leaves], rewards_leaf)
    group.spec = (trees, names)
    return group


def _step_table(group: GroupRows):
    """A group's step file: a record batch per run of rows that its leaves
    hold alike (one, unless rows are referred to in place: see Rows.refer)."""
    pa = _pyarrow()
    trees, names = group.spec
    n = group.nrows
    infos = group.infos()
    infos = pa.nulls(n) if infos is None else fmt.binaries(infos)
    terminateds = fmt.numbers(group.terminateds.array())
    truncateds = fmt.numbers(group.truncateds.array())
    batches = []
    for first, count, leaves in group.batches():
        arrays = iter(leaves)
        columns = [_column(tree, arrays, count) for tree in trees]
        batches.append(columns + [infos.slice(first, count), terminateds.slice(first, count),
                                  truncateds.slice(first, count)])
    sig = group.signature
    meta = {
        "tracks": [{"column": name, "tree": fmt.tree_to_json(tree)}
                   for name, tree in zip(names[:3], trees[:3])],
        "extras": [{"column": name, "key": fmt.key_to_json(key), "tree": fmt.tree_to_json(tree)}
                   for name, (key, _), tree in zip(names[3:], sig[3], trees[3:])],
        "extras_defaultdict": bool(sig[4]),
    }
    schema = pa.schema([pa.field(k, v.type) for k, v in zip(
        list(names) + [fmt.INFOS, fmt.TERMINATEDS, fmt.TRUNCATEDS], batches[0])],
        metadata=fmt.metadata("steps", **meta))
    return pa.Table.from_batches([pa.record_batch(b, schema=schema) for b in batches])


def _column(tree, arrays, n: int):
    pa = _pyarrow()
    if isinstance(tree, dict):
        return fmt.leaf_array(tree, next(arrays), n)
    if tree[0] == "tuple":
        names, subs = [str(i) for i in range(len(tree[1]))], tree[1]
    else:
        names, subs = _field_names([k for k, _ in tree[1]]), [v for _, v in tree[1]]
    if not subs:
        return pa.nulls(n)      # an empty dict or tuple (Parquet has no empty struct)
    return pa.StructArray.from_arrays([_column(sub, arrays, n) for sub in subs], names=names)


def _episode_table(recording: Recording, step_files: list, checksums: list):
    """A part's episode table."""
    pa = _pyarrow()
    columns = {name: fmt.numbers(rows.array()) for name, rows in recording.numbers.items()
               if not name.endswith("_space")}
    dictionary = fmt.binaries(recording.spaces, pa.string())
    for name in ("observation_space", "action_space"):
        indices = recording.numbers[name].array()
        missing = indices < 0
        valid = None if not missing.any() else pa.py_buffer(
            np.packbits(~missing, bitorder="little"))
        codes = pa.Array.from_buffers(pa.int32(), len(indices), [
            valid, pa.py_buffer(np.where(missing, 0, indices).astype(np.int32))])
        columns[name] = pa.DictionaryArray.from_arrays(codes, dictionary)
    for name, values in recording.packed.items():
        columns[name] = fmt.binaries(values)
    schema = pa.schema([pa.field(k, v.type) for k, v in columns.items()],
                       metadata=fmt.metadata("episodes", step_files=step_files,
                                             step_checksums=checksums))
    return pa.Table.from_arrays(list(columns.values()), schema=schema)


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
    keyword arguments are EpisodeWriter's); returns the files written. No
    episodes make a dataset of none."""
    episodes = _episode_list(episodes, "write_episodes()")
    with EpisodeWriter(path, **kwargs) as writer:
        # (no own(): every part is written before the episodes are back)
        writer._add(episodes)
    return writer.files
