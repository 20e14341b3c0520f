"""Reading datasets: `read_episodes` and the `EpisodeDataset` it opens."""
from __future__ import annotations

import collections
import os
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Union, overload

import numpy as np

from episode._column import KINDS
from episode.offline import format as fmt
from episode.offline.format import DatasetError
from episode._dataset import LOOKBACK_COLUMNS as LOOKBACKS
from episode._dataset import MULTI, SINGLE, TABLE_PACKED, Encoded, EpisodeRows, StepFile
from episode.offline.writer import InThread, _pyarrow
from episode.single_agent_episode import SingleAgentEpisode

if TYPE_CHECKING:
    from episode.multi_agent_episode import MultiAgentEpisode
    from episode.replay import EpisodeReplayBuffer

    Episode = Union[SingleAgentEpisode, MultiAgentEpisode]

__all__ = ["EpisodeDataset", "read_episodes"]

# The episode table's columns of packed values.
_PACKED = TABLE_PACKED

# make_episode's fields (_Part.fields) and the episode table's columns of them.
_FIELDS = ("id_", "agent_id", "module_id", "multi_agent_episode_id", "custom_data", "details",
           "terminated", "truncated", "t_started", "observation_space", "action_space",
           "start_time", "last_step_time")
_FIELD_COLUMNS = ("id",) + _FIELDS[1:]

_MISSING = object()

# A done flag by its code: value + 2 where it was a numpy bool.
_FLAGS = np.array([False, True, np.False_, np.True_], object)

# Step files kept open (decoded Parquet, or memory-mapped Arrow) at once: at
# most OPEN_FILES, and before another is opened (or opened ahead), those
# open hold at most OPEN_BYTES / 2 of columns. A pass over an image dataset,
# whose files hold a little more than 256 MiB each, then holds three decoded
# files at most: the one it left, the one whose episodes it takes, and the
# next, inflated ahead on another core (see EpisodeDataset._open_ahead).
OPEN_FILES = 4
OPEN_BYTES = 768 << 20

# A step file smaller than this on disk is not opened ahead: opening it
# costs less than a thread does.
AHEAD_BYTES = 1 << 20
AHEAD_FILES = 2

_EPISODE_COLUMNS = ("kind", "parent", "group", "row", "rows", "length", "t_started",
                    "terminated", "truncated", "numpy_flags", "start_time", "last_step_time",
                    "observation_space", "action_space", "return") + TABLE_PACKED + LOOKBACKS


def read_episodes(path: Any, *, columns: Optional[Sequence[str]] = None,
                  verify: bool = True) -> "EpisodeDataset":
    """Opens the dataset at `path` (a folder, searched recursively, or one
    of its episode tables): our format, or RLlib's recorded episodes or
    rows, told apart by their schema. Only the episode tables are read
    here; each episode's rows are read when it is.

    `columns` limits what is read besides observations, actions and
    rewards: ``"infos"`` and the extra model outputs by key (default: all;
    ValueError for a name the dataset does not have).

    `verify` (the default) checks each file against its checksums before
    anything is built from it (a step file when it is first read: a read of
    its every byte), and raises DatasetError naming a damaged file;
    ``verify=False`` skips that, for storage you trust (or datasets written
    before episode wrote checksums).
    """
    return EpisodeDataset(path, columns=columns, verify=verify)


