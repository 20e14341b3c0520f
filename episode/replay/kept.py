"""A replay buffer kept in a folder: `buffer.save(folder)` writes it there,
`EpisodeReplayBuffer.open(folder)` makes it again in any later process,
its rows memory-mapped from the folder's files instead of read into memory.

A buffer is one or more Stores, by name: a single-agent buffer's own
("store"), and a multi-agent buffer's env steps' ("store") and one per
module (("module", module_id)). The folder holds one file per block and
numeric leaf of each store (`rows-*.bin`: the block's rows, raw, as the
Store keeps them; a frame-stacked leaf's rows are its frames' numbers),
one per chunk of each frame pool (`frames-*.bin`: the chunk's frames,
raw; bytes no frame was written to are zeros), `buffer.meta` (everything
else: each Store's runs, episodes, layout, final rows and priority trees
and each frame pool's numbering, the buffer's counters, rng, metrics and,
multi-agent, its episodes; msgpack data (episode.values: no pickle, nothing
read from it runs code) behind a header of a magic string, the format
version, the payload's length and its SHA-256) and `buffer.lock`.
The metadata keeps the buffer's own store at its top (`store`, `blocks`:
all a buffer of one store without frames has, as in the first saves),
its frame pools under `frames` and the other stores under `stores`.

Writing: each file goes to a temporary name, is fsync'd and renamed; the
metadata is renamed last, so a reader sees the previous save or this one,
never a mix. A file that a buffer opened from this folder maps, and that
is still the folder's (same inode: files are never changed once written),
is referenced again instead of written again (a frame pool's last chunk,
which the opened buffer writes on into a copy of its own, is written
anew); files only the previous save referenced are removed after the new
metadata is in place. A save holds the folder's lock (exclusive)
throughout; an open holds it shared while it reads.

Reading: the metadata's magic, version, length and checksum are checked
before it is decoded (as data: numbers, strings, containers, arrays, spaces), each file's existence and size before it is
mapped (read-only), and every index of each Store's state, and every
frame number its rows hold, against those sizes before anything is built
(episode._keep). `verify=True` also checks each file's CRC-32 (reading
every row once).

A reopened buffer is independent of the folder: its rows stay mapped
read-only (the files are never written again), new rows go to new files of
its own (removed from the folder at once, as with `storage=`), and two
buffers opened from one folder share the files and nothing else. Saving
one of them into the folder replaces the folder's buffer; the other keeps
reading its mappings (a removed file stays readable while mapped) and
writes its blocks anew if it saves there later.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pickle
import secrets
import struct
import warnings
import zlib
from typing import Any, Dict, List, Optional

import numpy as np

from episode import values
from episode.replay import kinds

try:
    import fcntl
except ImportError:         # (Windows: no advisory locks; saves are not guarded)
    fcntl = None  # type: ignore[assignment]

# 2: the metadata is msgpack (episode.values); 1 was a pickle, which
# convert_v1() rewrites for a folder its user trusts.
FORMAT_VERSION = 2
MAGIC = b"episode replay buffer\n"
_HEADER = struct.Struct("<IQ32s")     # version, payload bytes, SHA-256 of the payload
HEADER_BYTES = len(MAGIC) + _HEADER.size
# A buffer's own state keeps its arrays in a file of their own
# (`objects-*.bin`) where they come to this many bytes.
OBJECTS_APART = 1 << 20
META_NAME = "buffer.meta"
LOCK_NAME = "buffer.lock"
# The metadata's keys: the buffer's own store's at the top (all a buffer
# of one store without frame stacks has), its frame pools and the buffer's
# other stores where it has them.
_META_KEYS = {"kind", "settings", "buffer", "store", "blocks"}
_MORE_KEYS = {"frames", "stores", "objects"}
_STORE_KEYS = {"name", "store", "blocks", "frames"}


# -- the folder -------------------------------------------------------------------------


def _folder(folder) -> str:
    if isinstance(folder, bytes):
        folder = os.fsdecode(folder)
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"a folder is a path (str or os.PathLike), not {type(folder).__name__}")
    return os.fsdecode(os.fspath(folder))


@contextlib.contextmanager
def _locked(folder: str, exclusive: bool):
    # flock() on the folder's lock file: exclusive for a save, shared for an
    # open (a folder the user cannot write is opened without it: nothing
    # can save into it either).
    path = os.path.join(folder, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if exclusive:
            raise
        fd = -1
    try:
        if fd >= 0 and fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if fd >= 0:
            os.close(fd)         # (releases the lock)


@contextlib.contextmanager
def _all_or_nothing(folder: str, written: List[str]):
    # The files named in `written` (by the block) are removed if the block
    # fails, and the folder's names synced if it does not.
    try:
        yield
    except BaseException:
        for name in written:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        raise
    _sync_folder(folder)


def _write_file(folder: str, name: str, chunks) -> int:
    """Writes `chunks` (bytes-like) to folder/name whole or not at all (a
    temporary name, fsync, rename); returns their CRC-32."""
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    crc = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                crc = zlib.crc32(chunk, crc)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return crc


def _sync_folder(folder: str) -> None:
    # The renames themselves on disk (POSIX: fsync of the directory).
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _entries(meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The saved stores of a (checked) metadata dict, the buffer's own
    first: each a dict of its `name`, `store` (state), `blocks` and
    `frames` (None, or per leaf None or a frame pool's numbering and
    chunk files)."""
    first = {"name": "store", "store": meta["store"], "blocks": meta["blocks"],
             "frames": meta.get("frames")}
    return [first] + list(meta.get("stores", ()))


