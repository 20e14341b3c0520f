"""Minari's dataset layout: where datasets live, the files and names of a
dataset's folder, and its metadata.json, checked.

Layout (Minari 0.4/0.5), under ``<root>/<dataset_id>/data``:

* ``metadata.json``: ``data_format`` ("hdf5", "arrow" or "parquet"),
  ``minari_version``, ``total_episodes``, ``total_steps``, the spaces as
  JSON strings, and what the author adds (``author``, ``algorithm_name``,
  ...).
* HDF5: ``main_data.hdf5``, one group ``episode_<i>`` per episode holding
  ``observations`` (N+1 rows), ``actions``, ``rewards``, ``terminations``,
  ``truncations`` (N rows each) and ``infos`` (a dict of N+1-row arrays);
  a Dict space is a group per key, a Tuple one ``_index_<k>`` per entry.
* Arrow/Parquet: a folder ``<i>`` per episode with a ``metadata.json`` and
  one data file of N+1 rows (the N-row tracks padded by a last row); Dict
  and Tuple spaces are struct columns, Box-like ones fixed-size lists.
* Image observations (uint8 Box spaces of at least 32x32, bounds 0..255)
  are stored one compressed picture per row.

Our additions, which Minari reads past: each episode's ``id_`` (an
attribute of its HDF5 group, or a key of its Arrow/Parquet file's schema
metadata) and its extra model outputs (a group, or a struct column,
``extra_model_outputs``).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import sys
from typing import Any, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from episode.offline.minari.spaces import _Leaf, _leaves, _space_from_json


_FORMATS = ("hdf5", "arrow", "parquet")
_METADATA = "metadata.json"
_HDF5_FILE = "main_data.hdf5"
_NAMESPACE_METADATA = "namespace_metadata.json"
_EXTRAS = "extra_model_outputs"
# The layouts read and written here: Minari 0.4's and 0.5's (one layout).
_LAYOUT_VERSION = re.compile(r"0\.[45]\.\d+\Z")
_NEWEST_LAYOUT = "0.5.3"
# Minari's dataset ids: (namespace/)name(-vN); Minari writes only versioned ones.
_DATASET_ID = re.compile(r"^(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?(?:-v\d+)?\Z")
_VERSIONED_ID = re.compile(r"^(?:[-_\w][-_\w/]*[-_\w]+/)?[-_\w]+?-v\d+\Z")


def _datasets_root(root: Any = None) -> pathlib.Path:
    """Where Minari keeps datasets: `root`, else $MINARI_DATASETS_PATH, else
    ~/.minari/datasets (Minari's rule)."""
    if root is not None:
        return pathlib.Path(os.fspath(root))
    env = os.environ.get("MINARI_DATASETS_PATH")
    if env is not None:
        return pathlib.Path(env)
    return pathlib.Path.home() / ".minari" / "datasets"


def _locate(dataset: Any) -> Tuple[pathlib.Path, Optional[np.ndarray]]:
    """(the dataset's data folder, the episode indices a MinariDataset
    selects or None)."""
    minari = sys.modules.get("minari")
    if minari is not None and isinstance(dataset, minari.MinariDataset):
        return pathlib.Path(dataset.storage.data_path), np.asarray(dataset.episode_indices)
    if isinstance(dataset, os.PathLike) or (isinstance(dataset, str) and os.path.isdir(dataset)):
        path = pathlib.Path(os.fspath(dataset))
        if not path.is_dir():
            raise FileNotFoundError(f"no Minari dataset at {path}: no such folder")
        if (path / _METADATA).is_file():
            return path, None
        if (path / "data" / _METADATA).is_file():
            return path / "data", None
        raise ValueError(f"{path} is not a Minari dataset: it holds no {_METADATA} "
                         f"(nor data/{_METADATA})")
    if isinstance(dataset, str):
        if not _DATASET_ID.match(dataset):
            raise FileNotFoundError(f"{dataset!r} is neither a folder nor a Minari dataset id "
                                    f"((namespace/)name-v<version>)")
        path = _datasets_root() / dataset / "data"
        if not path.is_dir():
            raise FileNotFoundError(f"Minari dataset {dataset!r} not found locally at "
                                    f"{path.parent} (nor is it a folder)")
        if not (path / _METADATA).is_file():
            raise ValueError(f"{path} is not a Minari dataset: it holds no {_METADATA}")
        return path, None
    raise TypeError(f"a Minari dataset is a MinariDataset, a dataset id or a path, not "
                    f"{type(dataset).__name__}")


def _read_json(file: pathlib.Path) -> Any:
    try:
        with open(file, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{file}: not readable JSON ({exc})") from None


class _Metadata:
    """A dataset's checked metadata.json: the backend, counts and spaces."""

    def __init__(self, data_path: pathlib.Path):
        file = data_path / _METADATA
        raw = _read_json(file)
        if not isinstance(raw, dict):
            raise ValueError(f"{file}: Minari's metadata is a JSON object, not "
                             f"{type(raw).__name__}")
        self.file = file
        self.raw = raw
        fmt = raw.get("data_format")
        if fmt not in _FORMATS:
            raise ValueError(f"{file}: data_format {fmt!r:.50} is not one of Minari's "
                             f"backends {_FORMATS}")
        self.format = fmt
        version = raw.get("minari_version")
        if not isinstance(version, str) or not _LAYOUT_VERSION.match(version):
            raise ValueError(f"{file}: minari_version {version!r:.50}: this reader knows the "
                             f"layout of Minari 0.4 and 0.5 datasets")
        for key in ("total_episodes", "total_steps"):
            value = raw.get(key)
            if type(value) is not int or value < 0:
                raise ValueError(f"{file}: {key} is {value!r:.50}, not a count")
        self.total_episodes = raw["total_episodes"]
        self.total_steps = raw["total_steps"]
        # Minari 0.5.4's choice: image spaces stored as JPEG pictures (the
        # default) or as arrays of numbers.
        self.pictures = raw.get("jpeg_encoding", True)
        if not isinstance(self.pictures, bool):
            raise ValueError(f"{file}: jpeg_encoding is {self.pictures!r:.50}, not true or "
                             f"false")
        self.observation_space = self._space("observation_space")
        self.action_space = self._space("action_space")
        self.obs_leaves = self._leaves_of("observation_space", self.observation_space)
        self.action_leaves = self._leaves_of("action_space", self.action_space)
        self.flat_obs = self.obs_leaves[0].path == ()
        self.flat_actions = self.action_leaves[0].path == ()

    def _space(self, key: str) -> gym.Space:
        # (Minari falls back to making the env its env_spec names: reading
        # a file never runs code here, so the space must be written down.)
        text = self.raw.get(key)
        if not isinstance(text, str):
            raise ValueError(f"{self.file}: no {key} (a JSON string in Minari's layout)")
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{self.file}: {key} is not JSON ({exc})") from None
        return _space_from_json(obj, f"{self.file}: {key}")

    def _leaves_of(self, key: str, space: gym.Space) -> List[_Leaf]:
        try:
            return _leaves(space, pictures=self.pictures)
        except ValueError as exc:
            raise ValueError(f"{self.file}: {key}: {exc}") from None
