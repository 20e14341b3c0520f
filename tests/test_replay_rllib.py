"""episode.replay's four buffers against RLlib 2.60's, call by call: the same
episode streams (chunks of several envs, continued episodes, evictions),
the same seeded draws, so the same counters, index lists, priority trees,
samples (every value and type), metrics and checkpoints."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from difftools import compare
from replay_tools import (chunk_episode, episode_view, metrics_view, multi_agent_stream,
                          single_agent_stream, state_view)

pytest.importorskip("ray.rllib")
pytestmark = pytest.mark.rllib

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as TheirMultiEpisode  # noqa: E402
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode  # noqa: E402
from ray.rllib.utils.replay_buffers import (  # noqa: E402
    EpisodeReplayBuffer as TheirERB,
    MultiAgentEpisodeReplayBuffer as TheirMAERB,
    MultiAgentPrioritizedEpisodeReplayBuffer as TheirMAPERB,
    PrioritizedEpisodeReplayBuffer as TheirPERB,
)

from episode import MultiAgentEpisode, SingleAgentEpisode  # noqa: E402
from episode import replay  # noqa: E402
from episode._replay import episode_fields, step_order  # noqa: E402


class RLlibCrashed(Exception):
    """RLlib raised where it should not (a pinned difference): the run ends."""


def _both(call, theirs, ours):
    """call(theirs), call(ours); RLlibCrashed if only RLlib's raises, the
    same class on both sides if both do."""
    try:
        a = call(theirs)
    except Exception as error:   # noqa: BLE001 - any of RLlib's crashes
        try:
            call(ours)
        except Exception as ours_error:   # noqa: BLE001
            if _counter_crash(error):
                raise RLlibCrashed(repr(error))
            assert type(ours_error) is type(error), (error, ours_error)
            return None, None
        raise RLlibCrashed(repr(error))
    return a, call(ours)


def _counter_crash(error: Exception) -> bool:
    # RLlib's multi-agent sample() after set_state() failing on its own
    # per-module counter (a list for a module not drawn before; pinned).
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, TypeError) and "sampled_timesteps_per_module" in frames[-1].line


def _compare_single(theirs, ours, prioritized: bool) -> None:
    for name in ("get_num_timesteps", "get_num_episodes", "get_num_episodes_evicted",
                 "get_added_timesteps", "get_sampled_timesteps"):
        assert getattr(ours, name)() == getattr(theirs, name)(), name
    assert ours._num_timesteps == theirs._num_timesteps
    assert ours._indices == theirs._indices
    assert ours.episode_id_to_index == dict(theirs.episode_id_to_index)
    if prioritized:
        assert list(ours._free_nodes) == list(theirs._free_nodes)
        compare(ours._sum_segment.get_state(), theirs._sum_segment.value, "sum tree")
        compare(ours._min_segment.get_state(), theirs._min_segment.value, "min tree")
        assert ours._max_idx == theirs._max_idx
        compare(ours._max_priority, theirs._max_priority, "max priority")


def _drive_single(seed: int, prioritized: bool, *, numpy: bool, extras: bool, lookback: bool,
                  capacity: int, n_step: int) -> int:
    """Runs one stream through both buffers; returns the add() calls compared."""
    rng = np.random.default_rng(seed)
    if prioritized:
        theirs, ours = TheirPERB(capacity=capacity, alpha=0.6), \
            replay.PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=0.6)
    else:
        theirs, ours = TheirERB(capacity=capacity), replay.EpisodeReplayBuffer(capacity=capacity)
    theirs.rng, ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
    done = 0
    try:
        for i, call in enumerate(single_agent_stream(seed)):
            their_eps = [chunk_episode(TheirEpisode, c, numpy=numpy, extras=extras,
                                       lookback=lookback) for c in call]
            our_eps = [chunk_episode(SingleAgentEpisode, c, numpy=numpy, extras=extras,
                                     lookback=lookback) for c in call]
            try:
                theirs.add(their_eps)
            except Exception as error:   # noqa: BLE001
                raise RLlibCrashed(repr(error))
            ours.add(our_eps)
            done += 1
            _compare_single(theirs, ours, prioritized)
            if theirs.get_num_timesteps() == 0:
                continue
            if i % 4 == 3:
                theirs, ours = _round_trip(theirs, ours, capacity, prioritized, i % 8 == 3)
            kwargs = dict(n_step=n_step if i % 3 else (1, 4), gamma=0.9,
                          include_extra_model_outputs=i % 2 == 0)
            if prioritized:
                kwargs.update(beta=0.4, include_infos=i % 4 == 0)
                got = _both(lambda b: b.sample(8, **kwargs), theirs, ours)
            else:
                got = _both(lambda b: b.sample(8, sample_episodes=True, lookback=i % 2,
                                               **kwargs), theirs, ours)
            for a, b in zip(*got):
                view_a, view_b = episode_view(a, with_id=not prioritized), \
                    episode_view(b, with_id=not prioritized)
                if not prioritized:
                    # RLlib gives every transition its episode's first extra
                    # outputs (a pinned difference): ours are the step's.
                    for view in (view_a, view_b):
                        view["extras"].pop("logp", None)
                        view["extra_buffers"].pop("logp", None)
                compare(view_b, view_a, f"call {i}")
            compare(metrics_view(ours.get_metrics()), metrics_view(theirs.get_metrics()),
                    "metrics")
            if prioritized:
                assert ours._last_sampled_indices == theirs._last_sampled_indices
                priorities = np.abs(rng.normal(size=len(got[0]))).astype(np.float32)
                theirs.update_priorities(priorities)
                ours.update_priorities(priorities)
            elif i % 5 == 4:
                _compare_sequences(theirs, ours, rng)
    except RLlibCrashed:
        pass
    return done


def _round_trip(theirs, ours, capacity, prioritized, from_rllib: bool):
    """Both states compared, then loaded into fresh buffers (ours from
    RLlib's state every other time), which go on from there."""
    their_state, our_state = theirs.get_state(), ours.get_state()
    compare(state_view(our_state), state_view(their_state), "state")
    kwargs = dict(capacity=capacity, alpha=0.6) if prioritized else dict(capacity=capacity)
    theirs2, ours2 = type(theirs)(**kwargs), type(ours)(**kwargs)
    theirs2.set_state(their_state)
    ours2.set_state(their_state if from_rllib else our_state)
    for new, old in ((theirs2, theirs), (ours2, ours)):
        new.rng, new.metrics = old.rng, old.metrics
    if prioritized:
        theirs2._max_priority = theirs._max_priority   # RLlib's set_state keeps the state's
    compare(state_view(ours2.get_state()), state_view(theirs2.get_state()), "state after")
    return theirs2, ours2


def _compare_sequences(theirs, ours, rng) -> None:
    T, lookback, min_T = int(rng.integers(2, 6)), int(rng.integers(0, 3)), int(rng.integers(0, 2))
    if not _reachable([ours._store], min_T + 1):
        min_T = 0     # (no step that far from its episode's end: RLlib would draw forever)
    got = _both(lambda b: b.sample(12, batch_length_T=T, n_step=1, sample_episodes=True,
                                   lookback=lookback, min_batch_length_T=min_T), theirs, ours)
    for a, b in _pairs(got):
        compare(episode_view(b), episode_view(a), "sequence")
    got = _both(lambda b: b.sample(3, batch_length_T=T), theirs, ours)
    compare(got[1], got[0], "B x T batch")
    compare(metrics_view(ours.get_metrics()), metrics_view(theirs.get_metrics()), "metrics")


CONFIGS = [
    dict(numpy=True, extras=True, lookback=True, capacity=40, n_step=3),
    dict(numpy=False, extras=True, lookback=True, capacity=40, n_step=3),
    dict(numpy=True, extras=False, lookback=False, capacity=200, n_step=1),
    dict(numpy=False, extras=False, lookback=True, capacity=12, n_step=2),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(4))
def test_episode_replay_buffer_as_rllib(seed, config):
    assert _drive_single(seed, False, **config) > 0


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(4))
def test_prioritized_episode_replay_buffer_as_rllib(seed, config):
    assert _drive_single(seed, True, **config) > 0


