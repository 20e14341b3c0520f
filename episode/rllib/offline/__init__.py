"""RLlib's offline API on our engine: recording with ``output=`` and
reading with ``input_=``.

`episode.rllib.install()` puts these classes in place of RLlib 2.60's:

- `OfflineSingleAgentEnvRunner` (and `OfflineMultiAgentEnvRunner`, which
  RLlib lacks): RLlib's recording runner on our `SingleAgentEnvRunner`
  (`MultiAgentEnvRunner`), in `recording` (its docstring names the formats
  and options);
- `OfflineData` (`data`) and `OfflinePreLearner` (`prelearner`): RLlib's
  reading, for RLlib's two recorded formats and our native one.

`files` holds what both halves share: the filesystems, paths and input
files RLlib's settings name. Each module imports only those below it:
`recording` and `data` over `prelearner`, all of them over `files`.

Classes a user passes as ``offline_data_class`` or ``prelearner_class``
keep working: subclasses of these (or of RLlib's, which RLlib's config
checks accept too) run on our episodes.

Importing this package imports ray, pyarrow and torch.
"""
from episode.rllib.offline.data import OfflineData
from episode.rllib.offline.prelearner import OfflinePreLearner
from episode.rllib.offline.recording import (NATIVE_WRITE_METHOD, OfflineMultiAgentEnvRunner,
                                             OfflineSingleAgentEnvRunner)

__all__ = ["NATIVE_WRITE_METHOD", "OfflineData", "OfflineMultiAgentEnvRunner",
           "OfflinePreLearner", "OfflineSingleAgentEnvRunner"]

# The classes keep the package's name as their module, as before it was
# split: RLlib's configs and checkpoints name a class by its module
# (serialize_type), and pickles refer to it so; neither then depends on
# which module of the package defines it.
for _cls in (OfflineData, OfflineMultiAgentEnvRunner, OfflinePreLearner,
             OfflineSingleAgentEnvRunner):
    _cls.__module__ = __name__
del _cls
