"""episode: a Cython-optimized, drop-in engine for RLlib's episode classes."""
from episode.lookback_buffer import InfiniteLookbackBuffer

__all__ = ["InfiniteLookbackBuffer"]