class EpisodeDataset:
    """The episodes of a dataset, in stored order: `len()`, iteration,
    ``ds[i]`` (a SingleAgentEpisode built over the file's columns: read in
    place from memory-mapped Arrow files when the episode was numpy'd),
    ``ds.num_steps``. Chunks of one episode (a `cut()` and its successors,
    written at different times) come back as one episode. Iterating opens
    the step file it goes on to next on a thread of its own, so that two
    cores inflate a compressed image dataset's files."""

    def __init__(self, path: Any, *, columns: Optional[Sequence[str]] = None,
                 verify: bool = True):
        pa = _pyarrow()
        self.path = os.fspath(path)
        self.verify = bool(verify)
        self._columns = None if columns is None else _checked_columns(columns)
        self._files: collections.OrderedDict = collections.OrderedDict()
        # Step files being opened ahead (see _open_ahead), by key.
        self._ahead: collections.OrderedDict = collections.OrderedDict()
        self._memory: Optional[list] = None
        self._buffer: Any = None
        self.rng = np.random.default_rng()
        tables, foreign = _scan(self.path, pa)
        self._foreign = foreign
        self._format = fmt.FORMAT
        if foreign:
            if tables:
                raise DatasetError(f"{self.path}: holds files of our format and others "
                                   f"({foreign[0]})")
            self._memory, self._format = _read_foreign(foreign, pa)
            self._entries = [(i,) for i in range(len(self._memory))]
            self.num_steps = int(sum(len(e) for e in self._memory))
            return
        self._parts = [_Part(p, self.verify) for p in tables]
        if self._columns is not None:
            _check_columns(self._columns, self._parts)
        self._index = _chunk_index(self._parts)
        self._entries = _join_chunks(self._index)
        self._joined = len(self._entries) != len(self._index["id"])
        self._where: Optional[list] = None
        lengths = self._index["length"]
        self.num_steps = int(lengths.sum()) if len(lengths) else 0

    # -- the sequence ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator["Episode"]:
        if self._memory is not None:
            for entry in self._entries:
                yield self._memory[entry[0]]
            return
        runs = self._runs()
        run = next(runs, None)
        while run is not None:
            part, group, rows, positions = run
            following = next(runs, None)
            if part is None:
                for position in positions:
                    yield self._entry(self._entries[position])
            else:
                # The next run's step file is opened ahead first: it is
                # inflated on another core while this one is (or while this
                # one's episodes are taken).
                if following is not None and following[0] is not None and (
                        following[0], following[1]) != (part, group):
                    self._open_ahead(following[0], following[1])
                step_file = self._step_file(part, group)
                # A run of one step file's plain episodes: built by one
                # compiled loop, no Python between them.
                yield from step_file.episodes(
                    SingleAgentEpisode, part.episode_rows, rows, part.misfit)
            run = following

    @overload
    def __getitem__(self, i: int) -> "Episode": ...

    @overload
    def __getitem__(self, i: slice) -> List["Episode"]: ...

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices are ints or slices, not {type(i).__name__}")
        n = len(self._entries)
        if not -n <= i < n:
            raise IndexError(f"episode {i} of a dataset of {n}")
        return self._entry(self._entries[int(i) % n])

    def _entry(self, entry: tuple) -> "Episode":
        # The episode of an entry: its chunks' numbers.
        if self._memory is not None:
            return self._memory[entry[0]]
        episode = self._chunk(entry[0])
        if len(entry) > 1:
            # A later chunk joins in the first one's mode: a numpy'd chunk
            # after a list-mode one is read back as the list-mode items it
            # held (the kinds its file records), so the joined episode is one
            # the writer could have recorded whole, not a mix of Python and
            # numpy numbers.
            agents = getattr(episode, "agent_episodes", None)
            list_mode = not any(e.is_numpy for e in (agents.values() if agents is not None
                                                     else [episode]))
            for k in entry[1:]:
                episode.concat_episode(self._chunk(k, list_mode))
        return episode

    # -- what the files hold, without building episodes ----------------------------------

    @property
    def format(self) -> str:
        """``"episode"`` (ours), or RLlib's ``"rllib_episodes"`` / ``"rllib_rows"``."""
        return self._format

    @property
    def files(self) -> List[str]:
        """The data files read: our episode tables, then their step files
        (or RLlib's files)."""
        if self._memory is not None:
            return list(self._foreign)
        tables = [p.path for p in self._parts]
        return tables + list(dict.fromkeys(f for p in self._parts for f in p.step_files))

    def check(self) -> None:
        """Reads every step file as reading its episodes would (its
        checksum with `verify`, its columns against its metadata, its rows
        against its episode table) without building an episode: a
        DatasetError names the first file that would not read."""
        if self._memory is not None:
            return                    # (RLlib's files are read whole when opened)
        for part in self._parts:
            for group in range(len(part.step_files)):
                self._step_file(part, group)

    @property
    def num_chunks(self) -> int:
        """The stored chunks the episodes are made of (a cut() episode's
        chunks count apart; a multi-agent episode's agents do not)."""
        return len(self._index["part"]) if self._memory is None else len(self._memory)

    def episode_table(self) -> Dict[str, np.ndarray]:
        """Per episode, in stored order, from the episode tables (no episode
        is built): ``length`` (env steps), ``return`` (NaN where rewards are
        not plain numbers), ``agent_steps``, ``terminated``, ``truncated``,
        ``multi_agent``. A cut episode's chunks are summed; a multi-agent
        episode's return and agent steps are its agents'."""
        if self._memory is not None:
            episodes = self._memory
            return {
                "length": np.array([len(e) for e in episodes], np.int64),
                "return": np.array([float(e.get_return()) for e in episodes], np.float64),
                "agent_steps": np.array([e.agent_steps() for e in episodes], np.int64),
                "terminated": np.array([bool(e.is_terminated) for e in episodes], bool),
                "truncated": np.array([bool(e.is_truncated) for e in episodes], bool),
                "multi_agent": np.array([hasattr(e, "agent_episodes") for e in episodes], bool)}
        chunks: dict = collections.defaultdict(list)
        for p in self._parts:
            t = p.table
            length, ret = t["length"].astype(np.int64), t["return"].astype(np.float64)
            parent, multi = t["parent"], t["kind"] == MULTI
            agent = parent >= 0
            agents_return, agents_length = np.zeros(p.n), np.zeros(p.n, np.int64)
            np.add.at(agents_return, parent[agent], ret[agent])
            np.add.at(agents_length, parent[agent], length[agent])
            columns = {"length": length, "return": np.where(multi, agents_return, ret),
                       "agent_steps": np.where(multi, agents_length, length),
                       "terminated": t["terminated"].astype(bool),
                       "truncated": t["truncated"].astype(bool), "multi_agent": multi}
            for name, column in columns.items():
                chunks[name].append(column[p.top])
        names = ("length", "return", "agent_steps", "terminated", "truncated", "multi_agent")
        flat = {name: np.concatenate(chunks[name]) if chunks[name] else np.zeros(0)
                for name in names}
        if not self._entries:
            return {name: flat[name][:0] for name in names}
        order = np.array([k for entry in self._entries for k in entry], np.int64)
        sizes = np.array([len(entry) for entry in self._entries], np.int64)
        starts = np.cumsum(sizes) - sizes
        last = order[starts + sizes - 1]       # (an episode's chunks are in time order)
        summed = {name: np.add.reduceat(flat[name][order], starts)
                  for name in ("length", "return", "agent_steps")}
        return {**summed, **{name: flat[name][last]
                             for name in ("terminated", "truncated", "multi_agent")}}

    def spaces(self) -> Dict[str, List[Optional[str]]]:
        """The distinct observation and action spaces of the single-agent
        episodes (a multi-agent episode's agents'), as RLlib's space dicts
        in JSON text (None: no space)."""
        found: dict = {"observation_space": [], "action_space": []}
        if self._memory is not None:
            for e in self._memory:
                for agent in (e.agent_episodes.values() if hasattr(e, "agent_episodes")
                              else [e]):
                    for name in found:
                        text = fmt.space_text(getattr(agent, name))
                        if text not in found[name]:
                            found[name].append(text)
            return found
        pa = _pyarrow()
        for p in self._parts:
            single = np.flatnonzero(p.table["kind"] == SINGLE)
            for name in found:
                texts = p.table[name].take(single).cast(pa.string()).unique().to_pylist()
                found[name] += [text for text in texts if text not in found[name]]
        return found

    def agent_ids(self) -> list:
        """The agent ids of the multi-agent episodes, each once, in the order met."""
        ids: list = []
        if self._memory is not None:
            for e in self._memory:
                ids += [a for a in getattr(e, "agent_episodes", {}) if a not in ids]
            return ids
        for p in self._parts:
            for i in np.flatnonzero(p.table["parent"] >= 0):
                agent_id = p.value("agent_id", int(i))
                if agent_id not in ids:
                    ids.append(agent_id)
        return ids

    # -- drawing training batches --------------------------------------------------------

    def sample_batch(self, batch_size: int, **kwargs: Any) -> Dict[str, Any]:
        """A training batch of `batch_size` n-step transitions (or `(B, T)`
        sequences with ``batch_length_T``) drawn uniformly from the dataset's
        episodes: `EpisodeReplayBuffer.sample_batch` (same arguments, keys
        and rules) on a buffer holding the whole dataset, made on the first
        call. For a dataset of multi-agent episodes, a batch per module
        ({module_id: batch}), as `MultiAgentEpisodeReplayBuffer.sample_batch`
        draws them (`modules_to_sample` too). Draws use ``self.rng`` (a numpy
        Generator; set it, or its seed, for reproducible draws)."""
        return self.replay_buffer().sample_batch(batch_size, **kwargs)

    def replay_buffer(self) -> "EpisodeReplayBuffer":
        """The replay buffer holding every episode of the dataset, made on
        first use and kept; its `rng` is ``self.rng``: an
        EpisodeReplayBuffer (its capacity the dataset's steps; see
        EpisodeReplayBuffer.add_dataset), or for multi-agent episodes a
        MultiAgentEpisodeReplayBuffer. ValueError for a dataset of both."""
        from episode.replay import EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer

        if self._buffer is None:
            if self.num_steps == 0:
                raise ValueError(f"{self.path}: the dataset has no steps to draw from")
            table = self.episode_table()
            multi = table["multi_agent"]
            if multi.all():
                buffer = MultiAgentEpisodeReplayBuffer(
                    capacity=int(max(self.num_steps, table["agent_steps"].sum())))
                buffer.add(list(self))
            elif multi.any():
                raise ValueError(f"{self.path}: holds single- and multi-agent episodes; "
                                 f"batches are drawn from one kind")
            else:
                buffer = EpisodeReplayBuffer(capacity=self.num_steps)
                buffer.add_dataset(self)
            self._buffer = buffer
        self._buffer.rng = self.rng
        return self._buffer

    def replay_items(self) -> list:
        """The dataset in stored order as a replay buffer's add_dataset()
        takes it: ("block", keyword arguments of Store.add_block()) for each
        run of single-agent episodes of one step file that are whole chunks
        with one lookback for all their tracks (their rows as the file holds
        them, no episode object each), ("episodes", positions) for the
        others (added as episodes)."""
        if self._memory is not None:
            return [("episodes", list(range(len(self))))]
        index = self._index
        runs: list = []            # [(file or None, [(position, local row)])]
        for position, entry in enumerate(self._entries):
            k = entry[0]
            p = int(index["part"][k])
            part, i = self._parts[p], int(index["local"][k])
            lookbacks = part.lookbacks[i]
            where = None
            if (len(entry) == 1 and part.table["kind"][i] == SINGLE and part.table["rows"][i]
                    and (lookbacks == lookbacks[0]).all() and _plain_details(part, i)):
                where = (p, int(part.table["group"][i]))
            if runs and runs[-1][0] == where:
                runs[-1][1].append((position, i))
            else:
                runs.append((where, [(position, i)]))
        items: list = []
        metas: dict = {}
        for where, members in runs:
            blocks = None if where is None else self._blocks(where, members, metas)
            if blocks is not None:
                items.extend(("block", block) for block in blocks)
            elif items and items[-1][0] == "episodes":
                items[-1][1].extend(position for position, _ in members)
            else:
                items.append(("episodes", [position for position, _ in members]))
        return items

    def _blocks(self, where: tuple, members: list, metas: dict) -> Optional[list]:
        """add_block() arguments for `members` of step file `where`: one per
        record batch they lie in (its rows read in place), or None (a leaf
        without rows: one by one)."""
        from episode._replay import EpisodeMeta

        part = self._parts[where[0]]
        step_file = self._step_file(part, where[1])
        t = part.table
        numbers = np.array([i for _, i in members], np.int64)
        first_rows = t["row"][numbers]
        starts = np.array(step_file.batches(), np.int64)
        batch = np.minimum(np.searchsorted(starts, first_rows, side="right") - 1,
                           len(starts) - 2)
        if (first_rows + t["rows"][numbers] <= starts[batch + 1]).all():
            cuts = np.flatnonzero(batch[1:] != batch[:-1]) + 1
            spans = [(a, b, int(starts[batch[a]]), int(starts[batch[a] + 1]))
                     for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(numbers)])]
        else:       # (rows across batches: joined, a copy)
            spans = [(0, len(numbers), 0, step_file.nrows)]
        blocks = []
        for a, b, lo, hi in spans:
            tracks = step_file.block_tracks(lo, hi)
            if tracks is None:
                return None
            rows = numbers[a:b]
            first = self._single(part, int(rows[0]))
            extra_keys = tuple(first.extra_model_outputs)
            defaultdict_extras = type(first.extra_model_outputs) is not dict
            block_metas, ids = [], []
            for i in rows.tolist():
                fields = part.fields(i)
                key = (fields["agent_id"], fields["module_id"], fields["multi_agent_episode_id"],
                       part.cell("observation_space", i), part.cell("action_space", i))
                meta = metas.get(key) if fields["custom_data"] is None else None
                if meta is None:
                    meta = EpisodeMeta(key[0], key[1], key[2], fields["observation_space"],
                                       fields["action_space"], extra_keys,
                                       fields["custom_data"], defaultdict_extras)
                    if fields["custom_data"] is None:
                        metas[key] = meta
                block_metas.append(meta)
                ids.append(fields["id_"])
            blocks.append({
                "first": first, "tracks": tracks, "infos": step_file.infos_by_row(lo, hi),
                "nrows": hi - lo, "rows": first_rows[a:b] - lo,
                "lookbacks": part.lookbacks[rows, 0], "lengths": t["length"][rows],
                "t_started": t["t_started"][rows], "terminated": t["terminated"][rows],
                "truncated": t["truncated"][rows], "start_times": t["start_time"][rows],
                "last_step_times": t["last_step_time"][rows], "ids": ids,
                "metas": block_metas})
        return blocks

    def __repr__(self) -> str:
        return f"EpisodeDataset({self.path!r}: {len(self)} episodes, {self.num_steps} steps)"

    # -- building one chunk ---------------------------------------------------------------

    def _runs(self) -> Iterator[tuple]:
        """The episodes in stored order, part by part, as runs: (part, step
        file number, its rows, None) for single-agent episodes of one chunk
        whose rows lie in that step file and need nothing but building,
        (None, None, None, positions) for the others."""
        entries, index = self._entries, self._index
        n = len(entries)
        if self._joined:
            first = np.fromiter((entry[0] for entry in entries), np.int64, n)
            plain = np.fromiter((len(entry) == 1 for entry in entries), np.bool_, n)
        else:
            first, plain = np.arange(n), np.ones(n, np.bool_)
        parts, local = index["part"][first], index["local"][first]
        cuts = [0] + (np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist() + [n]
        for start, stop in zip(cuts[:-1], cuts[1:]):
            if start == stop:
                continue
            part = self._parts[int(parts[start])]
            if part.episode_rows is None:
                part.make_episode_rows()
            rows = local[start:stop]
            ok = plain[start:stop] & (part.table["kind"][rows] == SINGLE)
            if part.details:
                ok &= ~np.isin(rows, np.fromiter(part.details, np.int64, len(part.details)))
            key = np.where(ok, part.table["group"][rows], -1)
            bounds = [0] + (np.flatnonzero(key[1:] != key[:-1]) + 1).tolist() + [len(key)]
            for a, b in zip(bounds[:-1], bounds[1:]):
                if key[a] >= 0:
                    yield part, int(key[a]), rows[a:b], None
                else:
                    yield None, None, None, range(start + a, start + b)

    def _chunk(self, k: int, list_mode: bool = False) -> Any:
        if self._where is None:
            self._where = list(zip(self._index["part"].tolist(), self._index["local"].tolist()))
        p, i = self._where[k]
        part = self._parts[p]
        if part.cells("kind")[i] == SINGLE:
            return self._single(part, i, list_mode)
        agents = {}
        for j in part.children.get(i, ()):
            agent = self._single(part, j, list_mode)
            agents[agent.agent_id] = agent
        return fmt.multi_episode(part.value("id", i), part.cell("multi_state", i),
                                 agents, f"{part.path}: episode {i}")

    def _single(self, part: "_Part", i: int, list_mode: bool = False) -> SingleAgentEpisode:
        table = part.episode_rows or part.make_episode_rows()
        details = part.details.get(i)
        step_file = self._step_file(part, table.group(i), list_mode)
        try:
            if details is not None:
                if type(details) is _Unreadable:
                    raise DatasetError(f"{part.path}: column {details.column!r}, episode {i}: "
                                       f"{details.error}")
                if not isinstance(details, dict):
                    raise ValueError("malformed details")
            episode = step_file.episode(SingleAgentEpisode, table, i)
            if details is not None:
                if "spaces" in details:
                    _set_buffer_spaces(episode, details["spaces"], part.path)
                if "flags" in details:
                    episode.is_terminated, episode.is_truncated = details["flags"]
        except (ValueError, TypeError, AssertionError, KeyError) as error:
            raise part.misfit(i, error) from None
        return episode

    def _make_room(self, keep: Optional[tuple] = None) -> bool:
        """Closes the files open longest until another may open (see
        OPEN_FILES), the file `keep` apart; whether it may."""
        if not self._no_room():
            return True
        parquet = any(path.endswith(".parquet") for path, _ in self._files)
        while self._no_room() and next(iter(self._files)) != keep:
            self._files.popitem(last=False)
        # Arrow's allocator keeps freed blocks for reuse. Those of Parquet
        # files' decoding (their pages, of every size) are handed back before
        # the next file is decoded: kept, they add to a pass's peak. Those
        # of an Arrow file are what the next one inflates into, of its size:
        # handed back, the kernel must give fresh pages (zeroed, faulted in
        # by two threads at once) and a pass takes 1.3-9x longer, for the
        # same peak.
        if parquet:
            _pyarrow().default_memory_pool().release_unused()
        return not self._no_room()

    def _open_ahead(self, part: "_Part", group: int) -> None:
        """Starts opening step file `group` of `part` on a thread of its own
        (Arrow lets go of the GIL while it inflates), when a pass goes on to
        it next: room made for it beside the file the pass reads now."""
        if not 0 <= group < len(part.step_files):
            return                          # (the pass raises when it gets there)
        path = part.step_files[group]
        key = (path, False)
        if key in self._files or key in self._ahead:
            return
        if len(self._ahead) >= AHEAD_FILES:
            self._ahead.popitem(last=False)    # (a pass left off: what it opened is dropped)
        try:
            small = os.path.getsize(path) < AHEAD_BYTES
        except OSError:
            return
        current = next(reversed(self._files)) if self._files else None
        if small or not self._make_room(keep=current):
            return
        # (Not a daemon: a program that ends during a pass waits for it,
        # rather than stopping it inside Arrow.)
        self._ahead[key] = InThread(_checked_step_file, part, group, self._columns,
                                    self.verify, daemon=False)

    def _no_room(self) -> bool:
        # Whether a step file must close before another opens (see OPEN_FILES).
        return bool(self._files) and (len(self._files) >= OPEN_FILES or sum(
            n for _, n in self._files.values()) > OPEN_BYTES // 2)

    def _step_file(self, part: "_Part", group: int, list_mode: bool = False) -> StepFile:
        if not 0 <= group < len(part.step_files):
            raise DatasetError(f"{part.path}: an episode in step file {group} of "
                               f"{len(part.step_files)}")
        path = part.step_files[group]
        key = (path, list_mode)
        found = self._files.get(key)
        if found is not None:
            self._files.move_to_end(key)
            return found[0]
        ahead = self._ahead.pop(key, None)
        self._make_room()
        step_file, nbytes = ahead.result() if ahead is not None else \
            _checked_step_file(part, group, self._columns, self.verify, list_mode)
        needed = part.rows_needed(group)
        if needed > step_file.nrows:
            raise DatasetError(f"{path}: {step_file.nrows:,} rows, where its episode table "
                               f"{part.path} places episodes up to row {needed:,} (cut short "
                               f"or replaced?)")
        self._files[key] = (step_file, nbytes)
        return step_file


def _set_buffer_spaces(episode, spaces: Any, path: str) -> None:
    # The buffers' spaces that were not the usual ones (see the writer's).
    if not isinstance(spaces, dict):
        raise ValueError("malformed buffer spaces")
    for name, text in spaces.items():
        space = fmt.space_of(text, path)
        if isinstance(name, tuple) and len(name) == 2 and name[0] == "extra_model_outputs":
            buf = episode.extra_model_outputs.get(name[1])
            if buf is not None:
                buf.space = space
        elif name in ("observations", "actions", "rewards", "infos"):
            getattr(episode, name).space = space
        else:
            raise ValueError(f"a space for no buffer: {name!r}")


def _checked_columns(columns: Sequence[str]) -> frozenset:
    if isinstance(columns, (str, bytes)) or not all(isinstance(c, str) for c in columns):
        raise TypeError("columns is a list of column names")
    return frozenset(columns)


def _check_columns(columns: frozenset, parts: list) -> None:
    """ValueError for `columns` the dataset has nowhere (the step files'
    schemas say which extra outputs they hold)."""
    have = {fmt.INFOS}
    for part in parts:
        for path in part.step_files:
            meta = fmt.read_metadata(read_schema(path), path, "steps")
            extras = meta.get("extras")
            if not isinstance(extras, list):
                raise DatasetError(f"{path}: malformed track metadata")
            have.update(k for k in (_key_name(e, path) for e in extras) if isinstance(k, str))
    unknown = sorted(columns - have - {"obs", "actions", "rewards"})
    if unknown:
        raise ValueError(f"columns {unknown}: not in the dataset, which has "
                         f"{sorted(have)} (observations, actions and rewards are always read)")


# -- finding files ---------------------------------------------------------------------------


def _scan(path: str, pa) -> tuple:
    """(our episode tables, other tools' data files) under `path`."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no dataset at {path}")
    if os.path.isfile(path):
        if ".steps-" in os.path.basename(path).rpartition(".")[0]:
            raise DatasetError(f"{path}: a step file of an episode dataset, which holds rows "
                               f"but not where episodes start and end: pass the dataset's "
                               f"folder ({os.path.dirname(path) or '.'}) or one of its "
                               f"episode tables (*.episodes.*)")
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files.extend(os.path.join(root, n) for n in sorted(names)
                         if not n.startswith(".") and n.rsplit(".", 1)[-1] in fmt.EXTENSIONS)
    tables, foreign, steps = [], [], []
    for f in files:
        name = os.path.basename(f)
        stem, _, ext = name.rpartition(".")
        if stem.endswith(".episodes"):
            tables.append(f)
        elif ".steps-" in stem:
            steps.append(f)     # read through its part's episode table
        elif ext in fmt.EXTENSIONS:
            foreign.append(f)
    if not tables and not foreign:
        if steps:
            raise DatasetError(f"{path}: step files without their episode tables ({steps[0]}, "
                               f"...): a part exists once its episode table is written, so "
                               f"these are parts an interrupted write never finished")
        if os.path.isfile(path):
            raise DatasetError(f"{path}: not a dataset file (.parquet or .arrow)")
        raise DatasetError(f"{path}: no dataset files (.parquet or .arrow) in it")
    return tables, foreign


def _read_table(path: str, pa, columns: Optional[list] = None, verify: bool = True):
    """The file's table (`columns` of it), checked whole by Arrow (and its
    Parquet page checksums with `verify`) before any of it is used: a
    damaged file raises DatasetError, not a bad read."""
    return fmt.read_table(path, columns, verify=verify)


def read_schema(path: str):
    """A data file's Arrow schema, read from its footer alone (DatasetError
    for a file that is not a readable Parquet or Arrow file)."""
    pa = _pyarrow()
    try:
        if path.endswith(".arrow"):
            return pa.ipc.open_file(pa.memory_map(path)).schema
        import pyarrow.parquet as pq

        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as error:
        raise DatasetError(f"{path}: not a readable {path.rpartition('.')[2]} file "
                           f"({error})") from None


def _read_foreign(files: list, pa) -> tuple:
    """Other tools' recordings: RLlib's episodes or rows, read whole, the
    files in the order they were written."""
    from episode.offline import rllib_format

    files = sorted(files, key=rllib_format.file_order)
    kinds, tables = [], []
    for path in files:
        kind = rllib_format.detect_format(read_schema(path))
        if kind is None:
            raise DatasetError(f"{path}: neither a file of an episode dataset nor one of "
                               f"RLlib's recordings")
        kinds.append(kind)
        tables.append((path, _read_table(path, pa)))
    if len(set(kinds)) > 1:
        raise DatasetError(f"{files[0]}: RLlib's episodes and rows in one dataset")
    try:
        return rllib_format.recording_episodes(tables, kinds[0]), kinds[0]
    except (ValueError, TypeError, KeyError) as error:
        raise DatasetError(str(error)) from None


# -- the episode tables ---------------------------------------------------------------------


class _Part:
    """One written part: its episode table (read whole: a row per episode)
    and the step files it names."""

    def __init__(self, path: str, verify: bool):
        self.path = path
        table, meta = fmt.read_episode_table(path, verify=verify)
        names = meta.get("step_files")
        if not isinstance(names, list) or not all(
                isinstance(n, str) and os.path.basename(n) == n and not n.startswith(".")
                for n in names):
            raise DatasetError(f"{path}: malformed step file list in its metadata")
        # Each step file's [size, CRC-32] (checked with verify).
        self.checksums = meta.get("step_checksums")
        if verify and not (isinstance(self.checksums, list)
                           and len(self.checksums) == len(names)):
            raise DatasetError(f"{path}: malformed step file checksums in its metadata")
        folder = os.path.dirname(path)
        self.step_files = [os.path.join(folder, n) for n in names]
        missing = [n for n in self.step_files if not os.path.exists(n)]
        if missing:
            raise DatasetError(f"{path}: its step file {missing[0]} is missing")
        self.table = {}
        for name in _EPISODE_COLUMNS:
            if name not in table.schema.names:
                raise DatasetError(f"{path}: no column {name!r} in the episode table")
            column = table.column(name)
            self.table[name] = column if name in _PACKED or name.endswith("_space") \
                else _numbers(column, path, name)
        self.n = table.num_rows
        self.lookbacks = np.stack([self.table[name] for name in LOOKBACKS], axis=1) \
            if self.n else np.zeros((0, 5), np.int32)
        for name in ("row", "rows", "length", "t_started") + LOOKBACKS:
            if self.n and self.table[name].min() < 0:
                raise DatasetError(f"{path}: negative values in column {name!r}")
        kinds, parents = self.table["kind"], self.table["parent"]
        if self.n and not (np.isin(kinds, (SINGLE, MULTI)).all()
                           and ((parents == -1) | ((parents >= 0) & (parents < self.n))).all()
                           and (kinds[parents[parents >= 0]] == MULTI).all()
                           and (kinds[parents >= 0] == SINGLE).all()):
            raise DatasetError(f"{path}: malformed kind or parent columns")
        # A multi-agent episode's agents: the rows naming it their parent.
        self.children: dict = collections.defaultdict(list)
        for j in np.flatnonzero(parents >= 0):
            self.children[int(parents[j])].append(int(j))
        self.top = np.flatnonzero(parents == -1)
        self._spaces: dict = {}
        self._cells: dict = {}
        self._values: dict = {}
        self._fields: Optional[list] = None
        self._unreadable: dict = {}         # row -> (column, error) of a packed cell
        self.episode_rows: Optional[EpisodeRows] = None
        # Episode -> what its read must do besides building it: its details
        # other than the last added observation, or an _Unreadable cell.
        self.details: dict = {}

    def rows_needed(self, group: int) -> int:
        """The rows the episodes in step file `group` take: its rows past
        the last one's."""
        mine = np.flatnonzero(self.table["group"] == group)
        if not len(mine) or not self.n:
            return 0
        return int((self.table["row"][mine].astype(np.int64)
                    + self.table["rows"][mine].astype(np.int64)).max())

    def cell(self, name: str, i: int) -> Any:
        """Episode `i`'s cell of the Arrow column `name`, as a Python value."""
        return self.cells(name)[i]

    def cells(self, name: str) -> list:
        """The column `name` as a list of Python values, made once (a
        pyarrow scalar or a numpy one costs far more than a list item)."""
        cells = self._cells.get(name)
        if cells is None:
            column = self.table[name]
            cells = self._cells[name] = column.tolist() if isinstance(column, np.ndarray) \
                else [None] * len(column) if column.null_count == len(column) \
                else column.to_pylist()
        return cells

    def value(self, name: str, i: int) -> Any:
        """Episode `i`'s value in the packed column `name` (None: null)."""
        value = self._unpacked(name)[i]
        if type(value) is _Unreadable:
            raise DatasetError(f"{self.path}: column {name!r}, episode {i}: {value.error}")
        return value

    def _unpacked(self, name: str) -> list:
        # The packed column `name` unpacked, made once (an _Unreadable for
        # a cell that does not unpack, raised when its episode is read).
        values = self._values.get(name)
        if values is None:
            cells = self.cells(name)
            if self.table[name].null_count == self.n:
                values = cells
            else:
                try:
                    values = fmt.unpack_values(cells)
                except ValueError:
                    values = [_unpacked(blob) for blob in cells]
                    for j, value in enumerate(values):
                        if type(value) is _Unreadable:
                            self._unreadable.setdefault(j, (name, value.error))
            self._values[name] = values
        return values

    def fields(self, i: int) -> dict:
        """make_episode's fields of episode `i`."""
        columns = self._fields or self._field_columns()
        bad = self._unreadable.get(i)
        if bad is not None:
            raise DatasetError(f"{self.path}: column {bad[0]!r}, episode {i}: {bad[1]}")
        return dict(zip(_FIELDS, [column[i] for column in columns]))

    def make_episode_rows(self) -> EpisodeRows:
        """The compiled table StepFile.episode() reads (made once)."""
        columns = dict(zip(_FIELDS, self._fields or self._field_columns()))
        last_added = []
        for j, details in enumerate(columns["details"]):
            if details is None:
                last_added.append(True)
                continue
            if isinstance(details, dict):
                last_added.append(details.get("last_added", True))
                if set(details) <= {"last_added"}:
                    continue
            else:
                last_added.append(True)
            self.details[j] = details
        for j, (name, error) in self._unreadable.items():
            self.details[j] = _Unreadable(error, name)
        t = self.table
        try:
            self.episode_rows = EpisodeRows(
                t["group"], t["row"], t["rows"], t["length"], t["t_started"], self.lookbacks,
                t["start_time"], t["last_step_time"], columns["id_"], columns["agent_id"],
                columns["module_id"], columns["multi_agent_episode_id"],
                columns["custom_data"], columns["terminated"], columns["truncated"],
                columns["observation_space"], columns["action_space"], last_added)
        except ValueError as error:
            raise DatasetError(f"{self.path}: {error}") from None
        return self.episode_rows

    def misfit(self, i: int, error: Exception) -> DatasetError:
        """The error for episode `i` that its step file's rows do not build."""
        return DatasetError(f"{self.path}: episode {i} does not fit its step file "
                            f"({type(error).__name__}: {error})")

    def _field_columns(self) -> list:
        # fields()' values, a list per field, made once per part: the
        # packed ones unpacked, flags of the type written, NaN times None.
        columns = []
        for name in _FIELD_COLUMNS:
            if name in _PACKED:
                values = self._unpacked(name)
            elif name.endswith("_space"):
                values = self._spaces_of(name)
            elif name in ("terminated", "truncated"):
                # Python bools, or numpy's where the episode's flags were.
                codes = self.table[name].astype(np.intp) + 2 * self.table["numpy_flags"]
                values = _FLAGS[codes].tolist()
            elif name.endswith("_time"):
                times = self.table[name]
                values = times.astype(object)
                values[np.isnan(times)] = None
                values = values.tolist()
            else:
                values = self.cells(name)
            columns.append(values)
        self._fields = columns
        return columns

    def _spaces_of(self, name: str) -> list:
        # Each episode's space in column `name` (a dictionary column of their
        # texts: each text made a space once).
        column = self.table[name]
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if column.null_count or not hasattr(column, "indices"):
            cells = self.cells(name)
            spaces = {text: self._space_of_text(name, text) for text in set(cells)}
            return [spaces[text] for text in cells]
        indices = fmt.array_numbers(column.indices, np.dtype(
            column.indices.type.to_pandas_dtype()), f"{self.path}: column {name!r}")
        texts = column.dictionary.to_pylist()
        if len(indices) and not 0 <= indices.min() <= indices.max() < len(texts):
            raise DatasetError(f"{self.path}: column {name!r}: malformed dictionary indices")
        by_number = np.empty(len(texts), object)
        by_number[:] = [self._space_of_text(name, text) for text in texts]
        return by_number[indices].tolist()

    def _space_of_text(self, name: str, text: Optional[str]) -> Any:
        # The episodes of one space share its object, as a sampler's do.
        space = self._spaces.get(text, _MISSING)
        if space is _MISSING:
            space = self._spaces[text] = fmt.space_of(text, f"{self.path}: column {name!r}")
        return space




