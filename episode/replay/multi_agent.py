"""MultiAgentEpisodeReplayBuffer: RLlib's multi-agent episode buffer,
its agents' steps in one Store per module ("independent" draws per module,
or whole env steps: "synchronized")."""
from __future__ import annotations

import collections
import copy
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from episode import _gather, _picks
from episode._replay import Store, episode_fields, step_order
from episode.single_agent_episode import SingleAgentEpisode
from episode.replay.draws import (_batch_size, _check_gamma, _checked_n_step, _discounted,
                                  _check_not_empty, _int, _native_args, _transitions,
                                  _warn_misspelt)
from episode.replay.frames import frame_settings, store_args
from episode.replay.metrics import _MultiCounts, _SampleCounts
from episode.replay.stored import (_as_ours_multi, _env_steps_chunk, _episode_indices,
                                   _force_list, _numbers_as_numbers)
from episode.replay.tensors import _check_numeric, _to_torch, _torch_device
from episode.replay.uniform import EpisodeReplayBuffer, _entries


class MultiAgentEpisodeReplayBuffer(EpisodeReplayBuffer):
    """RLlib's MultiAgentEpisodeReplayBuffer on the compiled store.

    Keeps the multi-agent episodes (ours or RLlib's; a chunk with a stored
    id is joined to it) and, per module, its agents' steps in a Store of
    their own: `sample()` draws each module's n-step transitions there
    ("independent" replay), or whole env steps ("synchronized").
    `frame_stack` and `frame_stack_axis` store each module's frame-stacked
    observations once per frame (see EpisodeReplayBuffer)."""

    _STATE_KEYS = EpisodeReplayBuffer._STATE_KEYS + (
        "_module_to_indices", "_num_agent_timesteps", "_num_agent_timesteps_added",
        "_num_module_timesteps", "_num_module_timesteps_added", "_num_module_episodes",
        "_num_module_episodes_evicted", "sampled_timesteps_per_module")

    def __init__(self, capacity: int = 10000, *, batch_size_B: int = 16,
                 batch_length_T: int = 1, metrics_num_episodes_for_smoothing: int = 100,
                 storage=None, seed=None, frame_stack=None, frame_stack_axis=None, **kwargs):
        _warn_misspelt(self, MultiAgentEpisodeReplayBuffer.__init__, kwargs)
        # (The env steps' store keeps no observations: the modules' do.)
        self._module_frames = frame_settings(frame_stack, frame_stack_axis)
        super().__init__(capacity=capacity, batch_size_B=batch_size_B,
                         batch_length_T=batch_length_T,
                         metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
                         storage=storage, seed=seed)
        self._storage = storage
        self._multi_episodes: collections.deque = collections.deque()
        self._modules: Dict[Any, Store] = {}
        self._num_agent_timesteps = 0
        self._num_module_timesteps = collections.defaultdict(int)
        self._num_agent_timesteps_added = 0
        self._num_module_timesteps_added = collections.defaultdict(int)
        self._num_module_episodes = collections.defaultdict(int)
        self._num_module_episodes_evicted = collections.defaultdict(int)
        self.sampled_timesteps_per_module = collections.defaultdict(int)

    def _new_module_store(self) -> Store:
        return Store(self.capacity, storage=self._storage, **store_args(self._module_frames))

    def _stacked(self):
        return self._module_frames

    # -- RLlib's attributes ------------------------------------------------------------------

    @property
    def episodes(self) -> collections.deque:
        """The stored multi-agent episodes, oldest first (live: RLlib hands
        out its own stored episodes too)."""
        return self._multi_episodes

    def _ma_index(self) -> Dict[Any, int]:
        first = self._store.num_evicted
        return {e.id_: first + i for i, e in enumerate(self._multi_episodes)}

    @property
    def episode_id_to_index(self) -> Dict[Any, int]:
        return self._ma_index()

    @property
    def _indices(self) -> list:
        index = _episode_indices(self._store)
        return [(index[slot], ts) for slot, ts, _ in step_order(self._store)]

    @property
    def _module_to_indices(self) -> Dict[Any, list]:
        out = collections.defaultdict(list)
        for module_id, store in self._modules.items():
            out[module_id] = self._module_entries(module_id, store)
        return out

    def _module_entries(self, module_id, store: Store) -> list:
        index = self._ma_index()
        keys = {slot: store_key for store_key, slot in store.stored_keys().items()}
        return [(index[keys[slot][0]], keys[slot][1], ts)
                for slot, ts, _ in step_order(store)]

    # -- adding ------------------------------------------------------------------------------

    def add(self, episodes) -> None:
        """Adds multi-agent episodes as RLlib's buffer does: the oldest
        episodes are evicted first until the new env steps fit (a new chunk
        of an evicted episode is dropped with it), then each episode is
        stored (or joined to its stored part) and its agents' steps go to
        their modules. Checked first: a bad episode changes nothing."""
        episodes = [_as_ours_multi(e) for e in _force_list(episodes)]
        self._check_multi(episodes)
        self._add_multi(episodes, None)

    def add_transition(self, obs, next_obs, action, reward, terminated, truncated,
                       infos=None) -> None:
        """The single-agent buffers' transition add has no agents to put the
        steps under: TypeError. add() MultiAgentEpisodes (or their chunks)
        here."""
        raise TypeError(f"{type(self).__name__} stores MultiAgentEpisodes: add() them (or "
                        f"their chunks); add_transition() is the single-agent buffers'")

    def _check_multi(self, episodes) -> None:
        pending: dict = {}
        per_module: Dict[Any, dict] = collections.defaultdict(dict)
        earlier = {e.id_: e for e in self._multi_episodes}
        for episode in episodes:
            self._store.check(_env_steps_chunk(episode), pending)
            before = earlier.get(episode.id_)
            if before is not None:
                # RLlib's concat_episode asserts that each agent continues its
                # own single-agent episode.
                for agent_id, agent_episode in episode.agent_episodes.items():
                    other = before.agent_episodes.get(agent_id)
                    if other is not None and other.id_ != agent_episode.id_:
                        raise AssertionError(
                            f"agent {agent_id!r}'s chunk (id {agent_episode.id_!r}) does not "
                            f"continue its stored episode (id {other.id_!r})")
            earlier[episode.id_] = episode
            for agent_id, agent_episode in episode.agent_episodes.items():
                if _agent_done(before, agent_id):
                    continue
                module_id = episode.module_for(agent_id)
                store = self._modules.get(module_id)
                if store is None:
                    store = self._modules_pending(per_module, module_id)
                store.check(_fitted(agent_episode, store), per_module[module_id],
                            key=(episode.id_, agent_id))

    def _modules_pending(self, per_module, module_id) -> Store:
        # A module seen first in this call: checked against a scratch store.
        scratch = per_module.setdefault(("store", module_id), {})
        if "store" not in scratch:
            scratch["store"] = self._new_module_store()
        return scratch["store"]

    def _add_multi(self, episodes, weight) -> None:
        counts = _MultiCounts()
        new_ids = [e.id_ for e in episodes]
        total = sum(e.env_steps() for e in episodes)
        self._num_timesteps += total
        self._num_timesteps_added += total
        evicted_ids: list = []
        # RLlib's count of the episodes left: stored or new, not evicted.
        remaining = len(self._multi_episodes) + len(
            {i for i in new_ids if i not in self._store})
        while self._num_timesteps > self.capacity and self._multi_episodes and \
                remaining - len(evicted_ids) != 1:
            evicted = self._multi_episodes.popleft()
            evicted_ids.append(evicted.id_)
            if evicted.id_ in new_ids:
                dropped = episodes.pop(new_ids.index(evicted.id_))
                new_ids.remove(evicted.id_)
                self._num_timesteps -= dropped.env_steps()
                self._num_timesteps_added -= dropped.env_steps()
            self._num_timesteps -= evicted.env_steps()
            self._num_agent_timesteps -= evicted.agent_steps()
            counts.episodes_evicted += 1
            counts.env_steps_evicted += evicted.env_steps()
            for agent_id, agent_episode in evicted.agent_episodes.items():
                module_id = evicted._agent_to_module_mapping[agent_id]
                counts.agent_episodes_evicted[agent_id] += 1
                counts.module_episodes_evicted[module_id] += 1
                counts.agent_steps_evicted[agent_id] += agent_episode.agent_steps()
                counts.module_steps_evicted[module_id] += agent_episode.agent_steps()
                self._num_module_timesteps[module_id] -= agent_episode.env_steps()
                self._num_module_episodes[module_id] -= 1
                self._num_module_episodes_evicted[module_id] += 1
        if evicted_ids:
            self._evict_stores(evicted_ids)
        for episode in episodes:
            self._num_agent_timesteps += episode.agent_steps()
            self._num_agent_timesteps_added += episode.agent_steps()
            for agent_id in episode.agent_ids:
                steps = episode.agent_episodes[agent_id].env_steps()
                if steps > 0:
                    module_id = episode.module_for(agent_id)
                    self._num_module_timesteps[module_id] += steps
                    self._num_module_timesteps_added[module_id] += steps
        stored = {e.id_: e for e in self._multi_episodes}
        for episode in episodes:
            existing = stored.get(episode.id_)
            self._store.add(_env_steps_chunk(episode), weight)
            self._add_agents(episode, existing)
            if existing is not None:
                existing.concat_episode(copy.deepcopy(episode))
                # (The agents new in this chunk map as the chunk mapped them:
                # a stored episode needs no mapping function of its own, which
                # one opened from a folder has not.)
                for agent_id, module_id in episode._agent_to_module_mapping.items():
                    existing._agent_to_module_mapping.setdefault(agent_id, module_id)
            else:
                copied = copy.deepcopy(episode)
                self._multi_episodes.append(copied)
                stored[episode.id_] = copied
                counts.episodes_added += 1
                for agent_id in episode.agent_episodes:
                    counts.agent_episodes_added[agent_id] += 1
                    counts.module_episodes_added[episode._agent_to_module_mapping[agent_id]] += 1
            counts.env_steps_added += episode.env_steps()
            for agent_id, agent_episode in episode.agent_episodes.items():
                module_id = episode._agent_to_module_mapping[agent_id]
                counts.agent_steps_added[agent_id] += agent_episode.agent_steps()
                counts.module_steps_added[module_id] += agent_episode.agent_steps()
        self._update_add_metrics(
            num_episodes_added=counts.episodes_added, num_env_steps_added=counts.env_steps_added,
            num_episodes_evicted=counts.episodes_evicted,
            num_env_steps_evicted=counts.env_steps_evicted,
            agent_to_num_episodes_added=counts.agent_episodes_added,
            agent_to_num_steps_added=counts.agent_steps_added,
            agent_to_num_episodes_evicted=counts.agent_episodes_evicted,
            agent_to_num_steps_evicted=counts.agent_steps_evicted,
            module_to_num_episodes_added=counts.module_episodes_added,
            module_to_num_steps_added=counts.module_steps_added,
            module_to_num_episodes_evicted=counts.module_episodes_evicted,
            module_to_num_steps_evicted=counts.module_steps_evicted)

    def _agent_order(self, episode):
        # The order RLlib's _add_new_module_indices takes the agents in.
        return list(episode.agent_episodes)

    def _add_agents(self, episode, existing) -> None:
        # Each agent's steps go to its module's store (RLlib's
        # _add_new_module_indices, in the same order).
        for agent_id in self._agent_order(episode):
            if _agent_done(existing, agent_id):
                continue
            agent_episode = episode.agent_episodes[agent_id]
            module_id = episode.module_for(agent_id)
            store = self._modules.get(module_id)
            if store is None:
                store = self._modules[module_id] = self._new_module_store()
            if existing is None or agent_id not in existing.agent_episodes:
                self._num_module_episodes[module_id] += 1
            store.add(_fitted(agent_episode, store), self._module_weight(module_id),
                      key=(episode.id_, agent_id))

    def _module_weight(self, module_id):
        return None

    def _evict_stores(self, evicted_ids) -> None:
        store = self._store
        stored = store.stored_keys()
        store.evict([stored[i] for i in evicted_ids if i in stored])
        gone = set(evicted_ids)
        for module_store in self._modules.values():
            slots = [slot for key, slot in module_store.stored_keys().items() if key[0] in gone]
            if slots:
                module_store.evict(slots)

    # -- sampling ------------------------------------------------------------------------

    def sample(self, num_items: Optional[int] = None, *, batch_size_B: Optional[int] = None,
               batch_length_T: Optional[int] = None, n_step: Optional[Union[int, Tuple]] = 1,
               gamma: float = 0.99, include_infos: bool = False,
               include_extra_model_outputs: bool = False, replay_mode: str = "independent",
               modules_to_sample: Optional[List[Any]] = None, **kwargs):
        """RLlib's multi-agent sample(): per module `batch_size_B` n-step
        transitions of its agents ("independent", a list of single-agent
        episodes), or env steps with every agent that has a whole transition
        there ("synchronized", a dict of batches per module)."""
        _check_gamma(gamma)
        batch_size_B = _batch_size(num_items, batch_size_B) or self.batch_size_B
        batch_length_T = batch_length_T or self.batch_length_T
        if replay_mode == "independent":
            return self._sample_independent(
                batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
                gamma=gamma, include_infos=include_infos,
                include_extra_model_outputs=include_extra_model_outputs,
                modules_to_sample=modules_to_sample)
        return self._sample_synchonized(
            batch_size_B=batch_size_B, batch_length_T=batch_length_T, n_step=n_step,
            gamma=gamma, include_infos=include_infos,
            include_extra_model_outputs=include_extra_model_outputs,
            modules_to_sample=modules_to_sample)

    def sample_batch(self, batch_size: int, *, n_step: Union[int, Tuple[int, int]] = 1,
                     gamma: float = 0.99, beta: Optional[float] = None,
                     batch_length_T: Optional[int] = None, lookback: int = 0,
                     min_batch_length_T: int = 0, include_extra_model_outputs: bool = False,
                     modules_to_sample: Optional[List[Any]] = None, device: Any = None
                     ) -> Dict[Any, Dict[str, Any]]:
        """Per module, a training batch of `batch_size` items from its
        agents' steps, as a dict of arrays without episode objects: each
        module's batch is drawn from that module's steps alone, as the
        single-agent buffers' sample_batch() draws (the same arguments, keys
        and shapes; by priority on the prioritized buffer, whose
        update_priorities(priorities, module_id) then sets the drawn steps'
        priorities). `modules_to_sample`: the modules to draw for (default:
        every module with stored steps), in that order. `device` makes each
        module's arrays torch tensors there, as the single-agent
        sample_batch(device=...) does (zero-copy on the CPU).

        Example::

            batches = buffer.sample_batch(32, n_step=3, gamma=0.99)
            for module_id, batch in batches.items():
                obs, actions = batch["obs"], batch["actions"]      # (32, ...) arrays
                targets = batch["rewards"] + (0.99 ** batch["n_step"]) * (
                    1 - batch["terminateds"]) * next_values(module_id, batch["new_obs"])

        ValueError where there is nothing to draw from (no stored steps, or
        a module in `modules_to_sample` without any), before any draw."""
        args = _native_args(self._prioritized(), batch_size, n_step, gamma, beta,
                            batch_length_T, lookback, min_batch_length_T,
                            include_extra_model_outputs)
        if modules_to_sample is None:
            modules = [m for m, store in self._modules.items() if store.live_steps]
            if not modules:
                raise ValueError("the buffer holds no timesteps to sample")
        else:
            modules = list(modules_to_sample)
            for module_id in modules:
                store = self._modules.get(module_id)
                if store is None or not store.live_steps:
                    raise ValueError(f"module {module_id!r} has no stored timesteps to sample "
                                     f"(modules with some: "
                                     f"{[m for m, s in self._modules.items() if s.live_steps]})")
        if device is not None:
            torch, device = _torch_device(device)
            for module_id in modules:
                _check_numeric(self._modules[module_id], args.extras)
        batches = {}
        items = batch_size * (args.T or 1)     # (counted as sample() counts them)
        for module_id in modules:
            store = self._modules[module_id]
            batches[module_id] = self._native_batch(store, args)
            self._drawn_natively(module_id, store, batches[module_id]["indices"])
            self.sampled_timesteps_per_module[module_id] += items
            if store.storage is not None:
                store.release_pages()
        self.sampled_timesteps += items
        if device is not None:
            return {module_id: _to_torch(batch, torch, device)
                    for module_id, batch in batches.items()}
        return batches

    def _prioritized(self) -> bool:
        return False

    def _drawn_natively(self, module_id, store: Store, indices) -> None:
        """What a prioritized buffer keeps of a module's sample_batch()."""

    def _draw_module(self, module_id, store, draws, batch_size_B, n_step, beta):
        return _picks.draw_transitions(store, draws, batch_size_B, n_step), None

    def _sample_independent(self, batch_size_B, batch_length_T, n_step, gamma, include_infos,
                            include_extra_model_outputs, modules_to_sample, beta=None):
        n_step = _checked_n_step(n_step or 1)
        counts = _SampleCounts()
        episodes: list = []
        draws = self._draws()
        modules = modules_to_sample or set(self._module_keys())
        if not modules:
            # RLlib's: its metrics divide by the zero steps sampled (after
            # counting the draw); ours before anything changes.
            raise ZeroDivisionError("sample(): the buffer holds no timesteps yet; add() "
                                    "episodes before sampling")
        agent_id = None
        for module_id in modules:
            store = self._module_store(module_id)
            picks, weights = self._draw_module(module_id, store, draws, batch_size_B, n_step,
                                               beta)
            slots, ts, ns, ends = _gather.pick_fields(store, picks)
            _gather.locate_ends(store, picks)
            sampled = _transitions(store, picks, slots, ts, ns, ends, gamma,
                                   include_infos=include_infos, stored_ids=True,
                                   extras=include_extra_model_outputs,
                                   weights=weights if weights is not None
                                   else [1.0] * len(picks))
            keys = {slot: key for key, slot in store.stored_keys().items()}
            stored = {e.id_: e for e in self._multi_episodes}
            counts.resamples += picks.resamples
            counts.module_resamples[module_id] += picks.resamples
            for slot in picks.rejected:
                counts.agent_resamples[keys[slot][1]] += 1
            for episode, slot, t, n in zip(sampled, slots.tolist(), ts.tolist(), ns.tolist()):
                ma_id, agent_id = keys[slot]
                multi = stored[ma_id]
                episode.multi_agent_episode_id = ma_id
                counts.episode_idxs.add(ma_id)
                counts.agent_episode_ids[agent_id].add(episode.id_)
                counts.module_episode_ids[module_id].add(episode.id_)
                env_t = _env_step(multi, agent_id, t)
                counts.env_steps.add((ma_id, env_t))
                counts.agent_steps[agent_id].add((episode.id_, t))
                counts.module_steps[module_id].add((episode.id_, t))
                counts.n_steps.append(n)
                counts.agent_n_steps[agent_id].append(n)
                counts.module_n_steps[module_id].append(n)
            episodes.extend(sampled)
            B = len(picks)
            self.sampled_timesteps_per_module[module_id] += B
            counts.sampled += B
            counts.agent_sampled[agent_id] += B
            counts.module_sampled[module_id] += B
        self.sampled_timesteps += batch_size_B
        self._update_sample_metrics(
            num_env_steps_sampled=counts.sampled,
            num_episodes_per_sample=len(counts.episode_idxs),
            num_env_steps_per_sample=len(counts.env_steps),
            sampled_n_step=sum(counts.n_steps) / batch_size_B,
            num_resamples=counts.resamples,
            agent_to_num_steps_sampled=counts.agent_sampled,
            agent_to_num_episodes_per_sample={a: len(v) for a, v in
                                              counts.agent_episode_ids.items()},
            agent_to_num_steps_per_sample={a: len(v) for a, v in counts.agent_steps.items()},
            agent_to_sampled_n_step={a: sum(v) / len(v) for a, v in
                                     counts.agent_n_steps.items()},
            agent_to_num_resamples=counts.agent_resamples,
            module_to_num_steps_sampled=counts.module_sampled,
            module_to_num_episodes_per_sample={m: len(v) for m, v in
                                               counts.module_episode_ids.items()},
            module_to_num_steps_per_sample={m: len(v) for m, v in counts.module_steps.items()},
            module_to_sampled_n_step={m: sum(v) / len(v) for m, v in
                                      counts.module_n_steps.items()},
            module_to_num_resamples=counts.module_resamples)
        return episodes

    def _module_keys(self) -> list:
        return list(self._modules)

    def _module_store(self, module_id) -> Store:
        store = self._modules.get(module_id)
        if store is None:
            store = self._modules[module_id] = self._new_module_store()
        return store

    def _sample_synchonized(self, batch_size_B, batch_length_T, n_step, gamma, include_infos,
                            include_extra_model_outputs, modules_to_sample):
        random_n = isinstance(n_step, tuple)
        n = None if random_n else (n_step or 1)
        if random_n:
            n_step = _checked_n_step(n_step)
        _check_not_empty(self._store)
        draws = self._draws()
        stored = {e.id_: e for e in self._multi_episodes}
        columns = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds",
                   "weights", "n_step")
        data: Dict[Any, Dict[str, list]] = {}
        wanted = modules_to_sample or self._modules.keys()
        per_module: Dict[Any, int] = collections.Counter()
        B = tries = 0
        while B < batch_size_B:
            tries += 1
            if tries > 1_000_000 + 100 * batch_size_B:
                raise ValueError(f"no item after {tries - 1} draws: no stored env step has "
                                 f"n-step transitions of its agents")
            slot, ts = _picks.uniform_step(self._store, draws)
            if random_n:
                n = draws.draw_integers(*n_step)
            if ts - n < 0:
                continue
            episode = stored[episode_fields(self._store, slot)[0]]
            # (An agent done in an earlier chunk keeps the mapping of that
            # chunk (RLlib's concat does not extend it), too short for the
            # later steps, where RLlib's getters fail with an IndexError: it
            # has no step there, so it is left out.)
            mappings = episode.env_t_to_agent_t
            ids = None if all(len(m) > ts for m in mappings.values()) else \
                [a for a, m in mappings.items() if len(m) > ts]
            observations = episode.get_observations(slice(ts - n, ts + 1), agent_ids=ids,
                                                    return_list=True)
            actions = episode.get_actions(ts - n, agent_ids=ids)
            agents = [a for a in observations[0] if a in actions and a in observations[-1]]
            if not agents:
                continue
            rewards = episode.get_rewards(slice(ts - n, ts), agent_ids=ids, return_list=True)
            done_here = ts == episode.env_t
            for agent_id in agents:
                module_id = episode._agent_to_module_mapping[agent_id]
                if module_id not in wanted:
                    continue
                rows = data.setdefault(module_id, {c: [] for c in columns})
                rows["obs"].append(observations[0][agent_id])
                rows["new_obs"].append(observations[-1][agent_id])
                rows["rewards"].append(_discounted([r[agent_id] or 0.0 for r in rewards], gamma))
                rows["actions"].append(actions[agent_id])
                agent_t = episode.env_t_to_agent_t[agent_id][ts]
                agent_episode = episode.agent_episodes[agent_id]
                terminated = (done_here and episode.is_terminated) or (
                    agent_t == agent_episode.t and agent_episode.is_terminated)
                truncated = (done_here and episode.is_truncated) or (
                    agent_t == agent_episode.t and agent_episode.is_truncated)
                rows["terminateds"].append(bool(terminated))
                rows["truncateds"].append(bool(truncated))
                rows["weights"].append(1.0)
                rows["n_step"].append(n)
                per_module[module_id] += 1
            B += 1
        for module_id, count in per_module.items():
            self.sampled_timesteps_per_module[module_id] += count
        self.sampled_timesteps += batch_size_B
        from episode.spaces import stack as batch_items

        return {module_id: {"obs": batch_items(rows["obs"]),
                            "actions": batch_items(rows["actions"]),
                            "rewards": np.array(rows["rewards"]),
                            "new_obs": batch_items(rows["new_obs"]),
                            "terminateds": np.array(rows["terminateds"]),
                            "truncateds": np.array(rows["truncateds"]),
                            "weights": np.array(rows["weights"]),
                            "n_step": np.array(rows["n_step"])}
                for module_id, rows in data.items()}

    # -- counters --------------------------------------------------------------------------

    def get_added_agent_timesteps(self) -> int:
        """Agent timesteps added so far."""
        return self._num_agent_timesteps_added

    def get_module_ids(self) -> list:
        """The modules whose agents' steps are stored."""
        return list(self._modules)

    def get_num_agent_timesteps(self) -> int:
        """Stored agent timesteps."""
        return self._num_agent_timesteps

    def get_num_episodes(self, module_id=None) -> int:
        return self._num_module_episodes[module_id] if module_id else self._store.num_episodes

    def get_num_episodes_evicted(self, module_id=None) -> int:
        return self._num_module_episodes_evicted[module_id] if module_id \
            else self._store.num_evicted

    def get_num_timesteps(self, module_id=None) -> int:
        return self._num_module_timesteps[module_id] if module_id else self._store.live_steps

    def get_sampled_timesteps(self, module_id=None) -> int:
        return self.sampled_timesteps_per_module[module_id] if module_id \
            else self.sampled_timesteps

    def get_added_timesteps(self, module_id=None) -> int:
        return self._num_module_timesteps_added[module_id] if module_id \
            else self._num_timesteps_added

    # -- state ------------------------------------------------------------------------------

    def get_state(self) -> Dict[str, Any]:
        return self._plain_state(self._multi_episodes) | self._multi_state()

    def set_state(self, state) -> None:
        """Restores get_state()'s checkpoint (ours or RLlib's), checked
        first: a bad one raises and leaves the buffer unchanged."""
        from episode.multi_agent_episode import MultiAgentEpisode

        self._check_state(state)
        episodes = [MultiAgentEpisode.from_state(s) for s in state["episodes"]]
        evicted = _int(state["_num_episodes_evicted"], "_num_episodes_evicted")
        for key in ("_num_timesteps", "_num_timesteps_added", "sampled_timesteps",
                    "_num_agent_timesteps", "_num_agent_timesteps_added"):
            _int(state[key], key)
        if [k for k, _ in state["episode_id_to_index"]] != [e.id_ for e in episodes] or \
                [v for _, v in state["episode_id_to_index"]] != \
                list(range(evicted, evicted + len(episodes))):
            raise ValueError("episode_id_to_index must list the stored episodes in order, "
                             "indexed from _num_episodes_evicted on")
        store = self._new_store(self.capacity, self._storage)
        store.restore([_env_steps_chunk(e) for e in episodes],
                      _entries(state["_indices"], 2, not self._prioritized()), evicted,
                      self._global_weights(state))
        modules = {}
        for module_id, entries in dict(state["_module_to_indices"]).items():
            modules[module_id] = self._restored_module(
                module_id, episodes, evicted,
                _entries(entries, 3, not self._prioritized()), state)
        counters = {key: collections.defaultdict(int, dict(state[key])) for key in (
            "_num_module_timesteps", "_num_module_timesteps_added", "_num_module_episodes",
            "_num_module_episodes_evicted", "sampled_timesteps_per_module")}
        self._restore_priorities(state, store, modules)
        self._store = store
        self._multi_episodes = collections.deque(episodes)
        self._modules = modules
        self._num_timesteps = state["_num_timesteps"]
        self._num_timesteps_added = state["_num_timesteps_added"]
        self.sampled_timesteps = state["sampled_timesteps"]
        self._num_agent_timesteps = state["_num_agent_timesteps"]
        self._num_agent_timesteps_added = state["_num_agent_timesteps_added"]
        for key, counter in counters.items():
            setattr(self, key, counter)

    def _restored_module(self, module_id, episodes, evicted, entries, state) -> Store:
        # A module's store, its agents' steps in the order of its entries.
        by_key = {(e.id_, agent_id): agent_episode for e in episodes
                  for agent_id, agent_episode in e.agent_episodes.items()
                  if e.module_for(agent_id) == module_id}
        index_of = {e.id_: evicted + i for i, e in enumerate(episodes)}
        id_of = {v: k for k, v in index_of.items()}
        order: list = []
        for entry in entries:
            if len(entry) < 3 or entry[0] not in id_of:
                raise ValueError(f"module {module_id!r}: entry {entry!r} names no stored "
                                 f"episode")
            key = (id_of[entry[0]], entry[1])
            if key not in by_key:
                raise ValueError(f"module {module_id!r}: entry {entry!r} names no agent of "
                                 f"the module")
            if key not in order:
                order.append(key)
        order += [key for key in by_key if key not in order]
        position = {key: i for i, key in enumerate(order)}
        indices = [(position[(id_of[entry[0]], entry[1])],) + tuple(entry[2:])
                   for entry in entries]
        store = self._new_module_store()
        store.restore(_alike([by_key[key] for key in order]), indices, 0,
                      self._module_weights(module_id, state), keys=order)
        return store

    def _global_weights(self, state):
        return None

    def _module_weights(self, module_id, state):
        return None

    def _restore_priorities(self, state, store: Store, modules: Dict[Any, Store]) -> None:
        """Uniform buffers keep no priorities; the prioritized one restores its trees."""

    # -- kept in a folder (save() / open(): see EpisodeReplayBuffer) --------------------

    def _kept_stores(self) -> List[Tuple[Any, Store]]:
        # The env steps' store, then each module's, in the modules' order.
        return [("store", self._store)] + [(("module", module_id), store)
                                          for module_id, store in self._modules.items()]

    def _new_kept_store(self, name, folder: str) -> Store:
        if name == "store":
            return self._new_store(self.capacity, folder)
        if type(name) is not tuple or len(name) != 2 or name[0] != "module":
            raise ValueError(f"a {type(self).__name__} has no store {name!r}")
        hash(name[1])
        return self._new_module_store()

    def _adopt_kept_stores(self, stores: Dict[Any, Store]) -> None:
        names = list(stores)
        if names[:1] != ["store"]:
            raise ValueError("the env steps' store is missing")
        self._store = stores["store"]
        self._modules = {name[1]: stores[name] for name in names[1:]}

    def _kept_state(self) -> Dict[str, Any]:
        return super()._kept_state() | {
            "modules": list(self._modules), "multi_episodes": list(self._multi_episodes),
            "_num_agent_timesteps": self._num_agent_timesteps,
            "_num_agent_timesteps_added": self._num_agent_timesteps_added,
            **{key: list(getattr(self, key).items()) for key in _MODULE_COUNTERS}}

    @classmethod
    def _plain_kept(cls, state: Dict[str, Any]) -> Dict[str, Any]:
        # The episodes as data: each one's own fields and its agents' states
        # (its mapping function is code: the resolved mapping is kept).
        return dict(super()._plain_kept(state), multi_episodes=[
            [e.id_, e._data_state(), [[aid, ae.get_state()] for aid, ae in
                                     e.agent_episodes.items()]]
            for e in state["multi_episodes"]])

    def _restore_kept(self, state: Dict[str, Any]) -> None:
        # (The stores are set; the episodes must be theirs, in their order.)
        if state["modules"] != list(self._modules):
            raise ValueError(f"the saved stores are of modules {list(self._modules)}, the "
                             f"buffer's of {state['modules']!r}")
        episodes = _kept_episodes(state["multi_episodes"])
        if [e.id_ for e in episodes] != list(self._store.stored_keys()):
            raise ValueError("the saved episodes are not the env steps' store's")
        by_id = {e.id_: e for e in episodes}
        for module_id, store in self._modules.items():
            for key in store.stored_keys():
                episode = by_id.get(key[0]) if type(key) is tuple and len(key) == 2 else None
                if episode is None or key[1] not in episode.agent_episodes or \
                        episode._agent_to_module_mapping.get(key[1]) != module_id:
                    raise ValueError(f"module {module_id!r}'s store holds {key!r}, no agent "
                                     f"of the module in a saved episode")
        for key in ("_num_agent_timesteps", "_num_agent_timesteps_added"):
            _int(state[key], key)
        counters = {}
        for key in _MODULE_COUNTERS:
            items = state[key]
            if type(items) is not list or not all(
                    type(item) is tuple and len(item) == 2 and type(item[1]) is int
                    for item in items):
                raise ValueError(f"the saved {key} are not counts by module")
            counters[key] = collections.defaultdict(int, items)
        super()._restore_kept(state)
        self._multi_episodes = collections.deque(episodes)
        self._num_agent_timesteps = state["_num_agent_timesteps"]
        self._num_agent_timesteps_added = state["_num_agent_timesteps_added"]
        for key, counter in counters.items():
            setattr(self, key, counter)

    def _multi_state(self) -> Dict[str, Any]:
        return {
            "_module_to_indices": list(self._module_to_indices.items()),
            "_num_agent_timesteps": self._num_agent_timesteps,
            "_num_agent_timesteps_added": self._num_agent_timesteps_added,
            "_num_module_timesteps": list(self._num_module_timesteps.items()),
            "_num_module_timesteps_added": list(self._num_module_timesteps_added.items()),
            "_num_module_episodes": list(self._num_module_episodes.items()),
            "_num_module_episodes_evicted": list(self._num_module_episodes_evicted.items()),
            "sampled_timesteps_per_module": list(self.sampled_timesteps_per_module.items()),
        }