def _file_names(meta: Dict[str, Any]) -> set:
    names = {meta["objects"]["file"][1]} if "objects" in meta else set()
    for entry in _entries(meta):
        names.update(leaf[1] for block in entry["blocks"] for leaf in block["leaves"]
                     if type(leaf) is tuple)
        for pool in entry["frames"] or ():
            if pool is not None:
                names.update(chunk[1] for chunk in pool["chunks"])
    return names


# -- saving ------------------------------------------------------------------------------


def save(buffer, folder) -> None:
    """buffer.save(folder): see the module docstring."""

    folder = _folder(folder)
    os.makedirs(folder, exist_ok=True)
    with _locked(folder, exclusive=True):
        # What the folder holds now: replaced, so it must be ours and whole
        # (a damaged or foreign metadata file is not overwritten).
        previous = _read_meta(folder) if os.path.lexists(os.path.join(folder, META_NAME)) \
            else None
        for name in os.listdir(folder):
            if name.startswith(".") and name.endswith(".tmp") and (
                    name.startswith((".rows-", ".frames-", ".objects-", f".{META_NAME}."))):
                with contextlib.suppress(OSError):       # (a save that died half-way)
                    os.unlink(os.path.join(folder, name))
        token = secrets.token_hex(6)
        written: List[str] = []
        # (Nothing of a save that fails stays, e.g. one of an object that is
        # not data: the folder holds the previous save as it was.)
        with _all_or_nothing(folder, written):
            entries = [_saved_store(folder, f"{token}-" if s == 0 else f"{token}-s{s}-",
                                    name, store, written)
                       for s, (name, store) in enumerate(buffer._kept_stores())]
            settings = dict(buffer._settings())
            settings.pop("storage", None)
            # (The buffer's own store at the top, as a buffer of one store
            # without frames has always been saved; any others after it.)
            first = entries[0]
            meta = {"kind": kinds.kind_of(buffer), "settings": settings,
                    "buffer": type(buffer)._plain_kept(buffer._kept_state()),
                    "store": first["store"], "blocks": first["blocks"]}
            _objects_to_file(meta, folder, token, written)
            if first["frames"] is not None:
                meta["frames"] = first["frames"]
            if len(entries) > 1:
                meta["stores"] = entries[1:]
            _sync_folder(folder)     # (the files' names before the metadata's)
            _write_meta(folder, meta)
        if previous is not None:
            for name in _file_names(previous) - _file_names(meta):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(folder, name))