class _Unreadable:
    """A packed cell that did not unpack: its error, raised when the
    episode holding it is read."""

    __slots__ = ("error", "column")

    def __init__(self, error: ValueError, column: str = ""):
        self.error = error
        self.column = column


def _unpacked(blob: Any) -> Any:
    if blob is None:
        return None
    try:
        return fmt.unpack_value(blob)
    except ValueError as error:
        return _Unreadable(error)


def _plain_details(part: "_Part", i: int) -> bool:
    # No details but, at most, the last added observation (which a replay
    # store does not keep).
    details = part.value("details", i)
    return details is None or set(details) <= {"last_added"}


def _numbers(column, path: str, name: str) -> np.ndarray:
    pa = _pyarrow()
    if column.null_count:
        raise DatasetError(f"{path}: nulls in column {name!r}")
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if not (pa.types.is_boolean(kind) or pa.types.is_integer(kind)
            or pa.types.is_floating(kind)):
        raise DatasetError(f"{path}: column {name!r} is not numbers ({kind})")
    return fmt.array_numbers(array, np.dtype(kind.to_pandas_dtype()), f"{path}: column {name!r}")


def _chunk_index(parts: list) -> dict:
    """Every stored chunk but the agents' of multi-agent ones, in stored
    order: its part, its row there, its id, start and length (what joining
    chunks needs)."""
    def column(name):
        return np.concatenate([p.table[name][p.top] for p in parts])

    return {
        "part": np.concatenate([np.full(len(p.top), k, np.int64) for k, p in enumerate(parts)]),
        "local": np.concatenate([p.top for p in parts]),
        "length": column("length").astype(np.int64),
        "t_started": column("t_started").astype(np.int64),
        "done": column("terminated") | column("truncated"),
        "id": [cells[i] for p in parts for cells in [p.cells("id")] for i in p.top.tolist()],
    }