# The buffer's counts by module (defaultdicts of ints).
_MODULE_COUNTERS = ("_num_module_timesteps", "_num_module_timesteps_added",
                    "_num_module_episodes", "_num_module_episodes_evicted",
                    "sampled_timesteps_per_module")


def _alike(episodes: list) -> list:
    """The agents' episodes of one module with each numpy'ized track in one
    dtype: RLlib's concat_episode turns an agent's int actions into float64
    when a chunk has no step of it (so does ours, as a drop-in), and a
    module's store has one dtype per track. Such float64 tracks go back to
    the int dtype of the others where no value changes (else the store
    refuses the state)."""
    tracks = ("observations", "actions", "rewards")
    wanted = {}
    for track in tracks:
        # (Only numpy'ized tracks: `.data` of a list-mode buffer would move
        # its typed items to a plain list, which the store takes as objects.)
        dtypes = [getattr(e, track).data.dtype for e in episodes
                  if _numpy_rows(getattr(e, track))]
        ints = [d for d in dtypes if d.kind in "iu"]
        if ints and len(set(dtypes)) > 1:
            wanted[track] = ints[0]
    out = []
    for episode in episodes:
        state = None
        for track, want in wanted.items():
            if not _numpy_rows(getattr(episode, track)):
                continue
            data = getattr(episode, track).data
            if data.dtype != want and np.array_equal(data.astype(want), data):
                state = state or episode.get_state()
                state[track] = dict(state[track], data=data.astype(want))
        out.append(SingleAgentEpisode.from_state(state) if state is not None else episode)
    return out