def _saved_store(folder: str, prefix: str, name: Any, store, written: list) -> Dict[str, Any]:
    # One store's entry of the metadata, its rows and frames written to
    # files (or the folder's files it maps referenced again).
    from episode._keep import frame_pools, store_state

    state, blocks = store_state(store)
    state = _plain_store_state(state)
    saved_blocks = []
    for k, block in enumerate(blocks):
        leaves: List[Any] = []
        for leaf, data in enumerate(block["leaves"]):
            if data is None or type(data) is list:
                leaves.append(data)
                continue
            memory, mapped = data
            leaves.append(_reusable(mapped, folder, len(memory)) or
                          _written(folder, f"rows-{prefix}{k}-{leaf}.bin", [memory], written))
        saved_blocks.append({"size": block["size"], "infos": block["infos"],
                             "leaf_of_row": block["leaf_of_row"], "leaves": leaves})
    pools = frame_pools(store)
    frames = None
    if any(pool is not None for pool in pools):
        frames = [None if pool is None else _saved_frames(folder, prefix, leaf, *pool, written)
                  for leaf, pool in enumerate(pools)]
    return {"name": name, "store": state, "blocks": saved_blocks, "frames": frames}


def _saved_frames(folder: str, prefix: str, leaf: int, numbering: Dict[str, int],
                  chunks: list, written: list) -> Dict[str, Any]:
    # A frame pool's chunks as files: the frames written into each, zeros
    # for the rest (a chunk's unwritten bytes are whatever memory held).
    size = 1 << numbering["chunk_shift"]
    frame_bytes = numbering["frame_bytes"]
    files = []
    for c, chunk in enumerate(chunks):
        start = (numbering["first_chunk"] + c) * size
        lo = min(size, max(numbering["head"], start) - start)
        hi = max(lo, min(numbering["tail"], start + size) - start)
        reused = _reusable(chunk if isinstance(chunk, np.memmap) else None, folder,
                           chunk.nbytes)
        if reused is not None:
            files.append(reused)
            continue
        rows = memoryview(chunk).cast("B")
        zeros = bytes(frame_bytes * max(lo, size - hi))
        files.append(_written(folder, f"frames-{prefix}{leaf}-{c}.bin", [
            zeros[:lo * frame_bytes], rows[lo * frame_bytes:hi * frame_bytes],
            zeros[:(size - hi) * frame_bytes]], written))
    return {"numbering": dict(numbering), "chunks": files}


def _write_meta(folder: str, meta: Dict[str, Any]) -> None:
    # The metadata file: the header, then the metadata as data.
    try:
        payload = values.pack(meta)
    except TypeError as error:
        raise TypeError(f"the replay buffer cannot be saved: {error} (a saved buffer keeps "
                        f"data only, so that opening it runs no code)") from None
    header = MAGIC + _HEADER.pack(FORMAT_VERSION, len(payload),
                                  hashlib.sha256(payload).digest())
    _write_file(folder, META_NAME, [header, payload])


def _plain_store_state(state: Dict[str, Any]) -> Dict[str, Any]:
    # A Store's state as data: its episodes' metas (EpisodeMeta objects,
    # shared between episodes where equal) as a table of their fields and
    # each slot's index in it (None: a free slot).
    table: List[list] = []
    index: Dict[int, int] = {}
    slots = []
    for meta in state["meta"]:
        if meta is None:
            slots.append(None)
            continue
        if id(meta) not in index:
            index[id(meta)] = len(table)
            table.append([getattr(meta, name) for name in _META_FIELDS])
            table[-1][_META_FIELDS.index("extra_keys")] = list(meta.extra_keys)
        slots.append(index[id(meta)])
    return dict(state, meta=slots, metas=table)


def _store_state(state: Any, meta_path: str) -> Dict[str, Any]:
    # _plain_store_state's state back (its metas EpisodeMeta objects again).
    from episode._replay import EpisodeMeta

    if type(state) is not dict or type(state.get("metas")) is not list or \
            type(state.get("meta")) is not list:
        raise ValueError(f"{meta_path} does not describe a replay buffer's episodes")
    metas = []
    for fields in state["metas"]:
        if type(fields) is not list or len(fields) != len(_META_FIELDS) or \
                type(fields[5]) is not list or type(fields[7]) is not bool or \
                not (fields[6] is None or type(fields[6]) is dict):
            raise ValueError(f"{meta_path} does not describe a replay buffer's episodes")
        fields = list(fields)
        fields[5] = tuple(fields[5])
        metas.append(EpisodeMeta(*fields))
    slots = []
    for k in state["meta"]:
        if k is not None and (type(k) is not int or not 0 <= k < len(metas)):
            raise ValueError(f"{meta_path} names episode meta {k!r}, which it does not hold")
        slots.append(None if k is None else metas[k])
    out = dict(state, meta=slots)
    del out["metas"]
    return out