def test_the_streams_reach_evictions_and_state_round_trips():
    """The runs above are not vacuous: at the smaller capacities episodes
    are evicted while chunks of running ones keep arriving."""
    ours = replay.EpisodeReplayBuffer(capacity=12)
    for call in single_agent_stream(0):
        ours.add([chunk_episode(SingleAgentEpisode, c, numpy=True, extras=True, lookback=True)
                  for c in call])
    assert ours.get_num_episodes_evicted() > 3
    assert len({slot for slot, *_ in ours._indices}) >= 2


# -- multi-agent ---------------------------------------------------------------------------


def _compare_multi(theirs, ours, prioritized) -> None:
    for name in ("get_num_timesteps", "get_num_episodes", "get_num_agent_timesteps",
                 "get_added_timesteps", "get_module_ids", "get_added_agent_timesteps"):
        assert getattr(ours, name)() == getattr(theirs, name)(), name
    for module_id in ("m0", "m1"):
        for name in ("get_num_timesteps", "get_num_episodes", "get_added_timesteps",
                     "get_num_episodes_evicted"):
            assert getattr(ours, name)(module_id) == getattr(theirs, name)(module_id)
    assert ours._indices == theirs._indices
    assert {k: list(v) for k, v in ours._module_to_indices.items()} == \
        {k: list(v) for k, v in theirs._module_to_indices.items()}
    if prioritized:
        for module_id, trees in theirs._module_to_sum_segment.items():
            compare(ours._modules[module_id].priorities.sum_values(), trees.value, module_id)
            assert ours._modules[module_id].priorities.free_nodes() == \
                list(theirs._module_to_free_nodes[module_id])


def _drive_multi(seed: int, prioritized: bool, turn_based: bool, capacity: int = 30) -> int:
    rng = np.random.default_rng(seed)
    if prioritized:
        theirs, ours = TheirMAPERB(capacity=capacity, alpha=0.6), \
            replay.MultiAgentPrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=0.6)
    else:
        theirs, ours = TheirMAERB(capacity=capacity), \
            replay.MultiAgentEpisodeReplayBuffer(capacity=capacity)
    theirs.rng, ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
    done = 0
    stream = multi_agent_stream(seed, (TheirMultiEpisode, MultiAgentEpisode),
                                turn_based=turn_based)
    try:
        for i, call in enumerate(stream):
            _both(lambda b: b.add([c[0] if b is theirs else c[1] for c in call]), theirs, ours)
            done += 1
            _compare_multi(theirs, ours, prioritized)
            if i % 3 == 2:
                # (RLlib's own float64 actions, pinned above, keep its turn-based
                # states from loading into ours: one dtype per module store.)
                theirs, ours = _round_trip_multi(theirs, ours, capacity, prioritized,
                                                 i % 6 == 2 and not turn_based)
                _compare_multi(theirs, ours, prioritized)
            if theirs.get_num_timesteps() == 0:
                continue
            kwargs = dict(n_step=2 if i % 3 else (1, 3), gamma=0.9, include_infos=i % 2 == 0)
            if prioritized:
                kwargs["beta"] = 0.4
            got = _both(lambda b: b.sample(4, **kwargs), theirs, ours)
            for a, b in zip(*got):
                view_a, view_b = episode_view(a, with_id=False), episode_view(b, with_id=False)
                # RLlib's concat of a chunk in which an agent has no step
                # turns that agent's int actions into float64 (pinned).
                view_a["actions"] = [float(x) for x in view_a["actions"]]
                view_b["actions"] = [float(x) for x in view_b["actions"]]
                compare(view_b, view_a, f"call {i}")
            compare(metrics_view(ours.get_metrics()), metrics_view(theirs.get_metrics()),
                    "metrics")
            if prioritized:
                for module_id in ("m0", "m1"):
                    drawn = theirs._module_to_last_sampled_indices[module_id]
                    assert ours._module_to_last_sampled_indices[module_id] == drawn
                    priorities = np.abs(rng.normal(size=len(drawn))).astype(np.float32)
                    theirs.update_priorities(priorities, module_id)
                    ours.update_priorities(priorities, module_id)
            elif i % 3 == 2:
                got = _both(lambda b: b.sample(5, n_step=1, replay_mode="synchronized"),
                            theirs, ours)
                for module_id, batch in got[0].items():
                    # RLlib returns empty weights/n_step columns (pinned).
                    for key in ("weights", "n_step"):
                        batch.pop(key)
                        got[1][module_id].pop(key)
                    for side in (batch, got[1][module_id]):
                        side["actions"] = side["actions"].astype(float)
                compare(got[1], got[0], "synchronized")
    except RLlibCrashed:
        pass
    return done