def _join_chunks(index: dict) -> list:
    """The dataset's episodes: tuples of chunk numbers, one per stored
    chunk, except that a chunk continuing another of the same id (it starts
    where the other ends, and that one is not done) joins it."""
    ids = index["id"]
    n = len(ids)
    if len(set(ids)) == n:
        return [(k,) for k in range(n)]
    by_id: dict = collections.defaultdict(list)
    for k, key in enumerate(ids):
        by_id[key].append(k)
    t_started, length, done = index["t_started"], index["length"], index["done"]
    first_of: dict = {}
    for chunks in by_id.values():
        chunks.sort(key=lambda k: (t_started[k], k))
        run = [chunks[0]]
        for k in chunks[1:]:
            prev = run[-1]
            if not done[prev] and t_started[k] == t_started[prev] + length[prev]:
                run.append(k)
            else:
                first_of[min(run)] = tuple(run)
                run = [k]
        first_of[min(run)] = tuple(run)
    return [first_of[k] for k in sorted(first_of)]


# -- step files ------------------------------------------------------------------------------


def _open_step_file(path: str, columns: Optional[frozenset], verify: bool,
                    list_mode: bool = False) -> tuple:
    """(the step file at `path`, the bytes of its columns); with
    `list_mode`, its numpy'd leaves read as the list-mode items they held
    before to_numpy() (their recorded kinds), where every leaf can be (else
    as written)."""
    pa = _pyarrow()
    schema = read_schema(path)
    meta = fmt.read_metadata(schema, path, "steps")
    tracks, extras = meta.get("tracks"), meta.get("extras")
    if not (isinstance(tracks, list) and len(tracks) == 3 and isinstance(extras, list)
            and type(meta.get("extras_defaultdict")) is bool):
        raise DatasetError(f"{path}: malformed track metadata")
    wanted = [t for t in tracks] + [e for e in extras if columns is None or
                                    _key_name(e, path) in columns]
    names = [_track_column(t, path) for t in wanted]
    read_infos = columns is None or "infos" in columns
    names += [fmt.INFOS] if read_infos else []
    missing = [n for n in names if n not in schema.names]
    if missing:
        raise DatasetError(f"{path}: no column {missing[0]!r}")
    table = _read_table(path, pa, names, verify)
    leaves, kinds, finalized, opens, trees, specs = [], [], [], [], [], []
    for spec, name in zip(wanted, names):
        tree = fmt.tree_from_json(spec.get("tree"), f"{path}: column {name!r}")
        specs += fmt.tree_leaves(tree)
        column = _chunks(table.column(name), pa)
        trees.append(_load_tree(tree, column, name, path, leaves, kinds, finalized, opens))
    infos = None
    if read_infos:
        column = _whole(table.column(fmt.INFOS), pa)
        if column.type != pa.null():       # (null-typed: no step has an info)
            if column.type != pa.binary():
                raise DatasetError(f"{path}: column 'infos' is {column.type}, not binary")
            infos = _encoded(column, path, fmt.INFOS)
    extra_keys = [fmt.key_from_json(e.get("key"), path) for e in wanted[3:]]
    if list_mode and any(finalized) and all(_fits_list_mode(leaf) for leaf in specs):
        finalized = [False] * len(finalized)
        opens = [False] * len(opens)
    return StepFile(leaves, kinds, finalized, opens, trees, extra_keys,
                    meta["extras_defaultdict"], infos, table.num_rows), table.nbytes


