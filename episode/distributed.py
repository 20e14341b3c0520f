"""Sampling on a Ray cluster: N actors, each running an `episode.Sampler`.

`DistributedSampler` starts `num_actors` Ray actors, each with its own
Sampler over its own copy of the env, and gathers their rollouts on the
driver: `sample_episodes()` the episodes (numpy'ized; they cross the object
store as whole buffers, pickle protocol 5 out-of-band), `sample()` the
training batches. A new policy (or new weights for it) goes out as one
`ray.put`, whose reference every actor receives.

A failed actor is brought back and its rollout requested again. Each call's
result reaches the driver whole or not at all (Ray retries no actor call,
`max_task_retries=0`), so no episode is delivered twice or in part. A
restarted actor starts a new Sampler with a seed of its own: it never replays
the trajectories of an earlier incarnation.

Importing this module imports ray; importing `episode` does not.
"""
from __future__ import annotations

import inspect
import os
import time
import warnings
from typing import Any, Callable, Dict, List, Literal, Optional, Union, overload

import numpy as np

from episode._extras import rllib_missing
from episode.multi_agent_episode import MultiAgentEpisode
from episode.sampling import Sampler, check_sampler_args
from episode.single_agent_episode import SingleAgentEpisode
from episode.typing import TrainingBatch

try:
    import ray
    from ray.exceptions import (ActorDiedError, ActorUnavailableError, GetTimeoutError,
                                RayActorError)
except ModuleNotFoundError as e:
    raise rllib_missing(e, "episode.distributed") from e

__all__ = ["ActorNotStarted", "DistributedSampler", "SamplerActor", "concat_batches"]

# Set by Ray on every actor we make: it restarts a dead actor's process; we
# re-request its rollout ourselves, so that no call runs twice.
_FIXED_ACTOR_OPTIONS = ("max_restarts", "max_task_retries")


class ActorNotStarted(RuntimeError):
    """An actor was asked to sample before the driver started its Sampler:
    Ray restarted its process since the last call."""


def _check_sampler_args(policy: Optional[Callable], seed: Optional[int],
                        sampler_kwargs: dict) -> None:
    # Sampler's own checks (TypeError for a keyword it does not take), so
    # that bad input fails here, with Sampler's error classes, before any
    # actor exists.
    args = inspect.signature(Sampler).bind(None, policy, seed=seed, **sampler_kwargs)
    args.apply_defaults()
    check_sampler_args(policy, args.arguments["batch_mode"],
                       args.arguments["rollout_fragment_length"],
                       args.arguments["count_steps_by"], args.arguments["num_envs"], seed)


