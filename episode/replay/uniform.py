"""EpisodeReplayBuffer: RLlib's uniform episode buffer on the compiled
Store, and the native `sample_batch()` every single-agent buffer has."""
from __future__ import annotations

import collections
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from episode import _gather, _picks
from episode._draws import Draws
from episode._replay import Store, episode_fields, live_slots, step_order
from episode.lookback_buffer import InfiniteLookbackBuffer
from episode.single_agent_episode import SingleAgentEpisode
from episode.replay.draws import (_batch_size, _check_capacity, _check_gamma,
                                  _check_not_empty, _checked_n_step, _int, _warn_misspelt, _native_args, _NativeArgs, _track,
                                  _transitions)
from episode.replay.frames import frame_settings, store_args
from episode.replay.metrics import (_AddCounts, _log_pair, _metrics_logger, _reduced, _Unlogged,
                                    kept_metrics, restored_metrics)
from episode.replay import kept
from episode.replay.kinds import KINDS, kind_of
from episode.replay.transitions import _OpenEpisodes, add_transitions
from episode.replay.tensors import _check_numeric, _to_torch, _torch_device
from episode.replay.stored import (DEFAULT_AGENT_ID, DEFAULT_MODULE_ID, _as_ours,
                                   _episode_indices, _force_list, _numbers_as_numbers,
                                   _stored_episode)


_ENVS = np.arange(64)


def _env_numbers(start: int, stop: int) -> np.ndarray:
    """Envs start .. stop - 1, as Store.add_steps() takes them (the usual
    numbers made once)."""
    return _ENVS[start:stop] if stop <= len(_ENVS) else np.arange(start, stop)


class _BufferClass(type):
    """The buffers' metaclass: RLlib's Algorithm asks `"EpisodeReplayBuffer"
    in config["replay_buffer_config"]["type"]`, which a class cannot answer
    (RLlib's own fail there): ours answer from their name, so that
    `replay_buffer_config={"type": PrioritizedEpisodeReplayBuffer}` works."""

    def __contains__(cls, name) -> bool:
        return isinstance(name, str) and name in cls.__name__