# The checkpoint keys compared as they are (the episodes' states name each
# side's own random ids).
MULTI_STATE_KEYS = ("episode_id_to_index", "_num_episodes_evicted", "_indices", "_num_timesteps",
                    "_num_timesteps_added", "sampled_timesteps", "_module_to_indices",
                    "_num_agent_timesteps", "_num_agent_timesteps_added",
                    "_num_module_timesteps", "_num_module_timesteps_added",
                    "_num_module_episodes", "_num_module_episodes_evicted")


def _round_trip_multi(theirs, ours, capacity, prioritized, from_rllib: bool, *, kwargs=None,
                      pickled: bool = False):
    their_state, our_state = theirs.get_state(), ours.get_state()
    assert list(our_state) == list(their_state)
    for key in MULTI_STATE_KEYS:
        ours_, theirs_ = our_state[key], their_state[key]
        if key == "episode_id_to_index":     # (the ids are each side's own)
            ours_, theirs_ = [v for _, v in ours_], [v for _, v in theirs_]
        compare(ours_, theirs_, key)
    if kwargs is None:
        kwargs = dict(capacity=capacity, alpha=0.6) if prioritized else dict(capacity=capacity)
    if pickled:
        our_state = _pickled(their_state if from_rllib else our_state)
        their_state = _pickled(their_state)
    elif from_rllib:
        our_state = their_state
    theirs2, ours2 = type(theirs)(**kwargs), type(ours)(**kwargs)
    theirs2.set_state(their_state)
    ours2.set_state(our_state)
    for new, old in ((theirs2, theirs), (ours2, ours)):
        new.rng, new.metrics = old.rng, old.metrics
    return theirs2, ours2


@pytest.mark.parametrize("turn_based", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_multi_agent_episode_replay_buffer_as_rllib(seed, turn_based):
    assert _drive_multi(seed, False, turn_based) > 0


@pytest.mark.parametrize("turn_based", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_multi_agent_prioritized_episode_replay_buffer_as_rllib(seed, turn_based):
    assert _drive_multi(seed, True, turn_based) > 0


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "multi", "multi_prioritized"])
def test_metrics_of_many_calls_between_reads(kind):
    """Our buffers hand the values of add() and sample() to the logger only
    when the metrics are read, summed where RLlib sums them: read after
    several calls (and a window shorter than the calls), the reduced Stats
    peek to RLlib's values of the same types."""
    multi, prioritized = kind.startswith("multi"), kind.endswith("prioritized")
    ours_cls, theirs_cls = {
        "uniform": (replay.EpisodeReplayBuffer, TheirERB),
        "prioritized": (replay.PrioritizedEpisodeReplayBuffer, TheirPERB),
        "multi": (replay.MultiAgentEpisodeReplayBuffer, TheirMAERB),
        "multi_prioritized": (replay.MultiAgentPrioritizedEpisodeReplayBuffer, TheirMAPERB),
    }[kind]
    kwargs = dict(capacity=60, metrics_num_episodes_for_smoothing=3)
    ours, theirs = ours_cls(**kwargs), theirs_cls(**kwargs)
    ours.rng, theirs.rng = np.random.default_rng(1), np.random.default_rng(1)
    if multi:
        stream = [[c[1] for c in call] for call in
                  multi_agent_stream(1, (TheirMultiEpisode, MultiAgentEpisode), calls=12)]
        theirs_stream = [[c[0] for c in call] for call in
                         multi_agent_stream(1, (TheirMultiEpisode, MultiAgentEpisode), calls=12)]
    else:
        calls = single_agent_stream(1)
        stream = [[chunk_episode(SingleAgentEpisode, c, numpy=True, extras=False,
                                 lookback=False) for c in call]
                  for call in calls]
        theirs_stream = [[chunk_episode(TheirEpisode, c, numpy=True, extras=False,
                                 lookback=False) for c in call]
                         for call in calls]
    reads = 0
    for i, (mine, theirs_eps) in enumerate(zip(stream, theirs_stream)):
        theirs.add(theirs_eps)
        ours.add(mine)
        sample = dict(n_step=2, gamma=0.9, **({"beta": 0.4} if prioritized else {}))
        if not multi and not prioritized:
            sample["sample_episodes"] = True
        for _ in range(2):
            theirs.sample(4, **sample)
            ours.sample(4, **sample)
        if i in (0, 1, 4, 9):       # (one add since the last read, and several)
            reads += 1
            compare(metrics_view(ours.get_metrics()), metrics_view(theirs.get_metrics()),
                    f"metrics after call {i}")
    assert reads == 4
    compare(metrics_view(ours.metrics.peek()), metrics_view(theirs.metrics.peek()), "peek")


# -- seeded random scenarios -----------------------------------------------------------------
#
# RLlib's four buffers and ours on random scenarios: the same stream (random sizes,
# list-mode or numpy'ized chunks, evictions), both rngs seeded alike, then a random
# mix of sample(), update_priorities() right after a draw, get_state() -> pickle ->
# set_state() into new buffers (ours from RLlib's state too) and metrics reads, all
# compared after each step. EPISODE_REPLAY_SCENARIOS sets the seeds per buffer (run
# more by hand: EPISODE_REPLAY_SCENARIOS=30 pytest -k scenario).

SCENARIOS = int(os.environ.get("EPISODE_REPLAY_SCENARIOS", "5"))


def _pickled(state):
    return pickle.loads(pickle.dumps(state))


def _priorities(rng, n: int):
    """TD errors as learners hand them over: float32 or float64 arrays,
    sometimes with zeros (clamped to 1e-12 by both)."""
    values = np.abs(rng.normal(size=n)) * float(rng.choice([1e-3, 1.0, 50.0]))
    if rng.random() < 0.2:
        values[rng.random(n) < 0.3] = 0.0
    return values.astype(np.float32 if rng.random() < 0.7 else np.float64)


