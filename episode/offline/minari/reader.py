"""`from_minari`: a Minari dataset's episodes, read by its backend's reader."""
from __future__ import annotations

import pathlib
from typing import Any, Iterable, List, Optional

import numpy as np

from episode.offline.minari.arrow import _ArrowReader
from episode.offline.minari.hdf5 import _HDF5Reader
from episode.offline.minari.layout import _locate, _Metadata
from episode.offline.minari.rows import _Damaged
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["from_minari"]


def _indices(selected: Optional[np.ndarray], episode_indices: Any, total: int,
             file: pathlib.Path) -> List[int]:
    if episode_indices is None:
        episode_indices = range(total) if selected is None else selected
    if isinstance(episode_indices, (str, bytes)) or not isinstance(episode_indices, Iterable):
        raise TypeError(f"episode_indices are a sequence of ints, not "
                        f"{type(episode_indices).__name__}")
    out = []
    for i in episode_indices:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"an episode index is an int, not {type(i).__name__}")
        if not 0 <= i < total:
            raise IndexError(f"episode {int(i)} is not in {file.parent}, which holds "
                             f"{total} episodes")
        out.append(int(i))
    return out


def from_minari(dataset: Any, *, episode_indices: Optional[Iterable[int]] = None
                ) -> List[SingleAgentEpisode]:
    """The episodes of a Minari dataset, as numpy'd SingleAgentEpisodes.

    Args:
        dataset: a ``minari.MinariDataset`` (its selected episodes), a
            dataset id (found as ``minari.load_dataset`` finds it: under
            $MINARI_DATASETS_PATH, else ~/.minari/datasets), or the path of
            a dataset's folder (or of its ``data`` folder).
        episode_indices: the stored episodes to read, in this order (all of
            them, or the MinariDataset's, by default).

    Each episode holds the stored observations (N+1 rows), actions, rewards
    and infos (one dict per observation, as the env gave them), ends
    terminated/truncated as its last step does, and keeps the id it was
    written with by `to_minari` (else the episode's index, as a string).
    The tracks are arrays read from the storage files in one piece (Box-like
    rows, Discrete values, each leaf of a Dict/Tuple space), pictures are
    decoded, spaces come from the dataset's metadata.

    Raises:
        FileNotFoundError: no such dataset.
        ValueError: a folder that is not a Minari dataset, a version or
            backend whose layout is unknown, or a storage file that is
            damaged or does not match the dataset's spaces (the error names
            the file and the episode).
        ImportError: h5py/pyarrow/pillow missing (``pip install "episode[minari]"``).
    """
    data_path, selected = _locate(dataset)
    meta = _Metadata(data_path)
    indices = _indices(selected, episode_indices, meta.total_episodes, meta.file)
    reader = (_HDF5Reader if meta.format == "hdf5" else _ArrowReader)(data_path, meta)
    episodes = []
    try:
        episodes.extend(reader.episodes(indices))
    except _Damaged as exc:
        raise ValueError(f"{reader.file}: episode {reader.index}: {exc}") from None
    except (ValueError, TypeError, AssertionError, KeyError, OSError, RuntimeError) as exc:
        # h5py and the episode's own checks: the file does not hold a
        # well-formed episode.
        raise ValueError(f"{reader.file}: episode {reader.index}: {type(exc).__name__}: "
                         f"{exc}") from None
    finally:
        reader.close()
    if episode_indices is None and selected is None:
        steps = sum(len(e) for e in episodes)
        if steps != meta.total_steps:
            raise ValueError(f"{meta.file}: total_steps is {meta.total_steps}, but the "
                             f"episodes hold {steps} steps")
    return episodes