def _checked_step_file(part: "_Part", group: int, columns: Optional[frozenset],
                       verify: bool, list_mode: bool = False) -> tuple:
    """_open_step_file of step file `group` of `part`, its checksum checked
    first with `verify` (in the pass's thread, or one opening it ahead)."""
    path = part.step_files[group]
    if verify:
        fmt.check_file(path, part.checksums[group], part.path)
    return _open_step_file(path, columns, verify, list_mode)


def _fits_list_mode(leaf: dict) -> bool:
    # Whether a leaf's rows can be list-mode items of its recorded kind (a
    # numpy'd leaf of other rows, or of no row type, cannot).
    try:
        _check_leaf_mode(dict(leaf, finalized=False), None, "")
    except DatasetError:
        return False
    return not leaf["open"]


def _whole(column, pa):
    # A column as one array: one chunk is used as it is (a view of a mapped
    # Arrow file's pages; combine_chunks() would copy even one); an Arrow
    # file of no rows has none.
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks() if column.num_chunks else pa.nulls(0, column.type)


def _chunks(column, pa):
    # A column as one array (see _whole), or as its chunks (a file of several
    # record batches: the stored leaves are read chunk by chunk, in place).
    return column if column.num_chunks > 1 else _whole(column, pa)


def _key_name(extra: Any, path: str) -> Any:
    if not isinstance(extra, dict):
        raise DatasetError(f"{path}: malformed extra output metadata")
    return fmt.key_from_json(extra.get("key"), path)