def _reachable(stores, n_step) -> bool:
    """Whether in every store the steps with `n_step` steps after them in
    their episode hold a ten-thousandth of the priority mass (a step at all
    when uniform): RLlib's draws loop until they find one, ours give up after
    a million (at 5e-6 of the mass, one sample() in 200 would)."""
    n = 1 if isinstance(n_step, tuple) else n_step
    for store in stores:
        if not store.live_steps:
            continue
        mass = total = 0.0
        for slot, ts, leaf in step_order(store):
            p = float(store.priorities.leaf_value(leaf)[0]) if store.priorities else 1.0
            total += p
            mass += p if ts + n <= episode_fields(store, slot)[3] else 0.0
        if not mass > 1e-4 * total:
            return False
    return True


def _pairs(got):
    # What _both returned, as pairs (none where both raised).
    return [] if got[0] is None else list(zip(*got))


def _scenario_single(seed: int, prioritized: bool) -> int:
    rng = np.random.default_rng([seed, 1 + prioritized])
    numpy_, extras, lookback = (bool(rng.integers(2)) for _ in range(3))
    capacity = int(rng.choice([8, 15, 30, 60, 200]))
    alpha = float(rng.choice([0.5, 0.6, 1.0]))
    n_envs, calls, longest = int(rng.integers(1, 5)), int(rng.integers(8, 20)), \
        int(rng.integers(3, 9))
    if prioritized:
        # (One add() of more steps than RLlib's trees have free leaves fails
        # in RLlib's, a pinned difference: keep every call within them.)
        capacity = max(capacity, n_envs * longest)
    stream = single_agent_stream(seed, n_envs=n_envs, calls=calls, fragment=(1, longest),
                                 max_len=int(rng.integers(4, 30)))
    kwargs = dict(capacity=capacity, alpha=alpha) if prioritized else dict(capacity=capacity)
    theirs = (TheirPERB if prioritized else TheirERB)(**kwargs)
    ours = (replay.PrioritizedEpisodeReplayBuffer if prioritized
            else replay.EpisodeReplayBuffer)(**kwargs)
    theirs.rng, ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
    steps = 0
    batches = 0     # sample_batch() draws (they log no sample metrics)
    pending: list = []     # a draw not updated yet: its steps as drawn
    try:
        for i, call in enumerate(stream):
            make = dict(numpy=numpy_, extras=extras, lookback=lookback)
            their_eps = [chunk_episode(TheirEpisode, c, **make) for c in call]
            our_eps = [chunk_episode(SingleAgentEpisode, c, **make) for c in call]
            _both(lambda b: b.add(their_eps if b is theirs else our_eps), theirs, ours)
            _compare_single(theirs, ours, prioritized)
            if pending and pending == _drawn_steps(theirs) and rng.random() < 0.5:
                # The last draw's update after adds that evicted none of its
                # steps (RLlib's leaves of evicted ones are pinned).
                priorities = _priorities(rng, len(pending))
                _both(lambda b: b.update_priorities(priorities), theirs, ours)
                _compare_single(theirs, ours, prioritized)
            pending = []
            steps += 1
            for _ in range(int(rng.integers(0, 4))):
                if theirs.get_num_timesteps() == 0:
                    break
                op = rng.choice(["sample", "sample", "state", "metrics"])
                if op == "state":
                    theirs, ours = _scenario_round_trip(theirs, ours, kwargs,
                                                        bool(rng.integers(2)))
                    _compare_single(theirs, ours, prioritized)
                elif op == "metrics":
                    if batches:
                        continue
                    compare(metrics_view(ours.get_metrics()),
                            metrics_view(theirs.get_metrics()), "metrics")
                elif prioritized:
                    n_step = int(rng.integers(1, 4)) if rng.random() < 0.7 else (1, 4)
                    sample = dict(n_step=n_step, gamma=float(rng.choice([0.9, 0.99])),
                                  beta=float(rng.choice([0.0, 0.4, 1.0])),
                                  include_infos=bool(rng.integers(2)),
                                  include_extra_model_outputs=bool(rng.integers(2)))
                    if not _reachable([ours._store], n_step):
                        continue
                    B = int(rng.integers(1, 12))
                    batch_draw = n_step == 1 and rng.random() < 0.3
                    if batch_draw:
                        # sample_batch(): RLlib's one-step draws and weights.
                        got = _both(lambda b: b.sample(B, **sample) if b is theirs else
                                    b.sample_batch(B, n_step=1, gamma=sample["gamma"],
                                                   beta=sample["beta"]), theirs, ours)
                        batches += 1
                        if got[0] is not None:
                            drawn, batch = got
                            weights = [e.get_extra_model_outputs("weights")[0] for e in drawn]
                            np.testing.assert_array_equal(
                                batch["weights"], np.array(weights).astype(np.float32))
                            got = (drawn, [None] * len(drawn))
                    else:
                        if rng.random() < 0.3:
                            # The batch size by keyword, and the uniform buffer's
                            # sample_episodes (which both take and ignore here).
                            B = int(rng.integers(1, 25))
                            sample.update(batch_size_B=B, sample_episodes=True)
                            got = _both(lambda b: b.sample(**sample), theirs, ours)
                        else:
                            got = _both(lambda b: b.sample(B, **sample), theirs, ours)
                        _compare_drawn(got, f"call {i}")
                    assert list(ours._last_sampled_indices) == \
                        list(theirs._last_sampled_indices)
                    pending = _drawn_steps(theirs)
                    if got[0] is not None and rng.random() < 0.8:
                        priorities = _priorities(rng, len(got[0]))
                        _both(lambda b: b.update_priorities(priorities), theirs, ours)
                        pending = []
                        if batch_draw and rng.random() < 0.5:
                            # A sample() right after the update of a batch's draw.
                            again = dict(n_step=1, beta=float(rng.choice([0.0, 0.4, 1.0])))
                            got = _both(lambda b: b.sample(num_items=16, **again),
                                        theirs, ours)
                            _compare_drawn(got, f"call {i} after the update")
                            assert list(ours._last_sampled_indices) == \
                                list(theirs._last_sampled_indices)
                            pending = _drawn_steps(theirs)
                    _compare_single(theirs, ours, prioritized)
                elif rng.random() < 0.7:
                    n_step = int(rng.integers(1, 4)) if rng.random() < 0.7 else (1, 4)
                    sample = dict(n_step=n_step, gamma=0.9, lookback=int(rng.integers(2)),
                                  include_extra_model_outputs=bool(rng.integers(2)))
                    B = int(rng.integers(1, 12))
                    got = _both(lambda b: b.sample(B, sample_episodes=True, **sample),
                                theirs, ours)
                    for a, b in _pairs(got):
                        view_a, view_b = episode_view(a), episode_view(b)
                        # RLlib gives every transition its episode's first extra
                        # outputs (a pinned difference): ours are the step's.
                        for view in (view_a, view_b):
                            view["extras"].pop("logp", None)
                            view["extra_buffers"].pop("logp", None)
                        compare(view_b, view_a, f"call {i}")
                else:
                    _compare_sequences(theirs, ours, rng)
                steps += 1
    except RLlibCrashed:
        pass
    return steps


