"""Minari datasets to and from episodes (`from_minari`, `to_minari`)."""
from episode.offline.minari.arrow import from_minari, to_minari

__all__ = ["from_minari", "to_minari"]
