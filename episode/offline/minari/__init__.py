"""Minari datasets to and from episodes.

`from_minari` reads a Minari dataset (HDF5, Arrow or Parquet backend) into
numpy'd SingleAgentEpisodes, straight from the storage files: each track's
rows are read as one array per episode and adopted by a Column, with no
per-step Python objects outside the infos. `to_minari` writes episodes in
Minari's on-disk layout, aside and then renamed into place, so that
`minari.load_dataset` opens the result and iterates the same data.

Neither needs Minari's DataCollector (which needs jax). h5py, pyarrow and
pillow are imported on first use: ``pip install "episode[minari]"``.

The layout read and written is described in `layout`. One module per
concern, each importing only those below it:

- `reader` (`from_minari`) and `writer` (`to_minari`);
- `hdf5` and `arrow`: the backends, each read and written; `tracks`: an
  episode as Minari's tracks, checked against the spaces (for writing);
- `pictures`: image rows as compressed pictures;
- `rows`: the checks every reader makes, the episode over checked arrays;
- `layout`: dataset ids, file names, metadata.json;
- `spaces` (Minari's space serialization, a space's leaves) and
  `libraries` (h5py, pyarrow and pillow, imported on first use).
"""
from episode.offline.minari.reader import from_minari
from episode.offline.minari.writer import to_minari

__all__ = ["from_minari", "to_minari"]