def _drawn_steps(theirs) -> list:
    # RLlib's last draw not updated yet: (episode id, timestep) per leaf.
    steps = []
    for leaf in theirs._last_sampled_indices:
        if leaf not in theirs._tree_idx_to_sample_idx:
            return []
        index, ts, _ = theirs._indices[theirs._tree_idx_to_sample_idx[leaf]]
        steps.append((theirs.episodes[index - theirs._num_episodes_evicted].id_, ts))
    return steps


def _compare_drawn(got, where: str) -> None:
    # Prioritized draws: the same transitions, weights included.
    for a, b in _pairs(got):
        compare(episode_view(b, with_id=False), episode_view(a, with_id=False), where)


def _scenario_round_trip(theirs, ours, kwargs, from_rllib: bool):
    """States compared, pickled and loaded into new buffers (ours from
    RLlib's state with `from_rllib`), which go on with the same rngs."""
    their_state, our_state = theirs.get_state(), ours.get_state()
    compare(state_view(our_state), state_view(their_state), "state")
    theirs2, ours2 = type(theirs)(**kwargs), type(ours)(**kwargs)
    theirs2.set_state(_pickled(their_state))
    ours2.set_state(_pickled(their_state if from_rllib else our_state))
    for new, old in ((theirs2, theirs), (ours2, ours)):
        new.rng, new.metrics = old.rng, old.metrics
    compare(state_view(ours2.get_state()), state_view(theirs2.get_state()), "state after")
    return theirs2, ours2


def _scenario_multi(seed: int, prioritized: bool) -> int:
    rng = np.random.default_rng([seed, 3 + prioritized])
    capacity = int(rng.choice([12, 20, 30, 60, 200]))
    alpha = float(rng.choice([0.5, 0.6, 1.0]))
    turn_based, numpy_ = bool(rng.integers(2)), bool(rng.integers(2))
    stream = multi_agent_stream(seed, (TheirMultiEpisode, MultiAgentEpisode),
                                calls=int(rng.integers(8, 18)), n_envs=int(rng.integers(1, 4)),
                                turn_based=turn_based, numpy=numpy_)
    kwargs = dict(capacity=capacity, alpha=alpha) if prioritized else dict(capacity=capacity)
    theirs = (TheirMAPERB if prioritized else TheirMAERB)(**kwargs)
    ours = (replay.MultiAgentPrioritizedEpisodeReplayBuffer if prioritized
            else replay.MultiAgentEpisodeReplayBuffer)(**kwargs)
    theirs.rng, ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
    steps = 0
    try:
        for i, call in enumerate(stream):
            if prioritized:
                # RLlib's modules keep their draws' leaves until an update
                # takes them; one of a step an add() evicts gets the step's
                # priority on the freed or reused leaf (pinned elsewhere), so
                # the draws not updated yet are updated first.
                for module_id, drawn in list(theirs._module_to_last_sampled_indices.items()):
                    if drawn:
                        priorities = _priorities(rng, len(drawn))
                        _both(lambda b: b.update_priorities(priorities, module_id),
                              theirs, ours)
            _both(lambda b: b.add([c[0] if b is theirs else c[1] for c in call]), theirs, ours)
            _compare_multi(theirs, ours, prioritized)
            steps += 1
            for _ in range(int(rng.integers(0, 4))):
                if theirs.get_num_timesteps() == 0:
                    break
                op = rng.choice(["sample", "sample", "state", "metrics"])
                if op == "state":
                    # (RLlib's float64 actions of a turn-based agent, pinned
                    # above, keep its states from loading into ours.)
                    from_rllib = not turn_based and bool(rng.integers(2))
                    theirs, ours = _round_trip_multi(theirs, ours, capacity, prioritized,
                                                     from_rllib, kwargs=kwargs, pickled=True)
                    _compare_multi(theirs, ours, prioritized)
                elif op == "metrics":
                    compare(metrics_view(ours.get_metrics()),
                            metrics_view(theirs.get_metrics()), "metrics")
                else:
                    n_step = int(rng.integers(1, 4)) if rng.random() < 0.7 else (1, 4)
                    sample = dict(n_step=n_step, gamma=float(rng.choice([0.9, 0.99])),
                                  include_infos=bool(rng.integers(2)))
                    if prioritized:
                        sample["beta"] = float(rng.choice([0.0, 0.4, 1.0]))
                    if not _reachable(ours._modules.values(), n_step):
                        continue
                    B = int(rng.integers(1, 8))
                    if rng.random() < 0.3:
                        # Some modules, or all named out of sorted order.
                        sample["modules_to_sample"] = [
                            ["m1", "m0"], ["m0", "m1"], ["m1"], ["m0"]][int(rng.integers(4))]
                    got = _both(lambda b: b.sample(B, **sample), theirs, ours)
                    for a, b in _pairs(got):
                        view_a, view_b = episode_view(a, with_id=False), \
                            episode_view(b, with_id=False)
                        # RLlib's concat of a chunk in which an agent has no step
                        # turns that agent's int actions into float64 (pinned).
                        view_a["actions"] = [float(x) for x in view_a["actions"]]
                        view_b["actions"] = [float(x) for x in view_b["actions"]]
                        compare(view_b, view_a, f"call {i}")
                    if prioritized and got[0] is not None:
                        for module_id in ("m0", "m1"):
                            drawn = theirs._module_to_last_sampled_indices[module_id]
                            assert ours._module_to_last_sampled_indices[module_id] == drawn
                            if rng.random() < 0.8:
                                priorities = _priorities(rng, len(drawn))
                                _both(lambda b: b.update_priorities(priorities, module_id),
                                      theirs, ours)
                    _compare_multi(theirs, ours, prioritized)
                steps += 1
    except RLlibCrashed:
        pass
    return steps