# EpisodeMeta's fields, in its constructor's order.
_META_FIELDS = ("agent_id", "module_id", "multi_agent_episode_id", "observation_space",
                "action_space", "extra_keys", "custom_data", "defaultdict_extras")


def _objects_to_file(meta: Dict[str, Any], folder: str, token: str, written: list) -> None:
    # The buffer's own state with its larger arrays apart: their bytes in a
    # file (`objects-*.bin`, each at a multiple of 64 bytes) mapped at open
    # and read in place, so a multi-agent buffer's episodes are not read
    # and hashed with the metadata. (A state whose arrays are small stays
    # in the metadata as it is.)
    arrays: list = []
    try:
        inner = values.pack(meta["buffer"], apart=arrays)
    except TypeError as error:
        raise TypeError(f"the replay buffer cannot be saved: {error} (a saved buffer keeps "
                        f"data only, so that opening it runs no code)") from None
    if sum(array.nbytes for array in arrays) < OBJECTS_APART:
        return
    pieces, layout = values.kept_apart(arrays)
    meta["buffer"] = inner
    meta["objects"] = {"file": _written(folder, f"objects-{token}.bin", pieces, written),
                       "buffers": layout}


def _objects_from_file(folder: str, meta_path: str, meta: Dict[str, Any],
                       verify: bool) -> Dict[str, Any]:
    # The buffer's own state: as it is, or decoded over its mapped arrays.
    if "objects" not in meta:
        return meta["buffer"]
    entry = meta["objects"]["file"]
    data = _mapped_file(folder, meta_path, entry, np.dtype(np.uint8), (entry[2],), verify)
    view = memoryview(data)
    buffers = []
    for offset, nbytes in meta["objects"]["buffers"]:
        if not (0 <= offset and 0 <= nbytes and offset + nbytes <= len(view)):
            raise ValueError(f"{meta_path} places an array at bytes {offset} to "
                             f"{offset + nbytes} of {entry[1]}, of {len(view)} bytes")
        buffers.append(view[offset:offset + nbytes])
    try:
        state = values.unpack(meta["buffer"], apart=buffers)
    except ValueError as error:
        raise ValueError(f"{meta_path} cannot be read: {error}") from None
    if type(state) is not dict:
        raise ValueError(f"{meta_path} does not describe a replay buffer's state")
    return state


def _written(folder: str, name: str, chunks: list, written: list) -> tuple:
    # The saved leaf ("file", name, bytes, crc) of `chunks` written to a file
    # (its name added to `written`).
    crc = _write_file(folder, name, chunks)
    written.append(name)
    return ("file", name, sum(len(c) for c in chunks), crc)


def _reusable(mapped, folder: str, nbytes: int) -> Optional[tuple]:
    """The saved leaf ("file", name, bytes, crc) of rows a buffer opened
    from `folder` maps, where the folder still holds that very file."""
    kept = getattr(mapped, "_kept", None) if mapped is not None else None
    if kept is None:
        return None
    kept_folder, name, dev, ino, crc = kept
    try:
        if not os.path.samefile(kept_folder, folder):
            return None
        st = os.stat(os.path.join(folder, name))
    except OSError:
        return None
    if (st.st_dev, st.st_ino) != (dev, ino) or st.st_size != nbytes:
        return None
    return ("file", name, nbytes, crc)


# -- opening -----------------------------------------------------------------------------