class EpisodeReplayBuffer(metaclass=_BufferClass):
    """RLlib's EpisodeReplayBuffer on the compiled store.

    Stores episodes (ours or RLlib's SingleAgentEpisodes) by id, up to
    `capacity` timesteps; a chunk of a stored episode (same id, continued by
    `cut()`) is joined to it. Evicts the oldest episodes first. `sample()`
    returns RLlib's batch of `batch_size_B` rows of `batch_length_T` steps,
    or with `sample_episodes=True` a list of episodes: n-step transitions or
    sequences. `storage`, a folder, keeps the rows in files there. `seed`
    seeds the buffer's `rng` (RLlib's buffers draw from an unseeded one;
    assigning `rng` a seeded Generator does the same there). Other keyword
    arguments are ignored, as RLlib's are (a warning names one that looks
    like a misspelt argument).

    `frame_stack` (a number of frames, or an environment whose wrappers
    stack frames: see `episode.replay.frames`) stores frame-stacked
    observations once per frame, rebuilding each stacked observation when
    it is sampled; `frame_stack_axis` is the axis the frames lie along (by
    default the one axis of that length). Every answer of the buffer is the
    same as without them; only the memory differs.
    """

    # The keys of this buffer's checkpoints (get_state()), RLlib's.
    _STATE_KEYS: Tuple[str, ...] = (
        "episodes", "episode_id_to_index", "_num_episodes_evicted", "_indices",
        "_num_timesteps", "_num_timesteps_added", "sampled_timesteps")

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 64, metrics_num_episodes_for_smoothing: int = 100,
                 storage=None, seed=None, frame_stack=None, frame_stack_axis=None,
                 **kwargs):
        _warn_misspelt(self, EpisodeReplayBuffer.__init__, kwargs)
        self._frames = frame_settings(frame_stack, frame_stack_axis)
        self.capacity = capacity
        self.batch_size_B = batch_size_B
        self.batch_length_T = batch_length_T
        self._store = self._new_store(capacity, storage)
        self._num_timesteps = 0
        self._num_timesteps_added = 0
        self.sampled_timesteps = 0
        self.rng = np.random.default_rng(seed)
        self._logger = _metrics_logger()
        self._unlogged = _Unlogged()
        self._metrics_num_episodes_for_smoothing = metrics_num_episodes_for_smoothing

    @property
    def metrics(self):
        """RLlib's MetricsLogger of the buffer, every add() and sample() logged."""
        self._unlogged.flush(self._logger)
        return self._logger

    @metrics.setter
    def metrics(self, logger) -> None:
        self._unlogged = _Unlogged()
        self._logger = logger

    def _new_store(self, capacity, storage) -> Store:
        if storage is not None and not isinstance(storage, int):
            os.makedirs(storage, exist_ok=True)     # (FileExistsError for a file)
        _check_capacity(capacity)
        return Store(capacity, storage=storage, **store_args(self._frames))

    def _draws(self) -> Draws:
        # Draws from self.rng (kept while rng stays the same object).
        draws = self.__dict__.get("_draws_of")
        if draws is None or draws[0] is not self.rng:
            draws = self.__dict__["_draws_of"] = (self.rng, Draws(self.rng))
        return draws[1]

    # -- RLlib's attributes, read from the store ----------------------------------------

    @property
    def episodes(self) -> collections.deque:
        """The stored episodes, oldest first (each a new SingleAgentEpisode)."""
        return collections.deque(_stored_episode(self._store, slot)
                                 for slot in live_slots(self._store))

    @property
    def episode_id_to_index(self) -> Dict[Any, int]:
        """Stored episode id -> its episode index (RLlib's counting)."""
        first = self._store.num_evicted
        return {episode_fields(self._store, slot)[0]: first + i
                for i, slot in enumerate(live_slots(self._store))}

    @property
    def _num_episodes_evicted(self) -> int:
        return self._store.num_evicted

    @property
    def _indices(self) -> list:
        index = _episode_indices(self._store)
        return [(index[slot], ts) for slot, ts, _ in step_order(self._store)]

    def __len__(self) -> int:
        return self.get_num_timesteps()

    # -- adding --------------------------------------------------------------------------

    def add(self, episodes) -> None:
        """Adds episodes (a list, or one), evicting the oldest ones while the
        buffer holds more than `capacity` timesteps (and more than one
        episode). Checked first: a bad episode changes nothing."""
        episodes = [_numbers_as_numbers(_as_ours(e)) for e in _force_list(episodes)]
        pending: dict = {}
        for episode in episodes:
            self._store.check(episode, pending)
        counts = _AddCounts()
        for episode in episodes:
            steps = len(episode)
            self._num_timesteps += steps
            self._num_timesteps_added += steps
            counts.env_steps_added += steps
            counts.agent_steps_added += steps
            _, is_new, _, _ = self._store.add(episode)
            if is_new:
                counts.episodes_added += 1
            self._evict_over_capacity(counts)
        self._log_add(counts)

    def add_transition(self, obs, next_obs, action, reward, terminated, truncated,
                       infos=None) -> None:
        """Adds transitions as SB3's and cpprb's buffers take them: one env's
        step (a number `reward`) or one step of each env of a vector env
        (`reward` of shape (n,); every other argument then has the n envs'
        rows first, Dict/Tuple observations per leaf). `infos`: None, or
        the step's infos dict (one per env).

        Each env has an open episode: its step joins it as add() of the
        one-step chunk [obs, next_obs] (numpy'ized) would, so sample() and
        sample_batch() see what such add() calls would give, and a
        terminated or truncated step closes it (the env's next step starts
        a new episode). next_obs is stored once, as the next step's
        observation: a step of an open episode must start at the last
        next_obs of its env (ValueError otherwise). The number of envs is
        fixed by the first call; set_state() closes the open episodes.

        Example (SB3's loop: a vector env that resets an env in the step
        that ends its episode, whose final observation is then in infos)::

            envs = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync",
                                vector_kwargs={"autoreset_mode":
                                               gym.vector.AutoresetMode.SAME_STEP})
            obs, _ = envs.reset(seed=0)
            for _ in range(1000):
                actions = policy(obs)
                next_obs, rewards, terminated, truncated, infos = envs.step(actions)
                final = next_obs.copy()
                for i in np.flatnonzero(infos.get("_final_obs", ())):
                    final[i] = infos["final_obs"][i]
                buffer.add_transition(obs, final, actions, rewards, terminated, truncated)
                obs = next_obs

        Checked before anything is stored (TypeError, ValueError: shapes,
        dtypes unlike the stored ones, counts that disagree); a refused call
        changes nothing."""
        add_transitions(self, obs, next_obs, action, reward, terminated, truncated, infos)

    def _add_steps(self, ids, t, obs, next_obs, actions, rewards, terminated, truncated,
                   infos, first_infos, counts: "_AddCounts") -> bool:
        # add_transition()'s checked steps (one per env), each as add() of
        # its chunk: stored, counted, then the oldest episodes evicted while
        # over capacity (in one call as far as none can be). False, with
        # nothing changed, where the arrays are unlike the stored leaves.
        n = len(ids)
        store = self._store
        start = 0
        while start < n:
            stop = self._steps_in_one_call(ids, start)
            try:
                new = store.add_steps(ids, ids, t, obs, next_obs, actions, rewards, terminated,
                                      truncated, infos, _env_numbers(start, stop),
                                      first_infos=first_infos)
            except (TypeError, ValueError):
                if start:
                    raise         # (checked by the first call: cannot happen)
                return False
            counts.episodes_added += new
            self._num_timesteps += stop - start
            self._num_timesteps_added += stop - start
            counts.env_steps_added += stop - start
            counts.agent_steps_added += stop - start
            self._evict_over_capacity(counts)
            start = stop
        return True

    def _steps_in_one_call(self, ids: list, start: int) -> int:
        # How far past env `start` add_transition()'s steps can be stored
        # before the oldest episodes are evicted, with the same result as
        # add() of their chunks, which evicts after each: all of them where
        # the episodes that eviction takes are none of theirs (then when
        # they go makes no difference), else up to the first that would
        # overflow the capacity.
        n = len(ids)
        over = self._num_timesteps + n - start - self.capacity
        if over <= 0:
            return n
        store = self._store
        ours = set(ids[start:])
        for k in range(store.num_episodes):
            fields = episode_fields(store, store.oldest(k))
            if fields[0] in ours:
                break
            over -= fields[3]
            if over <= 0:
                return n
        return start + max(1, self.capacity - self._num_timesteps)

    def add_dataset(self, dataset) -> None:
        """Adds every episode of an `episode.offline.EpisodeDataset` in its
        stored order, as add() would add them (the same samples follow):
        without an episode object each where the files allow (a step file's
        single-agent episodes stored whole: its rows are adopted as they
        are, and a memory-mapped file's are read in place), as episodes
        otherwise. Evicts the oldest episodes while over capacity, as add()
        does."""
        if self._store.priorities is not None:
            for start in range(0, len(dataset), 1024):
                self.add(dataset[start:start + 1024])
            return
        for kind, item in dataset.replay_items():
            if kind == "episodes":
                for start in range(0, len(item), 1024):
                    self.add([dataset[i] for i in item[start:start + 1024]])
                continue
            counts = _AddCounts()
            self._store.add_block(**item)
            steps = int(np.sum(item["lengths"]))
            self._num_timesteps += steps
            self._num_timesteps_added += steps
            counts.env_steps_added += steps
            counts.agent_steps_added += steps
            counts.episodes_added += len(item["ids"])
            self._evict_over_capacity(counts)
            self._log_add(counts)

    def _evict_over_capacity(self, counts: "_AddCounts") -> None:
        while self._num_timesteps > self.capacity and self.get_num_episodes() > 1:
            (_, evicted_steps), = self._store.evict_oldest(1)
            counts.episodes_evicted += 1
            counts.env_steps_evicted += evicted_steps
            counts.agent_steps_evicted += evicted_steps
            self._num_timesteps -= evicted_steps

    def _log_add(self, counts: "_AddCounts") -> None:
        if type(self)._update_add_metrics is EpisodeReplayBuffer._update_add_metrics:
            # (What the call below logs, tallied; a subclass's own is called.)
            self._unlogged.tally_add(counts, self.get_num_episodes(), self.get_num_timesteps(),
                                     self._metrics_num_episodes_for_smoothing)
            return
        self._update_add_metrics(
            num_episodes_added=counts.episodes_added,
            num_env_steps_added=counts.env_steps_added,
            num_episodes_evicted=counts.episodes_evicted,
            num_env_steps_evicted=counts.env_steps_evicted,
            agent_to_num_episodes_added={DEFAULT_AGENT_ID: counts.episodes_added},
            agent_to_num_steps_added={DEFAULT_AGENT_ID: counts.agent_steps_added},
            agent_to_num_episodes_evicted={DEFAULT_AGENT_ID: counts.episodes_evicted},
            agent_to_num_steps_evicted={DEFAULT_AGENT_ID: counts.agent_steps_evicted},
            module_to_num_episodes_added={DEFAULT_MODULE_ID: counts.episodes_added},
            module_to_num_steps_added={DEFAULT_MODULE_ID: counts.agent_steps_added},
            module_to_num_episodes_evicted={DEFAULT_MODULE_ID: counts.episodes_evicted},
            module_to_num_steps_evicted={DEFAULT_MODULE_ID: counts.agent_steps_evicted},
        )

    def _update_add_metrics(self, *, num_episodes_added, num_env_steps_added,
                            num_episodes_evicted, num_env_steps_evicted,
                            agent_to_num_episodes_added, agent_to_num_steps_added,
                            agent_to_num_episodes_evicted, agent_to_num_steps_evicted,
                            module_to_num_steps_added, module_to_num_episodes_added,
                            module_to_num_episodes_evicted, module_to_num_steps_evicted,
                            **kwargs) -> None:
        """Logs an add() call's counts (RLlib's keys and reductions)."""
        log = self._unlogged.log
        window = self._metrics_num_episodes_for_smoothing
        log("num_episodes_stored", self.get_num_episodes(), reduce="mean", window=window)
        _log_pair(log, "num_episodes_added", num_episodes_added)
        _log_pair(log, "num_episodes_evicted", num_episodes_evicted)
        log("num_env_steps_stored", self.get_num_timesteps(), reduce="mean", window=window)
        _log_pair(log, "num_env_steps_added", num_env_steps_added)
        _log_pair(log, "num_env_steps_evicted", num_env_steps_evicted)
        for aid in agent_to_num_episodes_added:
            _log_pair(log, "num_agent_episodes_added", agent_to_num_episodes_added[aid], aid)
            _log_pair(log, "num_agent_steps_added", agent_to_num_steps_added[aid], aid)
        for aid in agent_to_num_episodes_evicted:
            _log_pair(log, "num_agent_episodes_evicted", agent_to_num_episodes_evicted[aid], aid)
            _log_pair(log, "num_agent_steps_evicted", agent_to_num_steps_evicted[aid], aid)
        for mid in module_to_num_episodes_added:
            _log_pair(log, "num_module_episodes_added", module_to_num_episodes_added[mid], mid)
            _log_pair(log, "num_module_steps_added", module_to_num_steps_added[mid], mid)
        for mid in module_to_num_episodes_evicted:
            _log_pair(log, "num_module_episodes_evicted",
                      module_to_num_episodes_evicted[mid], mid)
            _log_pair(log, "num_module_steps_evicted", module_to_num_steps_evicted[mid], mid)

    # -- sampling -------------------------------------------------------------------------

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = None,
               beta: float = 0.0, gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False,
               sample_episodes: Optional[bool] = False, to_numpy: bool = False,
               lookback: int = 0, min_batch_length_T: int = 0, **kwargs):
        """RLlib's sample(): with `sample_episodes`, a list of episodes
        (n-step transitions, or sequences of `batch_length_T`); otherwise a
        dict of (batch_size_B, batch_length_T) arrays: obs, actions,
        rewards, is_first, is_last, is_terminated, is_truncated."""
        if sample_episodes:
            _check_gamma(gamma)
            return self._sample_episodes(
                num_items=num_items, batch_size_B=batch_size_B, batch_length_T=batch_length_T,
                n_step=n_step, beta=beta, gamma=gamma, include_infos=include_infos,
                include_extra_model_outputs=include_extra_model_outputs, to_numpy=to_numpy,
                lookback=lookback, min_batch_length_T=min_batch_length_T)
        return self._sample_batch(num_items=num_items, batch_size_B=batch_size_B,
                                  batch_length_T=batch_length_T)

    def _sample_batch(self, num_items=None, *, batch_size_B=None, batch_length_T=None):
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        T_max = batch_length_T or self.batch_length_T
        store = self._store
        _check_not_empty(store)
        observations = [[] for _ in range(batch_size_B)]
        actions = [[] for _ in range(batch_size_B)]
        rewards = [[] for _ in range(batch_size_B)]
        flags = {k: [[False] * T_max for _ in range(batch_size_B)]
                 for k in ("is_first", "is_last", "is_terminated", "is_truncated")}
        slots_seen, steps_seen = set(), set()
        B = T = 0
        draws = self._draws()
        while B < batch_size_B:
            slot, ts = _picks.uniform_step(store, draws)
            episode = _stored_episode(store, slot)
            flags["is_first"][B][T] = True
            if not rewards[B]:
                rewards[B].append(0.0 if ts == 0 else episode.rewards[ts - 1])
            else:
                ts = 0
                rewards[B].append(0.0)
            observations[B].extend(episode.observations[ts:])
            actions[B].extend(episode.actions[ts:])
            actions[B].append(episode.actions[-1])
            rewards[B].extend(episode.rewards[ts:])
            T = min(len(observations[B]), T_max)
            flags["is_last"][B][T - 1] = True
            if episode.is_terminated and T == len(observations[B]):
                flags["is_terminated"][B][T - 1] = True
            elif episode.is_truncated and T == len(observations[B]):
                flags["is_truncated"][B][T - 1] = True
            if T == T_max:
                del observations[B][T_max:], actions[B][T_max:], rewards[B][T_max:]
                B += 1
                T = 0
            slots_seen.add(slot)
            steps_seen.add((episode.id_, ts))
        self.sampled_timesteps += batch_size_B * T_max
        sampled = batch_size_B * T_max
        self._log_sample(sampled, len(slots_seen), len(steps_seen), None, 0)
        out = {"obs": np.array(observations), "actions": np.array(actions),
               "rewards": np.array(rewards)}
        out.update((k, np.array(v)) for k, v in flags.items())
        return out

    def _sample_episodes(self, num_items=None, *, batch_size_B=None, batch_length_T=None,
                         n_step=None, gamma=0.99, include_infos=False,
                         include_extra_model_outputs=False, to_numpy=False, lookback=1,
                         min_batch_length_T=0, **kwargs) -> List[SingleAgentEpisode]:
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        if n_step is None:
            raise AssertionError("When sampling episodes, `n_step` must be provided, but "
                                 "`n_step` is `None`.")
        if batch_length_T and (isinstance(n_step, tuple) or n_step != 1):
            raise AssertionError("When sampling sequences n-step must be 1.")
        n_step = _checked_n_step(n_step)
        store = self._store
        _check_not_empty(store)
        picks, (slots, ts, ns, ends) = self._draw_uniform(batch_size_B, batch_length_T or 0,
                                                          n_step, min_batch_length_T)
        if batch_length_T:
            episodes = [_stored_episode(store, int(s), int(t), int(e), lookback)
                        for s, t, e in zip(slots.tolist(), ts.tolist(), ends.tolist())]
            for episode, n in zip(episodes, ns):
                rows = len(episode) + lookback
                episode.extra_model_outputs["n_step"] = InfiniteLookbackBuffer(
                    np.full((rows,), int(n)), lookback=lookback)
                episode.extra_model_outputs["weights"] = InfiniteLookbackBuffer(
                    np.ones((rows,)), lookback=lookback)
        else:
            _gather.locate_ends(store, picks)
            episodes = _transitions(store, picks, slots, ts, ns, ends, gamma,
                                    include_infos=True, stored_ids=True,
                                    extras=include_extra_model_outputs, weights=None,
                                    exact_end=True, outputs_lookback=lookback)
        self._count_draw(batch_size_B, len(episodes), slots, ts, ns)
        return episodes

    def _draw_uniform(self, num_items: int, T: int, n_step, min_batch_length_T: int):
        # _sample_episodes()' draw: the picks and their (slots, ts, n-steps, ends).
        picks = _picks.draw_uniform(self._store, self._draws(), num_items, T, n_step,
                                         min_batch_length_T)
        return picks, _gather.pick_fields(self._store, picks)

    def _count_draw(self, num_items: int, returned: int, slots, ts, ns) -> None:
        # What _sample_episodes() counts and logs of a draw: RLlib counts
        # num_items, though its n-step count may make more or fewer items.
        self._after_reads(returned)
        self.sampled_timesteps += num_items
        slot_list = slots.tolist()
        self._log_sample(num_items, len(set(slot_list)), len(set(zip(slot_list, ts.tolist()))),
                         sum(ns.tolist()) / num_items, 0)

    def _transition_columns(self, num_items: int, n_step: int, min_batch_length_T: int,
                            gamma: float) -> Optional[Dict[str, Any]]:
        """The columns RLlib's default learner pipeline makes of the one-step
        episodes of ``sample(num_items, n_step=n_step, sample_episodes=True,
        min_batch_length_T=...)``, drawn and counted as that call draws and
        counts, without the episodes: obs, new_obs, actions, rewards (the
        discounted n-step sums), terminateds and truncateds (where a
        transition ends exactly at its episode's end, with its flags),
        n_step and weights (ones). None, before anything is drawn, where
        observations, actions or rewards are not one numeric leaf each, or
        the buffer is empty or prioritized."""
        store = self._store
        if store.live_steps <= 0 or store.priorities is not None:
            return None
        layout = store.layout
        leaves = (layout["obs"], layout["actions"], layout["rewards"])
        if not all(type(leaf) is int and store.leaf_dtype(leaf) is not None for leaf in leaves):
            return None
        picks, (slots, ts, ns, ends) = self._draw_uniform(num_items, 0, n_step,
                                                          min_batch_length_T)
        _gather.locate_ends(store, picks)
        obs, new_obs = _gather.gather_both(store, picks, leaves[0])
        _, _, _, terminated, truncated = _gather.native_fields(store, picks)
        exact = ts + ns == ends         # (the plain buffer's rule for done)
        columns = {"obs": obs, "new_obs": new_obs, "actions": _gather.gather(store, picks, leaves[1]),
                   "rewards": _gather.returns(store, picks, float(gamma)),
                   "terminateds": terminated & exact, "truncateds": truncated & exact,
                   "n_step": ns, "weights": np.ones(len(ns))}
        self._count_draw(num_items, len(ns), slots, ts, ns)
        return columns

    # -- the native sampler ----------------------------------------------------------------

    def sample_batch(self, batch_size: int, *, n_step: Union[int, Tuple[int, int]] = 1,
                     gamma: float = 0.99, beta: Optional[float] = None,
                     batch_length_T: Optional[int] = None, lookback: int = 0,
                     min_batch_length_T: int = 0, include_extra_model_outputs: bool = False,
                     device: Any = None) -> Dict[str, Any]:
        """A training batch of `batch_size` items as a dict of arrays,
        without episode objects (uniform draws here; by priority on the
        prioritized buffer, which then takes update_priorities() for them).

        Transitions (the default): `obs`, `actions`, `rewards` (the
        discounted sum over `n_step` steps, an int or drawn per item from a
        (low, high) range, cut at the episode's end), `new_obs` (the
        observation after those steps), `terminateds`/`truncateds` (the
        transition reaches the end of a terminated/truncated episode),
        `n_step` (the steps summed: bootstrap with gamma ** n_step),
        `weights` (importance weights; ones when uniform), `indices`.
        With the same seed, one-step transitions are the ones RLlib's
        sample() draws, with its weights; with more steps, a step nearer
        its episode's end than n_step is kept with fewer steps, where
        sample() draws again. get_sampled_timesteps() counts the items;
        no sample metrics are logged (get_metrics() has sample()'s).

        Sequences (`batch_length_T=T`): (B, lookback + T, ...) arrays of up
        to T steps from each drawn step on, after `lookback` steps before
        it, never crossing into another episode and zero-padded: `obs`,
        `new_obs`, `actions`, `rewards` (one step each), `terminateds`,
        `truncateds` (at an episode's last step), `mask` (the rows that hold
        data), `lengths` (steps from the drawn one on), `weights`,
        `indices`. Steps within `min_batch_length_T` of their episode's end
        are not drawn.

        `include_extra_model_outputs` adds each extra model output (at the
        drawn step, or per row).

        `device` (a torch.device, "cpu", "cuda:0", ...) makes every array a
        torch tensor of the same dtype and shape, nested Dict/Tuple
        observations included: on the CPU it shares the array's memory
        (torch.from_numpy, no copy), elsewhere it is copied there. None (the
        default) gives numpy arrays. torch is imported only then:
        ImportError without it, TypeError where a stored track holds Python
        objects; either before anything is drawn."""
        store = self._store
        args = _native_args(store.priorities is not None, batch_size, n_step, gamma, beta,
                            batch_length_T, lookback, min_batch_length_T,
                            include_extra_model_outputs)
        if device is not None:
            torch, device = _torch_device(device)
            _check_numeric(store, args.extras)
        batch = self._native_batch(store, args)
        # Counted as sample() counts its items (a sequence's at T steps).
        self.sampled_timesteps += batch_size * (args.T or 1)
        if store.priorities is not None:
            # (The leaves of these steps are found if RLlib's list is read.)
            self._last_leaves = None
            self._last_keys = batch["indices"].copy()    # (the caller's may change)
            self._last_keys_public = True
        self._after_reads(batch_size)
        if device is not None:
            return _to_torch(batch, torch, device)
        return batch

    def _native_batch(self, store: Store, args: _NativeArgs) -> Dict[str, Any]:
        # sample_batch() from one store, its arguments checked.
        picks = _picks.draw_native(store, self._draws(), args.batch_size, args.n_step,
                                  store.priorities is not None, args.beta, args.T, args.min_T)
        if not args.T:
            return _gather.native_transitions(store, picks, args.gamma, args.extras)
        steps, weights, indices, _, _ = _gather.native_fields(store, picks)
        batch = self._sequence_batch(store, picks, args.lookback, args.T, args.extras)
        batch["lengths"] = steps
        batch["weights"] = weights
        batch["indices"] = indices
        return batch

    def _sequence_batch(self, store: Store, picks, lookback, T, extras) -> Dict[str, Any]:
        layout = store.layout
        masks = []

        def rows(leaf, next_rows=False):
            values, mask = _gather.gather_sequences(store, picks, leaf, lookback, T, next_rows)
            masks.append(mask)
            return values

        batch = {"obs": _track(layout["obs"], rows),
                 "new_obs": _track(layout["obs"], lambda leaf: rows(leaf, True)),
                 "actions": _track(layout["actions"], rows),
                 "rewards": _track(layout["rewards"], rows)}
        if extras:
            for key, structure in layout["extras"].items():
                batch[key] = _track(structure, rows)
        mask = masks[0]
        slots, ts, _, ends = _gather.pick_fields(store, picks)
        terminateds = np.zeros(mask.shape, np.bool_)
        truncateds = np.zeros(mask.shape, np.bool_)
        for i, (slot, t, end) in enumerate(zip(slots.tolist(), ts.tolist(), ends.tolist())):
            fields = episode_fields(store, slot)
            if end == fields[3] and end > t:
                row = lookback + end - t - 1
                terminateds[i, row] = fields[5]
                truncateds[i, row] = fields[6] and not fields[5]
        batch["terminateds"], batch["truncateds"], batch["mask"] = terminateds, truncateds, mask
        return batch

    def _after_reads(self, rows: int) -> None:
        # File-backed storage: the pages a draw mapped in (a read maps up to
        # 64 KB around a row: the kernel's fault-around) go back to the files
        # after the draw, so the resident size stays bounded however large
        # the files grow.
        if self._store.storage is not None:
            self._store.release_pages()

    def _log_sample(self, sampled, episodes_per_sample, steps_per_sample, sampled_n_step,
                    resamples) -> None:
        single = {DEFAULT_AGENT_ID: None}
        self._update_sample_metrics(
            num_env_steps_sampled=sampled, num_episodes_per_sample=episodes_per_sample,
            num_env_steps_per_sample=steps_per_sample, sampled_n_step=sampled_n_step,
            num_resamples=resamples,
            agent_to_num_steps_sampled={DEFAULT_AGENT_ID: sampled},
            agent_to_num_episodes_per_sample={DEFAULT_AGENT_ID: episodes_per_sample},
            agent_to_num_steps_per_sample={DEFAULT_AGENT_ID: steps_per_sample},
            agent_to_sampled_n_step=None if sampled_n_step is None
            else dict.fromkeys(single, sampled_n_step),
            agent_to_num_resamples={DEFAULT_AGENT_ID: resamples},
            module_to_num_steps_sampled={DEFAULT_MODULE_ID: sampled},
            module_to_num_episodes_per_sample={DEFAULT_MODULE_ID: episodes_per_sample},
            module_to_num_steps_per_sample={DEFAULT_MODULE_ID: steps_per_sample},
            module_to_sampled_n_step=None if sampled_n_step is None
            else {DEFAULT_MODULE_ID: sampled_n_step},
            module_to_num_resamples={DEFAULT_MODULE_ID: resamples})

    def _update_sample_metrics(self, *, num_env_steps_sampled, num_episodes_per_sample,
                               num_env_steps_per_sample, sampled_n_step, num_resamples,
                               agent_to_num_steps_sampled, agent_to_num_episodes_per_sample,
                               agent_to_num_steps_per_sample, agent_to_sampled_n_step,
                               agent_to_num_resamples, module_to_num_steps_sampled,
                               module_to_num_episodes_per_sample,
                               module_to_num_steps_per_sample, module_to_sampled_n_step,
                               module_to_num_resamples, **kwargs) -> None:
        """Logs a sample() call's counts (RLlib's keys and reductions)."""
        log = self._unlogged.log
        window = self._metrics_num_episodes_for_smoothing
        log("num_episodes_per_sample", num_episodes_per_sample, reduce="sum")
        log("num_env_steps_per_sample", num_env_steps_per_sample, reduce="sum")
        log("num_env_steps_per_sample_lifetime", num_env_steps_per_sample,
            reduce="lifetime_sum")
        _log_pair(log, "num_env_steps_sampled", num_env_steps_sampled)
        log("env_step_utilization", num_env_steps_per_sample / num_env_steps_sampled,
            reduce="mean", window=window)
        if sampled_n_step:
            log("actual_n_step", sampled_n_step, reduce="mean", window=window)
            for aid in agent_to_sampled_n_step:
                log(("agent_actual_n_step", aid), agent_to_sampled_n_step[aid], reduce="mean",
                    window=window)
            for mid in module_to_sampled_n_step:
                log(("module_actual_n_step", mid), module_to_sampled_n_step[mid],
                    reduce="mean", window=window)
        log("num_resamples", num_resamples, reduce="sum")
        for aid in agent_to_num_steps_sampled:
            _log_pair(log, "num_agent_steps_sampled", agent_to_num_steps_sampled[aid], aid)
            log(("num_agent_episodes_per_sample", aid), agent_to_num_episodes_per_sample[aid],
                reduce="sum")
            _log_pair(log, "num_agent_steps_per_sample", agent_to_num_steps_per_sample[aid],
                      aid, lifetime="num_agent_steps_per_sample_lifetime")
            log(("agent_step_utilization", aid),
                agent_to_num_steps_per_sample[aid] / agent_to_num_steps_sampled[aid],
                reduce="mean", window=window)
            log(("num_agent_resamples", aid), agent_to_num_resamples[aid], reduce="sum")
        for mid in module_to_num_steps_sampled:
            _log_pair(log, "num_module_steps_sampled", module_to_num_steps_sampled[mid], mid)
            log(("num_module_episodes_per_sample", mid),
                module_to_num_episodes_per_sample[mid], reduce="sum")
            _log_pair(log, "num_module_steps_per_sample", module_to_num_steps_per_sample[mid],
                      mid, lifetime="num_module_steps_per_sample_lifetime")
            log(("module_step_utilization", mid),
                module_to_num_steps_per_sample[mid] / module_to_num_steps_sampled[mid],
                reduce="mean", window=window)
            log(("num_module_resamples", mid), module_to_num_resamples[mid], reduce="sum")

    # -- counters ------------------------------------------------------------------------

    def get_num_episodes(self, module_id=None) -> int:
        """Stored episodes."""
        return self._store.num_episodes

    def get_num_episodes_evicted(self, module_id=None) -> int:
        """Episodes evicted so far."""
        return self._store.num_evicted

    def get_num_timesteps(self, module_id=None) -> int:
        """Stored (sampleable) timesteps."""
        return self._store.live_steps

    def get_sampled_timesteps(self, module_id=None) -> int:
        """Timesteps sampled so far."""
        return self.sampled_timesteps

    def get_added_timesteps(self, module_id=None) -> int:
        """Timesteps added so far."""
        return self._num_timesteps_added

    def get_metrics(self):
        """The logged metrics, reduced (RLlib's MetricsLogger.reduce())."""
        return _reduced(self.metrics)

    # -- state ---------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        """RLlib's checkpoint of the buffer (its keys and formats)."""
        return self._plain_state(self.episodes)

    def _plain_state(self, episodes) -> Dict[str, Any]:
        # The plain buffer's keys (the multi-agent buffers' too, over theirs).
        return {
            "episodes": [e.get_state() for e in episodes],
            "episode_id_to_index": list(self.episode_id_to_index.items()),
            "_num_episodes_evicted": self._num_episodes_evicted,
            "_indices": self._indices,
            "_num_timesteps": self._num_timesteps,
            "_num_timesteps_added": self._num_timesteps_added,
            "sampled_timesteps": self.sampled_timesteps,
        }

    def set_state(self, state) -> None:
        """Restores get_state()'s checkpoint (ours or RLlib's). The state is
        checked first: a bad one raises and leaves the buffer unchanged."""
        self._check_state(state)
        store = self._restored_store(state)
        self._store = store
        self.__dict__.pop("_open_episodes", None)     # (add_transition()'s)
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]

    def __reduce__(self):
        # A pickle is the checkpoint (get_state(); arrays travel out-of-band
        # with protocol 5), restored into a new buffer of the same settings.
        return (_unpickled, (type(self), self._settings(), self._pickled_state(), self.rng))

    def _pickled_state(self) -> Dict[str, Any]:
        # The checkpoint a pickle of the buffer holds.
        return self.get_state()

    def _settings(self) -> Dict[str, Any]:
        return {"capacity": self.capacity, "batch_size_B": self.batch_size_B,
                "batch_length_T": self.batch_length_T,
                "metrics_num_episodes_for_smoothing": self._metrics_num_episodes_for_smoothing,
                "storage": self._store.storage,
                "frame_stack": None if self._stacked() is None else self._stacked()[0],
                "frame_stack_axis": None if self._stacked() is None else self._stacked()[1]}

    def _stacked(self):
        # The frame stacking of the stores that keep observations (None: off).
        return self._frames

    # -- kept in a folder ------------------------------------------------------------------

    def save(self, folder) -> None:
        """Keeps the buffer in `folder` (made if missing) for `open()`, in
        this process or a later one: each block of rows as a file (and,
        with `frame_stack`, each chunk of frames), and a metadata file with
        everything else (the stored episodes' layout, priorities, counters,
        `rng`, metrics; a multi-agent buffer's episodes, its stores per
        module and their priorities). Every kind of buffer is kept: single-
        or multi-agent, uniform or prioritized, whole rows or frame-stacked.
        The buffer itself is not changed and goes on as before.

        Whole or not at all: every file is written to a temporary name,
        synced and renamed, the metadata last, so the folder holds either
        the previous save or this one. Saving again into the folder a
        buffer was opened from writes only the blocks that are new since.
        One save at a time per folder (a lock: a second one waits).
        A folder that already holds a saved buffer gets this one instead;
        one whose metadata is damaged or not ours is refused (ValueError)
        and left as it is.

        Example::

            buffer.save("/data/replay")
            ...                                    # later, in any process
            buffer = EpisodeReplayBuffer.open("/data/replay")
        """
        kept.save(self, folder)

    @classmethod
    def open(cls, folder, *, verify: bool = False) -> "EpisodeReplayBuffer":
        """The buffer `save()` kept in `folder`, as it was then: the same
        get_state(), counters, metrics, priorities and `rng` state, so the
        same calls give the same samples; it adds, evicts and samples as
        the original would have. Its rows (and frames) are memory-mapped
        read-only from the folder's files (opening reads the metadata, not
        the rows: the pages come in as draws touch them; a multi-agent
        buffer's episodes are unpickled over their mapped arrays), and the
        rows it adds go to files of its own in the folder, removed from it
        at once (`storage=folder`). The folder's files are never written by it:
        open a folder as often as you like, in as many processes; each
        buffer goes its own way, and saving one into the folder replaces
        what the folder holds without disturbing the others.

        `open()` of a class gives that class (of a base class, the kind
        that was saved). Checked before anything is built: FileNotFoundError
        for a missing folder, metadata or other file, ValueError naming the
        file for a damaged, truncated, foreign or newer-format file, sizes
        that do not match or a frame number outside the saved frames,
        TypeError for a folder holding another kind of buffer.
        `verify=True` also checks each file's CRC-32 (reading every row
        once). Like a pickle, the metadata can hold any Python object
        (episode ids, spaces, infos): open only folders you trust."""
        return kept.open_buffer(cls, folder, verify)

    def _kept_stores(self) -> List[Tuple[Any, Store]]:
        # The stores save() keeps, by name, the buffer's own first.
        return [("store", self._store)]

    def _new_kept_store(self, name, folder: str) -> Store:
        # open(): a new store for the saved store `name`, to build.
        if name != "store":
            raise ValueError(f"a {kind_of(self)} has no store {name!r}")
        return self._new_store(self.capacity, folder)

    def _adopt_kept_stores(self, stores: Dict[Any, Store]) -> None:
        # open(): the built stores, before _restore_kept().
        if list(stores) != ["store"]:
            raise ValueError(f"a {kind_of(self)} has one store, not {list(stores)}")
        self._store = stores["store"]

    def _kept_state(self) -> Dict[str, Any]:
        # What save() keeps of the buffer besides its stores.
        # (RLlib's MetricsLogger holds a lock: its Stats are kept, in their
        # order, and go into a new logger.)
        logger = self.metrics
        if type(logger).__name__ == "MetricsLogger" and type(getattr(logger, "stats", None)) \
                is dict:
            metrics = ("stats", type(logger).__module__, logger.stats)
        else:
            metrics = ("logger", None, logger)
        return {"_num_timesteps": self._num_timesteps,
                "_num_timesteps_added": self._num_timesteps_added,
                "sampled_timesteps": self.sampled_timesteps, "rng": self.rng,
                "metrics": metrics, "open_episodes": self.__dict__.get("_open_episodes")}

    @classmethod
    def _plain_kept(cls, state: Dict[str, Any]) -> Dict[str, Any]:
        # _kept_state() as data for the kept metadata (episode.values): the
        # rng as its bit generator's state, the metrics and the open episodes
        # of add_transition() as their fields.
        bit_generator = state["rng"].bit_generator
        open_ = state["open_episodes"]
        return dict(state, rng=[type(bit_generator).__name__, bit_generator.state],
                    metrics=kept_metrics(state["metrics"]),
                    open_episodes=None if open_ is None else open_.kept())

    def _restore_kept(self, state: Dict[str, Any]) -> None:
        # open(): the buffer's part of what save() kept (its stores are set),
        # as _plain_kept() made it.
        for key in ("_num_timesteps", "_num_timesteps_added", "sampled_timesteps"):
            _int(state[key], key)
        rng = _generator_of(state["rng"])
        logger = restored_metrics(state["metrics"])
        open_ = None if state["open_episodes"] is None else \
            _OpenEpisodes.restored(state["open_episodes"])
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]
        self.rng = rng
        self.metrics = logger
        self.__dict__.pop("_open_episodes", None)
        if open_ is not None:
            self.__dict__["_open_episodes"] = open_

    def _check_state(self, state) -> None:
        """set_state()'s first check: a dict with the keys of this kind of
        buffer's checkpoints. TypeError for what is no dict; KeyError (as
        RLlib's, at the first key it reads) naming the missing keys and,
        where the keys are another buffer's, that buffer."""
        if not isinstance(state, dict):
            raise TypeError(f"set_state() takes a checkpoint of get_state() (a dict), not "
                            f"{type(state).__name__}")
        missing = [key for key in self._STATE_KEYS if key not in state]
        kinds = [cls for cls in KINDS if set(cls._STATE_KEYS) == set(state)]
        # (A prioritized buffer's checkpoint has a uniform one's keys and
        # more: RLlib's uniform buffers load it. A multi-agent one's is
        # refused by a single-agent buffer as RLlib's does, by a KeyError.)
        multi = "_module_to_indices" in self._STATE_KEYS
        if not missing and not (kinds and ("_module_to_indices" in kinds[0]._STATE_KEYS)
                                != multi):
            return
        whose = f" (it is the checkpoint of a {kinds[0].__name__})" if kinds else ""
        lacks = f"lacks {', '.join(map(repr, missing))}" if missing else \
            "is not a single-agent buffer's"
        raise KeyError(f"{kind_of(self)}.set_state() takes what get_state() of that kind of "
                       f"buffer returns; this checkpoint {lacks}{whose}")

    def _restored_store(self, state, weights=None) -> Store:
        episodes = [SingleAgentEpisode.from_state(s) for s in state["episodes"]]
        evicted = _int(state["_num_episodes_evicted"], "_num_episodes_evicted")
        for key in ("_num_timesteps", "_num_timesteps_added", "sampled_timesteps"):
            _int(state[key], key)
        id_to_index = dict(state["episode_id_to_index"])
        if list(id_to_index) != [e.id_ for e in episodes] or \
                list(id_to_index.values()) != list(range(evicted, evicted + len(episodes))):
            raise ValueError("episode_id_to_index must list the stored episodes in order, "
                             "indexed from _num_episodes_evicted on")
        store = self._new_store(self.capacity, self._store.storage)
        store.restore(episodes, _entries(state["_indices"], 2, weights is None), evicted,
                      weights)
        return store