@pytest.mark.parametrize("seed", range(SCENARIOS))
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "multi", "multi_prioritized"])
def test_random_scenario_as_rllib(kind, seed):
    multi, prioritized = kind.startswith("multi"), kind.endswith("prioritized")
    steps = (_scenario_multi if multi else _scenario_single)(seed, prioritized)
    assert steps > 0


def test_a_prioritized_checkpoint_into_a_uniform_buffer_as_rllib():
    """RLlib's EpisodeReplayBuffer loads a PrioritizedEpisodeReplayBuffer's
    checkpoint (after evictions) and samples from it; ours the same, with
    the same draws. (Its `_indices` keep the tree leaves it was given; ours
    are the uniform buffer's (episode, timestep) pairs: pinned.)"""
    from replay_tools import numbered_episode

    sources = TheirPERB(capacity=12), replay.PrioritizedEpisodeReplayBuffer(capacity=12)
    for i in range(6):
        sources[0].add(numbered_episode(i, 4, cls=TheirEpisode))
        sources[1].add(numbered_episode(i, 4))
    theirs, ours = TheirERB(capacity=12), replay.EpisodeReplayBuffer(capacity=12)
    theirs.set_state(sources[0].get_state())
    ours.set_state(sources[1].get_state())
    assert ours._indices == [tuple(i[:2]) for i in theirs._indices]
    theirs.rng, ours.rng = np.random.default_rng(0), np.random.default_rng(0)
    got = _both(lambda b: b.sample(6, sample_episodes=True, n_step=1), theirs, ours)
    for a, b in _pairs(got):
        compare(episode_view(b), episode_view(a), "transition")
    got = _both(lambda b: b.sample(3, batch_length_T=2), theirs, ours)
    compare(got[1], got[0], "B x T batch")


def _left_early(cls, cut_at: int):
    """Agents a and b; b is done at env step 2, a goes on to step 7; cut
    after env step `cut_at` (> 2): (first chunk, continuation)."""
    episode = cls(id_="early")
    episode.add_env_reset(observations={"a": 0.0, "b": 0.0})
    first = None
    for t in range(1, 8):
        agents = ["a", "b"] if t <= 2 else ["a"]
        episode.add_env_step({a: float(t) for a in agents}, {a: t for a in agents},
                             {a: 10.0 + t for a in agents},
                             terminateds={"b": t == 2, "__all__": False})
        if t == cut_at:
            first, episode = episode, episode.cut(len_lookback_buffer=1)
    return first, episode


@pytest.mark.parametrize("cut_at", [3, 5])
def test_synchronized_draws_after_an_agent_left_in_an_earlier_chunk(cut_at):
    """A stored episode joined from chunks where an agent was done in the
    first: RLlib's concat leaves that agent's env_t_to_agent_t as long as the
    first chunk, and its synchronized sample() then fails with an IndexError
    (a pinned difference); ours leaves the agent out of the later steps:
    each row a real transition (obs t -> t + n, action and reward of t + 1)."""
    theirs, ours = TheirMAERB(capacity=100), replay.MultiAgentEpisodeReplayBuffer(capacity=100)
    for buffer, cls in ((theirs, TheirMultiEpisode), (ours, MultiAgentEpisode)):
        for chunk in _left_early(cls, cut_at):
            buffer.add(chunk)
        buffer.rng = np.random.default_rng(0)
    with pytest.raises(IndexError):
        theirs.sample(40, n_step=1, replay_mode="synchronized")
    batch = ours.sample(40, n_step=1, replay_mode="synchronized")["default_policy"]
    obs, new_obs = batch["obs"], batch["new_obs"]
    assert len(obs) >= 40 and set(new_obs.tolist()) > {3.0}
    np.testing.assert_array_equal(new_obs, obs + 1)
    np.testing.assert_array_equal(batch["actions"], new_obs.astype(np.int64))
    np.testing.assert_array_equal(batch["rewards"], 10.0 + new_obs)


@pytest.mark.parametrize("multi", [False, True], ids=["single", "multi"])
def test_rllib_loads_our_packed_checkpoint(multi):
    """Our prioritized checkpoint, pickled packed and loaded, is RLlib's
    lists (and deques) again: RLlib's buffer takes it and draws what ours
    does from it."""
    from replay_tools import numbered_episode

    if multi:
        ours, theirs = replay.MultiAgentPrioritizedEpisodeReplayBuffer(capacity=30), \
            TheirMAPERB(capacity=30)
        for call in multi_agent_stream(3, (MultiAgentEpisode,), calls=10):
            ours.add([c[0] for c in call])
    else:
        ours, theirs = replay.PrioritizedEpisodeReplayBuffer(capacity=30), TheirPERB(capacity=30)
        for i in range(10):
            ours.add(numbered_episode(i, 5))
    ours.rng = np.random.default_rng(0)
    drawn = ours.sample(6, n_step=1)
    if multi:
        for module_id, leaves in list(ours._module_to_last_sampled_indices.items()):
            ours.update_priorities(np.linspace(0.5, 3.0, len(leaves)).astype(np.float32),
                                   module_id)
    else:
        ours.update_priorities(np.linspace(0.5, 3.0, len(drawn)).astype(np.float32))
    from episode.replay.prioritized import _packed_state

    state = _pickled(_packed_state(ours.get_state()))
    theirs.set_state(state)
    again = type(ours)(capacity=30)
    again.set_state(_pickled(ours.get_state()))
    theirs.rng, again.rng = np.random.default_rng(5), np.random.default_rng(5)
    got = _both(lambda b: b.sample(8, n_step=1, beta=0.4), theirs, again)
    for a, b in _pairs(got):
        compare(episode_view(b, with_id=False), episode_view(a, with_id=False), "draw")


