"""RLlib's offline API on our engine (see `episode.rllib.offline.prelearner`)."""
from episode.rllib.offline.prelearner import (NATIVE_WRITE_METHOD, OfflineData,
                                              OfflineMultiAgentEnvRunner, OfflinePreLearner,
                                              OfflineSingleAgentEnvRunner)

__all__ = ["NATIVE_WRITE_METHOD", "OfflineData", "OfflineMultiAgentEnvRunner",
           "OfflinePreLearner", "OfflineSingleAgentEnvRunner"]
