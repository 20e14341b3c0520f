"""episode: a Cython-optimized, drop-in engine for RLlib's episode classes."""
from episode.collector import AgentCollector
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.multi_agent_episode import MultiAgentEpisode
from episode.sampling import Sampler, VectorEpisodes
from episode.single_agent_episode import SingleAgentEpisode
from episode.views import ViewRequirement

__version__ = "0.1.0"

__all__ = ["AgentCollector", "InfiniteLookbackBuffer", "MultiAgentEpisode", "Sampler", "SingleAgentEpisode",
           "VectorEpisodes", "ViewRequirement"]