def _stats_view(reduced):
    # Keys in their order, and each Stats as its class and state.
    if isinstance(reduced, dict):
        return [(k, _stats_view(v)) for k, v in reduced.items()]
    return type(reduced).__name__, reduced.get_state()


def test_metrics_are_reduced_as_rllibs_logger_reduces_them():
    """get_metrics() reduces RLlib's MetricsLogger without its dm-tree walk
    (half its cost): the same Stats (class and state) in the same nesting
    and key order as MetricsLogger.reduce() gives, read after read."""
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from episode.replay.metrics import _reduced

    ours, theirs = MetricsLogger(root=False), MetricsLogger(root=False)
    rng = np.random.default_rng(0)
    for read in range(4):
        for _ in range(5):
            for logger in (ours, theirs):
                logger.log_value("n", 3, reduce="sum")
                logger.log_value("n_lifetime", 3, reduce="lifetime_sum")
                logger.log_value(("per_agent", "a0"), 2, reduce="sum")
                logger.log_value(("per_agent", "a1"), 1.5, reduce="lifetime_sum")
            value = float(rng.random())
            for logger in (ours, theirs):
                logger.log_value("mean", value, reduce="mean", window=3)
                logger.log_value(("deep", "x", "y"), value, reduce="mean", window=2)
        assert _stats_view(_reduced(ours)) == _stats_view(theirs.reduce()), read


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("cut_at", [2, 3, 5])
def test_an_agent_done_at_the_cut_step_continues_as_rllibs_concat_skips_it(prioritized,
                                                                          cut_at):
    """Agent b terminates at env step 2 and the episode is cut at `cut_at`
    (2: the very step b ended): the next chunk's part for b is skipped, as
    RLlib's concat_episode skips a done agent. RLlib's buffer takes the
    chunk too but then fails inside sample() (IndexError); ours draws from
    it, and the stored episode is the uncut one (docs/differences.md)."""
    cls = replay.MultiAgentPrioritizedEpisodeReplayBuffer if prioritized \
        else replay.MultiAgentEpisodeReplayBuffer

    def play(cut):
        episode = MultiAgentEpisode(id_="x")
        episode.add_env_reset(observations={"a": 0.0, "b": 0.0})
        chunks = []
        for t in range(1, 8):
            both = t <= 2
            episode.add_env_step({"a": float(t), **({"b": float(t)} if both else {})},
                                 {"a": 1, **({"b": 2} if both else {})},
                                 {"a": 1.0, **({"b": 2.0} if both else {})},
                                 terminateds={"b": t == 2, "__all__": False} if both else {})
            if t == cut:
                chunks.append(episode)
                episode = episode.cut(len_lookback_buffer=1)
        return chunks + [episode]

    buffer = cls(capacity=100)
    for chunk in play(cut_at):
        buffer.add(chunk)
    uncut = play(None)[0]
    stored = buffer.episodes[0]
    assert stored.env_t_to_agent_t["b"].data == uncut.env_t_to_agent_t["b"].data
    assert stored.agent_episodes["b"].get_observations() == [0.0, 1.0, 2.0]
    assert buffer.get_num_timesteps() == 7
    buffer.rng = np.random.default_rng(0)
    drawn = buffer.sample(20, n_step=1)
    assert drawn and all(e.agent_id in ("a", "b") for e in drawn)
    # A done agent's later chunk adds nothing: state round trip as before.
    again = cls(capacity=100)
    again.set_state(pickle.loads(pickle.dumps(buffer.get_state())))
    assert again.get_num_timesteps() == 7


@pytest.mark.parametrize("prioritized", [False, True])
def test_an_episode_both_terminated_and_truncated_keeps_both_flags(prioritized):
    """An env may end an episode both ways at once: RLlib's buffers keep
    both flags, in the stored episode and in the transitions that reach its
    end; so do ours (and sample_batch's terminateds/truncateds)."""
    theirs_cls, ours_cls = (TheirPERB, replay.PrioritizedEpisodeReplayBuffer) if prioritized \
        else (TheirERB, replay.EpisodeReplayBuffer)
    found = []
    for episode_cls, cls in ((TheirEpisode, theirs_cls), (SingleAgentEpisode, ours_cls)):
        episode = episode_cls()
        episode.add_env_reset(observation=np.zeros(2, np.float32))
        for t in range(8):
            episode.add_env_step(np.full(2, t, np.float32), 0, 1.0, terminated=t == 7,
                                 truncated=t == 7)
        buffer = cls(capacity=100)
        buffer.add(episode.to_numpy())
        buffer.rng = np.random.default_rng(0)
        drawn = buffer.sample(20, n_step=2, sample_episodes=True)
        state = buffer.get_state()["episodes"][0]
        found.append(([(e.is_terminated, e.is_truncated) for e in drawn],
                      state["is_terminated"], state["is_truncated"]))
        if cls is ours_cls:
            batch = buffer.sample_batch(64, n_step=1)
            ends = batch["terminateds"]
            assert ends.any() and (batch["truncateds"] == ends).all()
    assert found[0] == found[1]
    assert (True, True) in found[1][0]