def _fitted(agent_episode, store: Store):
    """The agent's chunk with each numpy'ized flat track in the dtype its
    module's store keeps, where that changes no value: RLlib's concat of a
    chunk in which the agent took no step turns its int actions into
    float64, so a checkpoint can hold a module's actions as float64 (and
    its store then keeps them so) while the next chunks bring int64 ones,
    which RLlib's concat turns into float64 too. Else the chunk as it is
    (its mixed Python and numpy numbers as numbers: _numbers_as_numbers)."""
    agent_episode = _numbers_as_numbers(agent_episode)
    state = None
    for track, name in (("obs", "observations"), ("actions", "actions"),
                        ("rewards", "rewards")):
        leaf = store.layout[track]
        if type(leaf) is not int or not _numpy_rows(getattr(agent_episode, name)):
            continue
        want, data = store.leaf_dtype(leaf), getattr(agent_episode, name).data
        if want is None or data.dtype == want or data.dtype.kind not in "biuf" \
                or want.kind not in "biuf":
            continue
        cast = data.astype(want)
        if np.array_equal(cast.astype(data.dtype), data):
            state = state or agent_episode.get_state()
            state[name] = dict(state[name], data=cast)
    return SingleAgentEpisode.from_state(state) if state is not None else agent_episode


def _env_step(episode, agent_id, t: int) -> int:
    """The env step of agent step `t` of a stored multi-agent episode, as
    RLlib's metrics find it (`env_t_to_agent_t[agent_id].data.index(t)`);
    where RLlib's lookup fails (an episode stored from a later chunk on, its
    agent steps not counted from 0) the step's own env step."""
    mapping = episode.env_t_to_agent_t[agent_id].data
    try:
        return mapping.index(t)
    except ValueError:
        return mapping.index(t + episode.agent_episodes[agent_id].t_started)


