"""episode: a Cython-optimized, drop-in engine for RLlib's episode classes."""
import os as _os

try:
    from episode._column import Column as _Column  # noqa: F401 -- the compiled core
except ModuleNotFoundError as _error:
    if _error.name != "episode._column":
        raise
    raise ImportError(
        f"episode's compiled core is not in {_os.path.dirname(__file__)}: that is the source "
        f"folder, found before the installed package (the current directory, or sys.path, "
        f"holds the checkout). Run from another folder, or build the checkout in place with "
        f"`pip install -e .`.") from None

from episode.collector import AgentCollector
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.multi_agent_episode import MultiAgentEpisode
from episode.sampling import Sampler, VectorEpisodes
from episode.single_agent_episode import SingleAgentEpisode
from episode.views import ViewRequirement

__version__ = "0.1.0"

__all__ = ["AgentCollector", "InfiniteLookbackBuffer", "MultiAgentEpisode", "Sampler", "SingleAgentEpisode",
           "VectorEpisodes", "ViewRequirement"]