@pytest.mark.parametrize("seed", range(6))
def test_prioritized_sample_batch_draws_and_weighs_as_rllib_samples(seed):
    """One-step sample_batch() from the prioritized buffer draws what RLlib's
    sample() draws with the same rng, with RLlib's importance weights (its
    float64 numbers, as float32): from float32 and float64 priorities, a
    float32 tree's sums included. After update_priorities() of that draw
    both buffers go on drawing alike."""
    rng = np.random.default_rng([seed, 77])
    kwargs = dict(capacity=400, alpha=float(rng.choice([0.5, 0.6, 1.0])))
    theirs, ours = TheirPERB(**kwargs), replay.PrioritizedEpisodeReplayBuffer(**kwargs)
    theirs.rng, ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
    for i, call in enumerate(single_agent_stream(seed, n_envs=3, calls=10, fragment=(4, 20),
                                                 max_len=40)):
        make = dict(numpy=True, extras=False, lookback=True)
        theirs.add([chunk_episode(TheirEpisode, c, **make) for c in call])
        ours.add([chunk_episode(SingleAgentEpisode, c, **make) for c in call])
        B, beta = int(rng.integers(1, 64)), float(rng.choice([0.0, 0.4, 1.0]))
        drawn = theirs.sample(B, n_step=1, gamma=0.9, beta=beta)
        batch = ours.sample_batch(B, n_step=1, gamma=0.9, beta=beta)
        assert list(ours._last_sampled_indices) == list(theirs._last_sampled_indices)
        weights = np.array([e.get_extra_model_outputs("weights")[0] for e in drawn])
        np.testing.assert_array_equal(batch["weights"], weights.astype(np.float32),
                                      err_msg=f"call {i}")
        np.testing.assert_array_equal(batch["actions"],
                                      np.array([e.get_actions(0) for e in drawn]))
        priorities = _priorities(rng, B)
        theirs.update_priorities(priorities)
        ours.update_priorities(priorities)
        _compare_single(theirs, ours, True)
        drawn = theirs.sample(B, n_step=1, gamma=0.9, beta=beta)
        again = ours.sample(B, n_step=1, gamma=0.9, beta=beta)
        assert [e.get_extra_model_outputs("weights")[0] for e in again] == \
            [e.get_extra_model_outputs("weights")[0] for e in drawn]


def _mixed_cartpole_episode(episode_cls, seed=3):
    """A CartPole episode cut every 5 steps, the chunks alternately left in
    list mode (the first) and numpy'ized, concatenated again: its list-mode
    rewards and actions mix Python and numpy numbers."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs, info = env.reset(seed=seed)
    episode = episode_cls(observations=[obs], infos=[info],
                          observation_space=env.observation_space,
                          action_space=env.action_space)
    chunks = []
    for t in range(23):
        obs, reward, terminated, truncated, info = env.step(t % 2)
        episode.add_env_step(obs, t % 2, reward, infos=info, terminated=terminated,
                             truncated=truncated)
        if (t + 1) % 5 == 0 and not episode.is_done:
            chunks.append(episode)
            episode = episode.cut()
    chunks.append(episode)
    for chunk in chunks[1::2]:
        chunk.to_numpy()
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole.concat_episode(chunk)
    return whole


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_list_mode_episode_concatenated_with_numpy_chunks_is_stored(prioritized):
    """Its rewards (Python and numpy floats) and actions (Python and numpy
    ints) are numbers: stored and sampled as RLlib's buffer samples them
    (ours refused the rewards as objects), beside a numpy'ized episode. The
    sampled list-mode steps are Python numbers; RLlib's keep the numpy
    type of the steps that came from numpy'ized chunks."""
    theirs_cls, ours_cls = (TheirPERB, replay.PrioritizedEpisodeReplayBuffer) if prioritized \
        else (TheirERB, replay.EpisodeReplayBuffer)
    found = []
    for episode_cls, cls in ((TheirEpisode, theirs_cls), (SingleAgentEpisode, ours_cls)):
        mixed = _mixed_cartpole_episode(episode_cls)
        assert type(mixed.get_rewards(0)) is float and type(mixed.get_rewards(7)) is np.float64
        buffer = cls(capacity=1000)
        plain = _mixed_cartpole_episode(episode_cls, seed=4)
        plain.to_numpy()
        buffer.add([mixed, plain])
        buffer.rng = np.random.default_rng(0)
        drawn = buffer.sample(30, n_step=1, sample_episodes=True)
        # (Where a step came from: its observation. The prioritized buffer's
        # episodes have ids of their own.)
        mixed_obs = mixed.get_observations()
        found.append([(any(np.array_equal(e.get_observations(0), o) for o in mixed_obs),
                       e.get_observations(), e.get_actions(), e.get_rewards())
                      for e in drawn])
        if cls is ours_cls:
            batch = buffer.sample_batch(64, n_step=1)
            assert batch["rewards"].dtype == np.float64 and batch["actions"].dtype == np.int64
    assert len(found[0]) == len(found[1])
    for (from_mixed, *theirs), (also_mixed, *ours) in zip(*found):
        assert from_mixed == also_mixed
        if from_mixed:
            # (Compared as arrays: the dtypes and values.)
            assert all(type(x) is int for x in ours[1])      # (the actions)
            theirs, ours = [np.array(x) for x in theirs], [np.array(x) for x in ours]
        compare(ours, theirs, "sampled episode")


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_multi_agent_episode_concatenated_with_numpy_chunks_is_stored(prioritized):
    """The multi-agent buffers take such an episode too (each agent's list-mode
    rewards and actions mix Python and numpy numbers): as RLlib's, they hold
    its steps, and sample them with the same values."""
    theirs_cls, ours_cls = (TheirMAPERB, replay.MultiAgentPrioritizedEpisodeReplayBuffer) \
        if prioritized else (TheirMAERB, replay.MultiAgentEpisodeReplayBuffer)
    found = []
    for episode_cls, cls in ((TheirMultiEpisode, theirs_cls), (MultiAgentEpisode, ours_cls)):
        episode = episode_cls(id_="m")
        episode.add_env_reset(observations={"a0": np.zeros(2, np.float32),
                                            "a1": np.zeros(2, np.float32)})
        chunks = []
        for t in range(12):
            episode.add_env_step({"a0": np.full(2, t, np.float32),
                                  "a1": np.full(2, -t, np.float32)},
                                 {"a0": t % 2, "a1": 1}, {"a0": 1.0, "a1": 0.5})
            if (t + 1) % 4 == 0:
                chunks.append(episode)
                episode = episode.cut()
        for chunk in chunks[1::2]:
            chunk.to_numpy()
        for chunk in chunks[1:]:
            chunks[0].concat_episode(chunk)
        buffer = cls(capacity=100)
        buffer.add(chunks[0])
        buffer.rng = np.random.default_rng(0)
        drawn = buffer.sample(num_items=20, n_step=1)
        found.append((buffer.get_num_timesteps(),
                      sorted((float(e.get_observations(0)[0]), int(e.get_actions(0)),
                              float(e.get_rewards(0))) for e in drawn)))
    assert found[1] == found[0]