def _numpy_rows(buffer) -> bool:
    # A numpy'ized buffer of one array with rows in it.
    return buffer.finalized and isinstance(buffer.data, np.ndarray) and len(buffer.data) > 0


def _agent_done(stored, agent_id) -> bool:
    """Whether `agent_id`'s steps in a stored multi-agent episode are done:
    RLlib's concat_episode then skips the agent's part of the next chunk
    (an agent that terminated at the very step the episode was cut at)."""
    if stored is None:
        return False
    agent_episode = stored.agent_episodes.get(agent_id)
    return agent_episode is not None and agent_episode.is_done


def _kept_episodes(kept: Any) -> list:
    # _plain_kept()'s episodes back (ValueError for anything else).
    from episode.multi_agent_episode import MultiAgentEpisode

    if type(kept) is not list:
        raise ValueError("the saved episodes are not MultiAgentEpisodes")
    episodes = []
    for entry in kept:
        if type(entry) is not list or len(entry) != 3 or type(entry[2]) is not list or \
                not all(type(a) is list and len(a) == 2 and type(a[1]) is dict
                        for a in entry[2]):
            raise ValueError("the saved episodes are not MultiAgentEpisodes")
        try:
            agents = {aid: SingleAgentEpisode.from_state(agent_state)
                      for aid, agent_state in entry[2]}
            episodes.append(MultiAgentEpisode._from_data_state(entry[0], entry[1], agents))
        except MemoryError:
            raise
        except Exception as error:     # noqa: BLE001 - a damaged state fails in many ways
            raise ValueError(f"a saved episode is not a MultiAgentEpisode: "
                             f"{type(error).__name__}: {error}") from None
    return episodes
