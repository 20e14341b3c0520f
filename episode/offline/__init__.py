"""Recorded experience: episodes to and from datasets.

`EpisodeWriter` / `write_episodes` write episodes into a dataset folder in
our columnar format (Parquet or memory-mapped Arrow IPC files: typed columns
per track, one row per timestep, an episode table per written part; see
`episode.offline.format`). `read_episodes` opens such a folder, or one of
RLlib's recordings, as an `EpisodeDataset` of episodes built over the
files' columns. `from_minari` / `to_minari` read and write Minari's
datasets.

Importing this package imports neither pyarrow nor msgpack; the functions
that read or write files do, on first use.
"""
from episode.offline.dataset import EpisodeDataset, read_episodes
from episode.offline.format import DatasetError
from episode.offline.minari import from_minari, to_minari
from episode.offline.writer import EpisodeWriter, write_episodes

__all__ = ["DatasetError", "EpisodeDataset", "EpisodeWriter", "from_minari", "read_episodes",
           "to_minari", "write_episodes"]