def _checked_payload(path: str, data: bytes) -> tuple:
    # (version, payload) of a metadata file's bytes, its length and checksum
    # checked.
    if len(data) < HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {len(data)} bytes, shorter than its header")
    version, length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = memoryview(data)[HEADER_BYTES:]
    if len(payload) != length:
        raise ValueError(f"{path} is truncated or overlong: {len(payload)} bytes of metadata, "
                         f"its header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError(f"{path} is damaged: its checksum does not match its contents")
    return version, payload


def _read_meta(folder: str) -> Dict[str, Any]:
    """The folder's metadata, checked (FileNotFoundError where there is
    none, ValueError naming the file for anything not whole and ours)."""
    path = os.path.join(folder, META_NAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no saved replay buffer in {folder!r} "
                                f"({META_NAME} is missing)", path) from None
    if not data.startswith(MAGIC):
        raise ValueError(f"{path} is not a saved replay buffer's metadata")
    version, payload = _checked_payload(path, data)
    if version == 1:
        raise ValueError(
            f"{path} is of format version 1, whose metadata is a pickle: opening it could run "
            f"code. If you trust this folder, convert it once with "
            f"episode.replay.kept.convert_v1({folder!r}); this version of episode reads "
            f"version {FORMAT_VERSION}")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} is of format version {version}; this version of episode "
                         f"reads version {FORMAT_VERSION}")
    try:
        meta = values.unpack(payload)
    except ValueError as error:
        raise ValueError(f"{path} cannot be read: {error}") from None
    if type(meta) is not dict or not _META_KEYS <= set(meta) <= _META_KEYS | _MORE_KEYS or \
            type(meta["settings"]) is not dict or type(meta.get("stores", [])) is not list or \
            type(meta["buffer"]) is not (bytes if "objects" in meta else dict):
        raise ValueError(f"{path} does not describe a replay buffer")
    if "objects" in meta:
        objects = meta["objects"]
        if type(objects) is not dict or set(objects) != {"file", "buffers"} or \
                type(objects["buffers"]) is not list or not all(
                    type(b) is tuple and len(b) == 2 and all(type(n) is int for n in b)
                    for b in objects["buffers"]):
            raise ValueError(f"{path} does not describe a replay buffer's objects")
        _check_file(path, objects["file"], "objects-")
    for k, entry in enumerate(meta.get("stores", ())):
        if type(entry) is not dict or set(entry) != _STORE_KEYS:
            raise ValueError(f"{path} does not describe the replay buffer's store {k + 1}")
    for entry in _entries(meta):
        _check_entry(path, entry)
    return meta


def _check_entry(path: str, entry: Dict[str, Any]) -> None:
    # A saved store's entry: its state a dict, its blocks and frames lists
    # naming files of ours (their sizes and contents are checked at open).
    if type(entry["store"]) is not dict or type(entry["blocks"]) is not list:
        raise ValueError(f"{path} does not describe a replay buffer's store")
    for block in entry["blocks"]:
        if type(block) is not dict or type(block.get("leaves")) is not list:
            raise ValueError(f"{path} does not describe a replay buffer's blocks")
        for leaf in block["leaves"]:
            if type(leaf) is tuple:
                _check_file(path, leaf, "rows-")
    frames = entry["frames"]
    if frames is None:
        return
    if type(frames) is not list:
        raise ValueError(f"{path} does not describe a replay buffer's frames")
    for pool in frames:
        if pool is None:
            continue
        if type(pool) is not dict or set(pool) != {"numbering", "chunks"} or \
                type(pool["numbering"]) is not dict or type(pool["chunks"]) is not list:
            raise ValueError(f"{path} does not describe a replay buffer's frames")
        for chunk in pool["chunks"]:
            _check_file(path, chunk, "frames-")


def _check_file(path: str, leaf: Any, prefix: str) -> None:
    if not (type(leaf) is tuple and len(leaf) == 4 and leaf[0] == "file"
            and type(leaf[1]) is str and leaf[1] == os.path.basename(leaf[1])
            and leaf[1].startswith(prefix) and type(leaf[2]) is int and leaf[2] >= 0
            and type(leaf[3]) is int):
        raise ValueError(f"{path} names a {prefix[:-1]} file {leaf!r} that is not one")