def _track_column(spec: Any, path: str) -> str:
    if not (isinstance(spec, dict) and isinstance(spec.get("column"), str)):
        raise DatasetError(f"{path}: malformed track metadata")
    return spec["column"]


def _encoded(column, path: str, name: str) -> Encoded:
    try:
        return Encoded(column, fmt.unpack_value)
    except (ValueError, TypeError) as error:
        raise DatasetError(f"{path}: column {name!r}: {error}") from None


_TYPED_KINDS = (KINDS["float"], KINDS["int"], KINDS["bool"], KINDS["scalar"], KINDS["array"])
_LIST_KINDS = {KINDS["float"]: np.dtype(np.float64), KINDS["int"]: np.dtype(np.int64),
               KINDS["bool"]: np.dtype(np.bool_)}


def _load_tree(tree, column, name: str, path: str, leaves: list, kinds: list,
               finalized: list, opens: list) -> Any:
    """The StepFile tree of a track (leaf numbers in its nesting), its
    leaves' rows appended to `leaves` (and their kinds and modes), each
    checked against the metadata."""
    pa = _pyarrow()
    where = f"{path}: column {name!r}"
    if isinstance(column, pa.ChunkedArray):
        # Several record batches: stored leaves are read chunk by chunk (in
        # place), a struct's fields as their chunks, anything else joined.
        if isinstance(tree, dict):
            if tree["codec"] not in fmt.STORED:
                column = _whole(column, pa)
        elif isinstance(column.type, pa.StructType) and not column.null_count:
            column = _StructChunks(column)
        else:
            column = _whole(column, pa)
    if isinstance(tree, dict):
        rows = fmt.leaf_rows(tree, column, where)   # (chunked: a list, a chunk's rows each)
        if tree["codec"] == fmt.VALUE:
            rows = _encoded(rows, path, name)
        _check_leaf_mode(tree, rows, where)
        leaves.append(rows)
        kinds.append(tree["kind"])
        finalized.append(tree["finalized"])
        opens.append(tree["open"])
        return len(leaves) - 1
    if not tree[1]:
        if column.type != pa.null():
            raise DatasetError(f"{where}: expected an all-null column for an empty {tree[0]}")
        return {} if tree[0] == "dict" else ()
    if not isinstance(column.type, pa.StructType) or column.type.num_fields != len(tree[1]) \
            or column.null_count:
        raise DatasetError(f"{where}: expected a struct of {len(tree[1])} fields")
    subs = [column.field(i) for i in range(len(tree[1]))]
    if tree[0] == "tuple":
        return tuple(_load_tree(t, c, f"{name}.{i}", path, leaves, kinds, finalized, opens)
                     for i, (t, c) in enumerate(zip(tree[1], subs)))
    return {key: _load_tree(t, c, f"{name}.{key}", path, leaves, kinds, finalized, opens)
            for (key, t), c in zip(tree[1], subs)}


