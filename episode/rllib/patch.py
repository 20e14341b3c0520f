"""install(): RLlib's classes swapped for ours in every loaded `ray.rllib`
module and in the Ray workers started afterwards (see the package's
docstring). Importing this module does not import ray; install() does.

The switch sits below the modules it swaps in: it names our classes by
module and name, as it names RLlib's, and imports them when installing
(`runners` and `offline` call install() themselves, so they import it,
not the other way round)."""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import sys
from typing import Any, Iterator

__all__ = ["install", "installed", "is_installed", "uninstall", "worker_setup"]

# (RLlib's module, the class name, our module): the classes swapped.
CLASSES = (
    ("ray.rllib.env.utils.infinite_lookback_buffer", "InfiniteLookbackBuffer",
     "episode.lookback_buffer"),
    ("ray.rllib.env.single_agent_episode", "SingleAgentEpisode",
     "episode.single_agent_episode"),
    ("ray.rllib.env.multi_agent_episode", "MultiAgentEpisode",
     "episode.multi_agent_episode"),
    ("ray.rllib.utils.replay_buffers.episode_replay_buffer", "EpisodeReplayBuffer",
     "episode.replay"),
    ("ray.rllib.utils.replay_buffers.prioritized_episode_buffer",
     "PrioritizedEpisodeReplayBuffer", "episode.replay"),
    ("ray.rllib.utils.replay_buffers.multi_agent_episode_buffer",
     "MultiAgentEpisodeReplayBuffer", "episode.replay"),
    ("ray.rllib.utils.replay_buffers.multi_agent_prioritized_episode_buffer",
     "MultiAgentPrioritizedEpisodeReplayBuffer", "episode.replay"),
    ("ray.rllib.offline.offline_env_runner", "OfflineSingleAgentEnvRunner",
     "episode.rllib.offline.recording"),
    ("ray.rllib.offline.offline_data", "OfflineData", "episode.rllib.offline.data"),
    ("ray.rllib.offline.offline_prelearner", "OfflinePreLearner",
     "episode.rllib.offline.prelearner"),
)

# Our runner that records multi-agent episodes (module, class name).
RECORDING_RUNNER = ("episode.rllib.offline.recording", "OfflineMultiAgentEnvRunner")

# The methods install() replaced, to be put back: (class, name, RLlib's).
_replaced: list = []
# RLlib's class -> ours, while installed.
_swap: dict = {}
_ray_init: Any = None


def is_installed() -> bool:
    """Whether RLlib runs on our classes in this process."""
    return bool(_swap)


def install() -> None:
    """Makes every loaded `ray.rllib` module, and every Ray worker process
    started afterwards, use our episode and buffer classes (does nothing if
    they already do). RuntimeError, changing nothing, while an episode or
    buffer of RLlib's classes is alive; ImportError without ray[rllib]."""
    if _swap:
        # (A module imported since takes ours from the modules patched.)
        return
    swap = {}
    for rllib_module, name, our_module in CLASSES:
        try:
            theirs = getattr(importlib.import_module(rllib_module), name)
        except ModuleNotFoundError as error:
            from episode._extras import rllib_missing

            raise rllib_missing(error, "episode.rllib.install()") from error
        swap[theirs] = _ours(our_module, name)
    alive = _alive_instances(tuple(swap), tuple(swap.values()))
    if alive:
        raise RuntimeError(
            f"episode.rllib.install(): {alive} object(s) of RLlib's episode and buffer classes "
            f"exist already; RLlib tells episodes apart by class, so one process cannot mix "
            f"them. Install before anything makes an episode (before building the algorithm).")
    _swap.update(swap)
    _swap_in_loaded_modules(_swap)
    _patch_learner_connectors()
    _patch_recording_runner_choice()
    _hook_ray_init()


def _ours(module: str, name: str) -> type:
    # One of our classes the switch names.
    return getattr(importlib.import_module(module), name)


def uninstall() -> None:
    """Puts RLlib's own classes back where install() put ours, in modules
    imported since too (does nothing if not installed). Worker processes
    already started keep ours."""
    global _ray_init
    for owner, attribute, theirs in reversed(_replaced):
        setattr(owner, attribute, theirs)
    _replaced.clear()
    _swap_in_loaded_modules({ours: theirs for theirs, ours in _swap.items()})
    _swap.clear()
    if _ray_init is not None:
        import ray

        ray.init = _ray_init
        _ray_init = None


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """install() for the body of a `with` block, uninstall() after it (if
    the block installed it)."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


def _swap_in_loaded_modules(swap: dict) -> None:
    # Every attribute of a loaded ray.rllib module that is a class in `swap`
    # becomes the class it maps to. (A module imported while installed takes
    # ours from the modules already swapped; uninstall() swaps it back too.)
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "ray.rllib"
                                  or module_name.startswith("ray.rllib.")):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            other = swap.get(value) if isinstance(value, type) else None
            if other is not None:
                setattr(module, attribute, other)


def _patch_learner_connectors() -> None:
    # Learner connector pipelines build replayed episodes' train batches from
    # the arrays they were drawn into (episode.rllib.learner).
    from ray.rllib.connectors.learner.learner_connector_pipeline import (
        LearnerConnectorPipeline)

    from episode.rllib.learner import learner_call

    _replaced.append((LearnerConnectorPipeline, "__call__",
                      LearnerConnectorPipeline.__dict__["__call__"]))
    LearnerConnectorPipeline.__call__ = learner_call


def _patch_recording_runner_choice() -> None:
    # A multi-agent config with `output=` records through our recording
    # runner, where RLlib's EnvRunnerGroup raises "not supported" (it picks
    # the recording runner itself when no env_runner_cls is given).
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    rllib_init = EnvRunnerGroup.__dict__["__init__"]

    @functools.wraps(rllib_init)
    def __init__(self, *args: Any, config: Any = None, **kwargs: Any) -> None:
        if getattr(config, "output", None) and config.is_multi_agent \
                and config.env_runner_cls is None \
                and config.enable_env_runner_and_connector_v2:
            frozen = config._is_frozen
            config = config.copy(copy_frozen=False)
            config.env_runners(env_runner_cls=_ours(*RECORDING_RUNNER))
            if frozen:
                config.freeze()
        rllib_init(self, *args, config=config, **kwargs)

    _replaced.append((EnvRunnerGroup, "__init__", rllib_init))
    EnvRunnerGroup.__init__ = __init__


def _alive_instances(classes: tuple, ours: tuple) -> int:
    # Objects of RLlib's classes, not counting ours (some of which subclass
    # RLlib's: the offline classes).
    gc.collect()
    # (type(), not isinstance(): some lazy module attributes warn when asked
    # for their __class__.)
    return sum(1 for obj in gc.get_objects()
               if issubclass(type(obj), classes) and not issubclass(type(obj), ours))


def worker_setup() -> None:
    """Ray's worker process setup hook: install() in a worker."""
    install()


def _hook_ray_init() -> None:
    # Workers started by a later ray.init() run worker_setup first (unless
    # the caller gave a setup hook of their own).
    global _ray_init
    import ray

    if _ray_init is not None:
        return
    _ray_init = ray.init

    @functools.wraps(_ray_init)
    def init(*args: Any, **kwargs: Any) -> Any:
        runtime_env = dict(kwargs.get("runtime_env") or {})
        runtime_env.setdefault("worker_process_setup_hook", f"{__name__}.worker_setup")
        kwargs["runtime_env"] = runtime_env
        return _ray_init(*args, **kwargs)

    ray.init = init