class SamplerActor:
    """What each Ray actor holds: one Sampler and its env.

    The Sampler is built by `start()`, not by the constructor. Ray runs the
    constructor again in a restarted process; that process then has no
    Sampler until the driver starts one with a new seed, so it can never
    replay an earlier incarnation's trajectories (a call before that raises
    ActorNotStarted, which tells the driver of the restart).
    """

    def __init__(self) -> None:
        self.sampler: Optional[Sampler] = None
        with warnings.catch_warnings():
            # Ray 2.60's property warns about an API it uses internally.
            warnings.simplefilter("ignore")
            self.reconstructed = bool(ray.get_runtime_context().was_current_actor_reconstructed)

    def start(self, config: tuple, seed: Optional[int], policy: Optional[Callable],
              weights: Any) -> dict:
        """A new Sampler (the old one closed) on `config` = (env,
        sampler_kwargs), with `seed`, `policy` and its `weights`."""
        env, sampler_kwargs = config
        if self.sampler is not None:
            old, self.sampler = self.sampler, None
            old.close()
        sampler = Sampler(env, policy, seed=seed, **sampler_kwargs)
        if weights is not None:
            policy.set_weights(weights)  # type: ignore[union-attr]
        self.sampler = sampler
        return {"multi_agent": sampler.multi_agent, "num_envs": sampler.num_envs,
                "pid": os.getpid(), "reconstructed": self.reconstructed}

    def _started(self) -> Sampler:
        if self.sampler is None:
            raise ActorNotStarted("this actor's process was restarted and has no Sampler yet")
        return self.sampler

    def set_policy(self, policy: Optional[Callable]) -> None:
        self._started().policy = policy

    def set_weights(self, weights: Any) -> None:
        self._started().policy.set_weights(weights)  # type: ignore[union-attr]

    def sample_episodes(self) -> list:
        return self._started().sample_episodes()

    def sample(self) -> Any:
        return self._started().sample()

    def get_metrics(self) -> dict:
        return self._started().get_metrics()

    def ongoing_episodes(self) -> list:
        return self._started().ongoing_episodes()

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class DistributedSampler:
    """`num_actors` Samplers on a Ray cluster, sampled together.

    Args:
        env: A gymnasium id or a picklable function making the env (single-
            or multi-agent): each actor makes its own.
        policy: As Sampler's (None: random actions); it is pickled once
            (`ray.put`) and every actor gets a copy.
        num_actors: The Ray actors, one Sampler each.
        address: The Ray cluster to join if Ray is not initialized yet
            (None: `ray.init()` starts a local one). Ignored when Ray is
            already initialized.
        init_kwargs: More arguments for that `ray.init()`.
        max_restarts: How often Ray restarts a dead actor's process, and how
            often one call requests an actor's rollout again before it gives
            up and raises the actor's error. An actor Ray will not restart
            any more is replaced by a new one.
        start_timeout_s: How long starting (or restarting) an actor may take
            before TimeoutError (e.g. while it waits for a free CPU).
        actor_options: Ray options for each actor (default
            ``{"num_cpus": 1}``); max_restarts and max_task_retries are ours.
        seed: Actor i's Sampler gets seed ``seed + i * num_envs`` (so its
            sub-env k is reset with ``seed + i * num_envs + k``); after a
            restart it gets a seed no incarnation of any actor had (see
            `actor_seed`). None: unseeded.
        **sampler_kwargs: Sampler's other arguments (view_requirements,
            batch_mode, rollout_fragment_length, count_steps_by, num_envs).

    One call covers one rollout of every actor (a Sampler call each).
    """

    def __init__(self, env: Any, policy: Optional[Callable] = None, *, num_actors: int = 2,
                 address: Optional[str] = None, init_kwargs: Optional[dict] = None,
                 max_restarts: int = 3, start_timeout_s: float = 120.0,
                 actor_options: Optional[dict] = None, seed: Optional[int] = None,
                 **sampler_kwargs: Any):
        self.num_actors = _positive_int("num_actors", num_actors)
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, (int, np.integer)) \
                or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        if isinstance(start_timeout_s, bool) or not isinstance(start_timeout_s, (int, float)) \
                or not start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be a positive number, got "
                             f"{start_timeout_s!r}")
        if not isinstance(env, str) and not callable(env):
            raise TypeError(f"env must be a gymnasium id or a function making the env (each "
                            f"actor makes its own), got {type(env).__name__}")
        for name, value in (("init_kwargs", init_kwargs), ("actor_options", actor_options)):
            if value is not None and not isinstance(value, dict):
                raise TypeError(f"{name} must be a dict or None, got {type(value).__name__}")
        fixed = sorted(set(actor_options or ()) & set(_FIXED_ACTOR_OPTIONS))
        if fixed:
            raise ValueError(f"actor_options cannot set {fixed}: use max_restarts (actor calls "
                             f"are never retried by Ray)")
        _check_sampler_args(policy, seed, sampler_kwargs)
        self.max_restarts = int(max_restarts)
        self.start_timeout_s = float(start_timeout_s)
        self.seed = None if seed is None else int(seed)
        self._num_envs = int(sampler_kwargs.get("num_envs", 1))
        self._actor_options = {"num_cpus": 1, **(actor_options or {}),
                               "max_restarts": self.max_restarts, "max_task_retries": 0}
        if not ray.is_initialized():
            ray.init(address=address, **(init_kwargs or {}))
        # Everything an actor is started with, put once: a restarted actor
        # gets the same env and arguments and the current policy and weights.
        self._config_ref = ray.put((env, dict(sampler_kwargs)))
        self._policy = policy
        self._policy_ref = None if policy is None else ray.put(policy)
        self._weights_ref: Any = None
        self._actor_class = ray.remote(SamplerActor)
        self._actors: List[Any] = []
        # Start calls made per actor slot: each gets a new seed.
        self._incarnations = [0] * self.num_actors
        self._seeds: List[Optional[int]] = [None] * self.num_actors
        self._restarts = 0
        self._closed = False
        try:
            self._actors = [self._new_actor() for _ in range(self.num_actors)]
            infos = self._gather(self._start_call, resubmit=False,
                                 timeout=self.start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.multi_agent = bool(infos[0]["multi_agent"])

    # -- public -----------------------------------------------------------------

    @property
    def policy(self) -> Optional[Callable]:
        """The actors' policy (assigning sets it, as `set_policy`)."""
        return self._policy

    @policy.setter
    def policy(self, policy: Optional[Callable]) -> None:
        self.set_policy(policy)

    @property
    def actors(self) -> List[Any]:
        """The Ray actor handles (SamplerActor), one per actor slot."""
        return list(self._actors)

    def actor_seed(self, index: int, incarnation: int = 0) -> Optional[int]:
        """The seed of actor `index`'s Sampler in its `incarnation`-th start
        (0: the first): ``seed + (incarnation * num_actors + index) *
        num_envs``, so no two starts of any actors share a sub-env seed."""
        if self.seed is None:
            return None
        return self.seed + (incarnation * self.num_actors + index) * self._num_envs

    @property
    def actor_seeds(self) -> List[Optional[int]]:
        """The seed each actor's current Sampler was started with."""
        return list(self._seeds)

    def set_policy(self, policy: Optional[Callable]) -> None:
        """Sends `policy` (a callable as Sampler's, or None for random
        actions) to every actor: one `ray.put`, its reference to each. The
        weights of earlier `set_weights` calls are no longer sent."""
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable or None, got {type(policy).__name__}")
        self._require_open()
        ref = None if policy is None else ray.put(policy)
        self._policy, self._policy_ref, self._weights_ref = policy, ref, None
        self._gather(lambda i: self._actors[i].set_policy.remote(ref))

    def set_weights(self, weights: Any) -> None:
        """Calls ``policy.set_weights(weights)`` in every actor (the policy
        must have that method): one `ray.put`, its reference to each. A
        restarted actor gets the latest weights too."""
        if not callable(getattr(self._policy, "set_weights", None)):
            raise TypeError(f"set_weights() needs a policy with a set_weights method, the "
                            f"policy is {type(self._policy).__name__}")
        self._require_open()
        ref = ray.put(weights)
        self._weights_ref = ref
        self._gather(lambda i: self._actors[i].set_weights.remote(ref))

    def sample_episodes(self) -> List[Union[SingleAgentEpisode, MultiAgentEpisode]]:
        """One rollout of every actor: their episodes (as Sampler's: finished
        ones, then the chunks of running ones in truncate mode, numpy'ized),
        actor 0's first."""
        self._require_open()
        per_actor = self._gather(lambda i: self._actors[i].sample_episodes.remote())
        return [e for episodes in per_actor for e in episodes]

    @overload
    def sample(self, concat: Literal[True] = True) -> TrainingBatch: ...
    @overload
    def sample(self, concat: Literal[False]) -> List[TrainingBatch]: ...
    def sample(self, concat: bool = True) -> Union[TrainingBatch, List[TrainingBatch]]:
        """One rollout of every actor as training batches (see
        Sampler.sample). `concat`: one batch, the actors' rows one after
        another in actor order (per module id for multi-agent envs; see
        `concat_batches`); False: the list of the actors' batches. Each
        actor numbers its unroll_id column on its own, so these repeat
        across actors; eps_id does not."""
        self._require_open()
        batches = self._gather(lambda i: self._actors[i].sample.remote())
        return concat_batches(batches, multi_agent=self.multi_agent) if concat else batches

    def get_metrics(self) -> Dict[str, Any]:
        """The actors' metrics since the last call, together (as Sampler's:
        counts summed, lists of returns and lengths joined in actor order),
        plus "actor_restarts": the actors brought back since the last call.
        A dead actor's metrics since the last call are lost."""
        self._require_open()
        per_actor = self._gather(lambda i: self._actors[i].get_metrics.remote())
        merged: Dict[str, Any] = {}
        for metrics in per_actor:
            for key, value in metrics.items():
                if key not in merged:
                    merged[key] = list(value) if isinstance(value, list) else value
                elif isinstance(value, list):
                    merged[key].extend(value)
                else:
                    merged[key] += value
        merged["actor_restarts"] = self._restarts
        self._restarts = 0
        return merged

    def ongoing_episodes(self) -> List[Union[SingleAgentEpisode, MultiAgentEpisode]]:
        """Copies of the episodes the actors are still filling, actor 0's first."""
        self._require_open()
        per_actor = self._gather(lambda i: self._actors[i].ongoing_episodes.remote())
        return [e for episodes in per_actor for e in episodes]

    def close(self) -> None:
        """Closes the actors' envs and ends the actors (Ray stays up)."""
        self._closed = True
        actors, self._actors = self._actors, []
        if not actors or not ray.is_initialized():
            # (After ray.shutdown() the actors are gone already.)
            return
        # The envs get a moment to close; a dead or stuck actor is killed anyway.
        ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=10)
        for actor in actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self) -> "DistributedSampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- actors -------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError("the DistributedSampler is closed")

    def _new_actor(self) -> Any:
        return self._actor_class.options(**self._actor_options).remote()

    def _start_call(self, i: int) -> Any:
        seed = self.actor_seed(i, self._incarnations[i])
        self._incarnations[i] += 1
        self._seeds[i] = seed
        return self._actors[i].start.remote(self._config_ref, seed, self._policy_ref,
                                            self._weights_ref)

    def _gather(self, submit: Callable[[int], Any], resubmit: bool = True,
                timeout: Optional[float] = None) -> list:
        """Every actor's result of the call `submit(i)` makes, in actor
        order, taken as each finishes. An actor that failed is brought back
        (restarted, with the current policy and weights) and, if `resubmit`,
        asked again; its failed call's result is never seen. The first other
        error (the env's or the policy's) is raised once all calls are
        over. `timeout`: TimeoutError if a call is not over in time."""
        pending = {submit(i): i for i in range(self.num_actors)}
        results: list = [None] * self.num_actors
        failures = [0] * self.num_actors
        error: Optional[BaseException] = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if not ready:
                raise TimeoutError(f"{len(pending)} actor(s) did not answer within {timeout} s "
                                   f"(not enough free CPUs for {self.num_actors} actors with "
                                   f"{self._actor_options.get('num_cpus')} CPU each?)")
            ref = ready[0]
            i = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
                failures[i] = 0
            except (RayActorError, ActorNotStarted) as e:
                failures[i] += 1
                if getattr(e, "actor_init_failed", False):
                    # Its process could not make it (an import that fails
                    # there): restarting would fail the same way.
                    error = error or e
                    continue
                if failures[i] > self.max_restarts:
                    error = error or e
                    continue
                try:
                    info = self._restart(i)
                except Exception as restart_error:
                    error = error or restart_error
                    continue
                if resubmit:
                    pending[submit(i)] = i
                else:
                    results[i] = info
            except Exception as e:
                error = error or e
        if error is not None:
            raise error
        return results

    def _restart(self, i: int) -> dict:
        """Brings actor i back and starts its Sampler again: Ray restarts the
        process (we wait for it); an actor Ray will not restart any more is
        replaced by a new one."""
        self._restarts += 1
        deadline = time.monotonic() + self.start_timeout_s
        dead_answers = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"actor {i} was not back within {self.start_timeout_s} s")
            try:
                return ray.get(self._start_call(i), timeout=left)
            except ActorUnavailableError:
                # Ray is restarting it.
                time.sleep(0.05)
            except ActorDiedError as e:
                if e.actor_init_failed:
                    raise          # its process cannot make it: the cause, not a timeout
                # Dead for good, or the driver has not heard of the restart
                # yet: a second such answer in a row means dead.
                dead_answers += 1
                if dead_answers >= 2:
                    ray.kill(self._actors[i], no_restart=True)
                    self._actors[i] = self._new_actor()
                    dead_answers = 0
                else:
                    time.sleep(0.05)
            except GetTimeoutError:
                raise TimeoutError(f"actor {i} was not back within {self.start_timeout_s} s") \
                    from None