def open_buffer(cls, folder, verify: bool = False):
    """EpisodeReplayBuffer.open(folder): see there."""
    from episode._keep import build_store

    folder = _folder(folder)
    if not os.path.isdir(folder):
        raise (NotADirectoryError if os.path.exists(folder) else FileNotFoundError)(
            errno.ENOTDIR if os.path.exists(folder) else errno.ENOENT,
            "no saved replay buffer there", folder)
    with _locked(folder, exclusive=False):
        meta = _read_meta(folder)
        meta_path = os.path.join(folder, META_NAME)
        saved = kinds.by_name().get(meta["kind"]) if type(meta["kind"]) is str else None
        if saved is None:
            raise ValueError(f"{meta_path} holds a {meta['kind']!r}, no buffer of ours")
        if kinds.kind_of_class(cls) is saved:
            target = cls
        elif issubclass(saved, cls):
            target = saved
        else:
            raise TypeError(f"{folder!r} holds a {saved.__name__}, not a {cls.__name__} "
                            f"(open it with {saved.__name__}.open())")
        # Every file mapped and checked against the metadata before anything
        # is built.
        entries = _entries(meta)
        mapped = [_mapped_store(folder, meta_path, entry, verify) for entry in entries]
        buffer_state = _objects_from_file(folder, meta_path, meta, verify)
        try:
            with warnings.catch_warnings():      # (an unknown one is refused below)
                warnings.simplefilter("ignore")
                buffer = target(**meta["settings"], storage=folder)
        except (TypeError, ValueError, AssertionError, OverflowError, MemoryError) as error:
            # (MemoryError: a capacity past the priority trees' limit.)
            raise ValueError(f"{meta_path} holds settings no buffer takes: {error!r}") \
                from error
        if set(meta["settings"]) != set(buffer._settings()) - {"storage"}:
            raise ValueError(f"{meta_path} holds settings {sorted(meta['settings'])}, not a "
                             f"{saved.__name__}'s")
        try:
            stores = {}
            for entry, (blocks, pools) in zip(entries, mapped):
                store = buffer._new_kept_store(entry["name"], folder)
                build_store(store, _store_state(entry["store"], meta_path), blocks, pools)
                stores[entry["name"]] = store
            if len(stores) != len(entries):
                raise ValueError("two saved stores have one name")
            buffer._adopt_kept_stores(stores)
            buffer._restore_kept(buffer_state)
        except (TypeError, ValueError, KeyError, IndexError, OverflowError,
                MemoryError) as error:
            # (MemoryError: sizes in the state no store could have had.)
            raise ValueError(f"{meta_path} does not describe a replay buffer: {error}") \
                from error
    return buffer


def _mapped_store(folder: str, meta_path: str, entry: Dict[str, Any], verify: bool) -> tuple:
    # A saved store's blocks and frame pools for build_store(), their files
    # mapped read-only, each checked first (there, of the size the
    # metadata says, of its rows).
    from episode._keep import plain_dtype

    state = entry["store"]
    dtypes, shapes = state.get("dtypes"), state.get("shapes")
    if type(dtypes) is not list or type(shapes) is not list or len(dtypes) != len(shapes):
        raise ValueError(f"{meta_path} does not describe a replay buffer's leaves")
    # (The rows are mapped as numpy's own dtypes, never as unpickled ones.)
    dtypes = [None if d is None else plain_dtype(d) for d in dtypes]
    frames = entry["frames"]
    if frames is not None and len(frames) != len(dtypes):
        raise ValueError(f"{meta_path} does not describe a replay buffer's frames")
    # The stored rows' type per leaf: a frame-stacked leaf's are its frames'
    # numbers (int64, `stack` a row).
    stored = list(zip(dtypes, shapes))
    for leaf, pool in enumerate(frames or ()):
        if pool is not None:
            stack = pool["numbering"].get("stack")
            if type(stack) is not int or not 2 <= stack <= 1024:
                raise ValueError(f"{meta_path} gives leaf {leaf} a frame stack of {stack!r}")
            stored[leaf] = (np.dtype(np.int64), (stack,))
    blocks = [_mapped_block(folder, meta_path, block, stored, verify)
              for block in entry["blocks"]]
    pools = None if frames is None else [
        None if pool is None else _mapped_frames(folder, meta_path, pool, verify)
        for pool in frames]
    return blocks, pools


def _mapped_block(folder: str, meta_path: str, block: Dict[str, Any], stored: list,
                  verify: bool) -> Dict[str, Any]:
    size = block.get("size")
    leaves = block["leaves"]
    if type(size) is not int or not 0 <= size < (1 << 31) or len(leaves) != len(stored):
        raise ValueError(f"{meta_path} does not describe a replay buffer's blocks")
    out = []
    for leaf, entry in enumerate(leaves):
        if type(entry) is not tuple:
            out.append(entry)
            continue
        dtype, shape = stored[leaf]
        if dtype is None or type(shape) is not tuple or \
                not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{meta_path} gives no row type for {entry[1]}")
        out.append(_mapped_file(folder, meta_path, entry, dtype, (size,) + shape, verify))
    return {"size": size, "infos": block.get("infos"), "leaf_of_row": block.get("leaf_of_row"),
            "leaves": out}


