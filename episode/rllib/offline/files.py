"""Where the offline data is: the filesystems RLlib's ``input_filesystem``
and ``output_filesystem`` settings name, paths and URIs on them, the input
files, and a native dataset (our format) among them."""
from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from episode._extras import rllib_missing

try:
    import pyarrow.fs as pafs
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.rllib.offline") from e


# The column of episode numbers that stands for a native dataset in Ray
# Data (each prelearner builds those episodes from the files).
NATIVE_COLUMN = "__episode_index"


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


def _input_paths(config: Any) -> list:
    """config.input_ as a list of paths (RLlib takes one or a list)."""
    paths = config.input_ if isinstance(config.input_, (list, tuple)) else [config.input_]
    return [os.fspath(p) for p in paths]
