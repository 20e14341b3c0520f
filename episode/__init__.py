"""episode: a Cython-optimized, drop-in engine for RLlib's episode classes."""
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.single_agent_episode import SingleAgentEpisode

__all__ = ["InfiniteLookbackBuffer", "SingleAgentEpisode"]