def _mapped_frames(folder: str, meta_path: str, pool: Dict[str, Any], verify: bool) -> tuple:
    # A frame pool's numbering and its chunk files, mapped (the numbering
    # itself is checked by the pool that takes them).
    numbering = pool["numbering"]
    shift, frame_bytes = numbering.get("chunk_shift"), numbering.get("frame_bytes")
    if type(shift) is not int or type(frame_bytes) is not int or not 0 <= shift <= 40 or \
            not 0 < frame_bytes < (1 << 40) or (frame_bytes << shift) >= (1 << 40):
        raise ValueError(f"{meta_path} gives frame chunks of {shift!r}, {frame_bytes!r}")
    chunks = [_mapped_file(folder, meta_path, entry, np.dtype(np.uint8),
                           (1 << shift, frame_bytes), verify) for entry in pool["chunks"]]
    return (dict(numbering), chunks)


def _mapped_file(folder: str, meta_path: str, entry: tuple, dtype: np.dtype, shape: tuple,
                 verify: bool) -> np.ndarray:
    # One file of rows (or frames) mapped read-only as `shape` of `dtype`,
    # after checking that it is there and of the size the metadata says.
    _, name, nbytes, crc = entry
    path = os.path.join(folder, name)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes != expected:
        raise ValueError(f"{meta_path} gives {name} {nbytes} bytes; {shape[0]} rows of "
                         f"{dtype} {shape[1:]} are {expected}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "a file of the saved buffer is missing",
                                path) from None
    if st.st_size != nbytes:
        raise ValueError(f"{path} is {'truncated' if st.st_size < nbytes else 'overlong'}"
                         f": {st.st_size} bytes, the buffer saved {nbytes}")
    if nbytes == 0:
        rows = np.zeros(shape, dtype)
        rows.flags.writeable = False
        return rows
    rows = np.memmap(path, dtype=dtype, mode="r", shape=shape)
    if verify and zlib.crc32(rows) != crc:
        raise ValueError(f"{path} is damaged: its CRC-32 does not match the saved one")
    rows._kept = (folder, name, st.st_dev, st.st_ino, crc)
    return rows


# -- format version 1 --------------------------------------------------------------------


def convert_v1(folder) -> None:
    """Rewrites a buffer saved by an earlier version of episode (format
    version 1, whose metadata is a pickle) in the current format, in place:
    its metadata (and its objects file) are written anew, its rows' and
    frames' files are kept. Unpickling runs whatever code the pickle names:
    convert only a folder you trust (one you saved yourself)."""

    folder = _folder(folder)
    path = os.path.join(folder, META_NAME)
    with _locked(folder, exclusive=True):
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC):
            raise ValueError(f"{path} is not a saved replay buffer's metadata")
        version, payload = _checked_payload(path, data)
        if version != 1:
            raise ValueError(f"{path} is of format version {version}, not 1: nothing to convert")
        meta = pickle.loads(payload)     # (trusted: the caller vouches for the folder)
        kind = kinds.by_name().get(meta.get("kind")) if type(meta) is dict else None
        if kind is None:
            raise ValueError(f"{path} does not describe a replay buffer of ours")
        state = meta["buffer"]
        old_objects = meta.pop("objects", None)
        if old_objects is not None:
            entry = old_objects["file"]
            mapped = np.memmap(os.path.join(folder, entry[1]), np.uint8, mode="r",
                               shape=(entry[2],)) if entry[2] else np.zeros(0, np.uint8)
            view = memoryview(mapped)
            state = pickle.loads(state, buffers=[view[offset:offset + nbytes]
                                                 for offset, nbytes in old_objects["buffers"]])
        meta["buffer"] = kind._plain_kept(state)
        meta["store"] = _plain_store_state(meta["store"])
        for entry in meta.get("stores", ()):
            entry["store"] = _plain_store_state(entry["store"])
        written: List[str] = []
        with _all_or_nothing(folder, written):
            _objects_to_file(meta, folder, secrets.token_hex(6), written)
            _sync_folder(folder)
            _write_meta(folder, meta)
        if old_objects is not None and old_objects["file"][1] not in written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, old_objects["file"][1]))