def _entries(entries, fields: int, uniform: bool) -> list:
    """A checkpoint's `_indices` entries as tuples. Into a uniform buffer,
    a prioritized buffer's (their tree leaf last, one field more) lose the
    leaf: RLlib's uniform buffers load such a checkpoint too."""
    out = [tuple(entry) for entry in entries]
    if uniform and out and all(len(entry) == fields + 1 for entry in out):
        out = [entry[:fields] for entry in out]
    return out


def _unpickled(cls, settings: Dict[str, Any], state: Dict[str, Any], rng):
    buffer = cls(**settings)
    buffer.set_state(state)
    buffer.rng = rng
    return buffer


# The bit generators a kept rng may be of (numpy's own: nothing else is
# looked up by a name read from a file).
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")


def _generator_of(state: Any) -> np.random.Generator:
    # A kept rng ([bit generator name, its state]) back.
    if type(state) is not list or len(state) != 2 or state[0] not in _BIT_GENERATORS or \
            type(state[1]) is not dict:
        raise ValueError("the saved rng is not a numpy Generator's")
    bit_generator = getattr(np.random, state[0])()
    try:
        bit_generator.state = state[1]
    except (TypeError, ValueError, KeyError, OverflowError) as error:
        raise ValueError(f"the saved rng is not a numpy Generator's: {error}") from None
    return np.random.Generator(bit_generator)