class _StructChunks:
    """A struct column of several chunks as _load_tree walks it: its type,
    and each field as the chunks of that field."""

    def __init__(self, column):
        self.type = column.type
        self.null_count = 0
        self.chunks = column.chunks

    def field(self, i: int):
        pa = _pyarrow()
        return pa.chunked_array([chunk.field(i) for chunk in self.chunks],
                                self.type.field(i).type)


def _check_leaf_mode(leaf: dict, rows: Any, where: str) -> None:
    # What a leaf's items come back as must be what its rows can be: the
    # list-mode kinds copy raw rows and read them back as their type.
    kind, numpy = leaf["kind"], leaf["finalized"]
    if kind not in KINDS.values():
        raise DatasetError(f"{where}: unknown item kind {kind}")
    codec = leaf["codec"]
    if numpy:
        # numpy'd Columns keep the kind their items had (typed storage ones).
        if kind not in _TYPED_KINDS or codec == fmt.NONE or (leaf["open"] and codec != fmt.ARROW):
            raise DatasetError(f"{where}: numpy'd rows of kind {kind}")
        return
    if codec in fmt.STORED:
        dtype = fmt.leaf_dtype(leaf)
        plain = dtype.kind in "biufc" and dtype.isnative
        want = _LIST_KINDS.get(kind)
        if not plain or kind in (KINDS["empty"], KINDS["empty_dict"], KINDS["object"]) or (
                want is not None and (dtype != want or leaf["shape"])) or (
                kind == KINDS["scalar"] and leaf["shape"]):
            raise DatasetError(f"{where}: {dtype} rows of shape {leaf['shape']} cannot be "
                               f"list-mode items of kind {kind}")
    elif codec == fmt.VALUE and kind != KINDS["object"]:
        raise DatasetError(f"{where}: encoded values of kind {kind}")
    elif codec == fmt.NONE and kind not in (KINDS["empty"], KINDS["empty_dict"]):
        raise DatasetError(f"{where}: a leaf without data of kind {kind}")
    if leaf["open"]:
        raise DatasetError(f"{where}: a list-mode leaf of no row type")