def concat_batches(batches: list, multi_agent: bool = False) -> dict:
    """One training batch from several (Sampler.sample()'s), their rows one
    after another: each column's arrays concatenated (Dict/Tuple columns
    leaf by leaf, lists joined). For multi-agent batches ({module_id:
    columns}) module by module; a module only some batches have keeps their
    rows. ValueError if batches of one module have different columns."""
    if not multi_agent:
        return _concat_columns(batches)
    modules: Dict[Any, list] = {}
    for batch in batches:
        for module, columns in batch.items():
            modules.setdefault(module, []).append(columns)
    return {module: _concat_columns(parts) for module, parts in modules.items()}


def _concat_columns(parts: list) -> dict:
    parts = [p for p in parts if p]
    if not parts:
        return {}
    names = list(parts[0])
    for p in parts[1:]:
        if set(p) != set(names):
            raise ValueError(f"cannot concatenate batches with different columns: "
                             f"{sorted(names)} and {sorted(p)}")
    return {name: _concat([p[name] for p in parts]) for name in names}


def _concat(values: list) -> Any:
    first = values[0]
    if isinstance(first, dict):
        return {key: _concat([v[key] for v in values]) for key in first}
    if isinstance(first, tuple):
        return tuple(_concat([v[j] for v in values]) for j in range(len(first)))
    if isinstance(first, list):
        return [row for v in values for row in v]
    return np.concatenate(values)
