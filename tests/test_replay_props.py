"""Properties of episode.replay's buffers, checked against the data fed in.

Generated episode streams (chunks of several envs, continued episodes cut
with a one-step lookback, some done) go into our buffers, and what comes
out is recomputed in Python from what went in:

* n-step transitions: the discounted reward sum, the observation n steps on
  (or the episode's last), the done flags, the `n_step`/`weights` outputs;
* prioritized draws: frequencies proportional to priority ** alpha
  (chi-square), importance weights (p / p_min) ** -beta;
* eviction: the oldest episodes go first and whole, the capacity holds,
  continued chunks are joined;
* sequences: slices of one stored episode, with their lookback;
* the B x T batch: rows of episode segments with their flags;
* checkpoints: get_state() -> set_state() (and a pickled state) samples
  the same.

The state machine at the end runs generated add / sample /
update_priorities / checkpoint sequences on our PrioritizedEpisodeReplayBuffer
and RLlib's side by side (marked rllib; every other test here runs without
ray).
"""
from __future__ import annotations

import collections
import math
import os
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from difftools import compare
from replay_tools import (PLAIN_NUMBERS, chunk_episode, episode_view, multi_agent_stream,
                          numbered_episode, plain_state, single_agent_stream, state_view)

from episode import MultiAgentEpisode, SingleAgentEpisode
from episode.replay import (EpisodeReplayBuffer, MultiAgentEpisodeReplayBuffer,
                            MultiAgentPrioritizedEpisodeReplayBuffer,
                            PrioritizedEpisodeReplayBuffer)

# A failing example is not shrunk (that can take minutes) unless PROPS_SHRINK=1.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if os.environ.get("PROPS_SHRINK"):
    _PHASES.append(Phase.shrink)
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                    phases=_PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BIG = 100_000  # a capacity no generated stream reaches


# -- what was fed ------------------------------------------------------------------------


def key(observation) -> bytes:
    return np.asarray(observation).tobytes()


class Fed:
    """The data fed to a buffer: per episode id, its chunks joined as
    concat_episode joins them (the next chunk's first observation and infos
    replace the last ones), and the (id, t) of every observation."""

    def __init__(self):
        self.episodes: dict = {}
        self.where: dict = {}

    def add(self, chunk: dict) -> None:
        ep = self.episodes.get(chunk["id"])
        if ep is None:
            ep = self.episodes[chunk["id"]] = dict(obs=[], infos=[], acts=[], rews=[], logp=[])
        else:
            assert len(ep["acts"]) == chunk["t0"], "the stream continues its episodes"
            del ep["obs"][-1], ep["infos"][-1]
        for name in ("obs", "infos", "acts", "rews", "logp"):
            ep[name] += list(chunk[name])
        ep["term"], ep["trunc"] = chunk["term"], chunk["trunc"]
        for t, observation in enumerate(chunk["obs"], chunk["t0"]):
            self.where[key(observation)] = (chunk["id"], t)


def feed(buffer, stream, *, numpy=True, lookback=True, extras=True, each_call=None) -> Fed:
    """Adds the stream's calls to `buffer` (our episodes); `each_call(call,
    fed)` runs after each add()."""
    fed = Fed()
    for call in stream:
        buffer.add([chunk_episode(SingleAgentEpisode, c, numpy=numpy, extras=extras,
                                  lookback=lookback) for c in call])
        for c in call:
            fed.add(c)
        if each_call is not None:
            each_call(call, fed)
    return fed


def discounted(rewards, gamma) -> float:
    """sum_k gamma**k * rewards[k], from the last reward backwards (the order
    scipy.signal.lfilter runs RLlib's n-step sums in)."""
    total = float(rewards[-1])
    for r in reversed(rewards[:-1]):
        total = float(r) + gamma * total
    return total


def values(buffer_or_items) -> list:
    """Items of an extra model output (list mode or numpy) as plain values."""
    return np.asarray(buffer_or_items).tolist()


def n_of(episode) -> int:
    (n,) = values(episode.get_extra_model_outputs("n_step"))
    return n


def check_transition(e, fed: Fed, n_step, gamma: float, *, exact_end: bool, infos: bool,
                     extras: bool, starts=None):
    """Asserts that the one-step episode `e` is an n-step transition (n as
    asked, weight 1) of the stored episode it came from; returns (its step
    index, its n, that episode's length). `starts`: the stored episodes'
    first t (default 0)."""
    n = n_of(e)
    assert n in n_range(n_step)
    assert values(e.get_extra_model_outputs("weights")) == [1.0]
    first, last = e.get_observations()
    eid, t = fed.where[key(first)]
    ep = fed.episodes[eid]
    start = starts[eid] if starts else 0
    length, i = len(ep["acts"]) - start, t - start
    m = min(n, length - i)   # the plain buffer cuts a transition at the episode's end
    assert len(e) == 1 and m >= 1 and e.t_started == i
    assert np.array_equal(last, ep["obs"][t + m]), (eid, t, n)
    assert e.get_actions() == [ep["acts"][t]]
    assert e.get_rewards() == [discounted(ep["rews"][t:t + m], gamma)], (eid, t, n)
    # The plain buffer's episode slice keeps the done flags only for a slice
    # ending exactly at the episode's end; the others never pass the end.
    done = (i + n == length) if exact_end else (i + m == length)
    assert e.is_terminated == (done and ep["term"])
    assert e.is_truncated == (done and ep["trunc"])
    if infos:
        assert e.get_infos() == [ep["infos"][t], ep["infos"][t + m]]
    if extras:
        assert values(e.get_extra_model_outputs("logp")) == [ep["logp"][t]]
    else:
        assert "logp" not in e.extra_model_outputs
    return i, n, length


def rllib_count(ts: int, n: int, T: int, length: int) -> int:
    """What EpisodeReplayBuffer.sample(sample_episodes=True) counts a drawn
    item as towards batch_size_B (RLlib's rule: a sequence its length plus
    one, a transition one, or less near the episode's end)."""
    end = length if ts + T + n - 1 > length else ts + T + n - 1
    return (end - ts - (n - 1) + 1) or 1


def mean_count(fed: Fed, n_step) -> float:
    """The mean of rllib_count over the stored steps and n-steps: where it
    is not positive, RLlib's count never reaches batch_size_B (see
    test_replay_bad_input.py)."""
    counts = [rllib_count(ts, n, 0, len(ep["acts"])) for ep in fed.episodes.values()
              for ts in range(len(ep["acts"])) for n in n_range(n_step)]
    return sum(counts) / len(counts)


def assert_counted(counts: list, batch_size: int) -> None:
    # Items are drawn until the count reaches batch_size, not beyond.
    assert sum(counts) >= batch_size > sum(counts[:-1])


# -- strategies ----------------------------------------------------------------------------


def _stream(seed, n_envs, calls, longest_chunk, max_len):
    return single_agent_stream(seed, n_envs=n_envs, calls=calls, fragment=(1, longest_chunk),
                               max_len=max_len)


STREAMS = st.builds(_stream, st.integers(0, 2**16), st.integers(1, 4), st.integers(1, 8),
                    st.integers(2, 7), st.integers(2, 16))
N_STEPS = st.one_of(st.integers(1, 5),
                    st.builds(lambda low, width: (low, low + width), st.integers(1, 3),
                              st.integers(1, 3)))
GAMMAS = st.one_of(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]), st.floats(0.0, 1.0))
SEEDS = st.integers(0, 2**32 - 1)
FLAGS = st.fixed_dictionaries(dict(numpy=st.booleans(), lookback=st.booleans(),
                                   extras=st.booleans()))


def n_range(n_step):
    return range(n_step, n_step + 1) if isinstance(n_step, int) else range(*n_step)


# -- n-step transitions ------------------------------------------------------------------


@SETTINGS
@given(stream=STREAMS, n_step=N_STEPS, gamma=GAMMAS, flags=FLAGS, seed=SEEDS,
       batch_size=st.integers(1, 40))
def test_episode_buffer_n_step_transitions(stream, n_step, gamma, flags, seed, batch_size):
    """EpisodeReplayBuffer.sample(sample_episodes=True): each transition is
    its step's n-step transition, cut at the episode's end."""
    buffer = EpisodeReplayBuffer(capacity=BIG)
    fed = feed(buffer, stream, **flags)
    assume(mean_count(fed, n_step) > 0.25)
    buffer.rng = np.random.default_rng(seed)
    batch = buffer.sample(batch_size, sample_episodes=True, n_step=n_step, gamma=gamma,
                          include_extra_model_outputs=flags["extras"])
    counts = []
    for e in batch:
        assert e.id_ in fed.episodes
        ts, n, length = check_transition(e, fed, n_step, gamma, exact_end=True, infos=True,
                                         extras=flags["extras"])
        counts.append(rllib_count(ts, n, 0, length))
    assert_counted(counts, batch_size)
    assert buffer.get_sampled_timesteps() == batch_size


@SETTINGS
@given(stream=STREAMS, n_step=N_STEPS, gamma=GAMMAS, flags=FLAGS, seed=SEEDS,
       batch_size=st.integers(1, 40), beta=st.sampled_from([0.0, 0.4, 1.0]),
       alpha=st.sampled_from([0.0, 0.6, 1.0]), infos=st.booleans())
def test_prioritized_buffer_n_step_transitions(stream, n_step, gamma, flags, seed, batch_size,
                                               beta, alpha, infos):
    """PrioritizedEpisodeReplayBuffer.sample(): whole n-step transitions
    only (a step too close to its episode's end is drawn again), weight 1
    while every step has the same priority."""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=BIG, alpha=alpha)
    fed = feed(buffer, stream, **flags)
    # A draw that can never succeed would loop forever (as RLlib's does).
    assume(max(len(ep["acts"]) for ep in fed.episodes.values()) >= max(n_range(n_step)))
    buffer.rng = np.random.default_rng(seed)
    batch = buffer.sample(batch_size, n_step=n_step, gamma=gamma, beta=beta,
                          include_infos=infos, include_extra_model_outputs=flags["extras"])
    assert len(batch) == batch_size == len(buffer._last_sampled_indices)
    for e in batch:
        ts, n, length = check_transition(e, fed, n_step, gamma, exact_end=False, infos=infos,
                                         extras=flags["extras"])
        assert ts + n <= length
        if not infos:
            assert e.get_infos() == [{}, {}]


def _one_episode_in_chunks(cuts):
    """An episode of 10 steps built step by step and cut (with a one-step
    lookback) at `cuts`: (its chunks, its data as one chunk dict)."""
    rng = np.random.default_rng(3)
    obs = [rng.normal(size=2).astype(np.float32) for _ in range(11)]
    acts, rews = list(range(10)), [float(r) for r in rng.integers(-5, 5, size=10)]
    logp = [float(x) for x in rng.normal(size=10)]
    ep = SingleAgentEpisode(id_="whole")
    ep.add_env_reset(obs[0], infos={"t": 0})
    chunks = []
    for t in range(10):
        ep.add_env_step(obs[t + 1], acts[t], rews[t], infos={"t": t + 1},
                        extra_model_outputs={"logp": logp[t]}, terminated=t == 9)
        if t + 1 in cuts:
            chunks.append(ep)
            ep = ep.cut(len_lookback_buffer=1)
    chunks.append(ep)
    data = dict(id="whole", t0=0, obs=obs, acts=acts, rews=rews, logp=logp,
                infos=[{"t": t} for t in range(11)], term=True, trunc=False)
    return chunks, data


@pytest.mark.parametrize("prioritized", [False, True])
def test_transitions_span_the_chunks_of_a_continued_episode(prioritized):
    """Chunks of one episode (cut() three times) are joined into one stored
    episode; n-step transitions run across the cuts."""
    chunks, data = _one_episode_in_chunks(cuts=(3, 7))
    fed = Fed()
    fed.add(data)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=50) if prioritized \
        else EpisodeReplayBuffer(capacity=50)
    for chunk in chunks:
        buffer.add(chunk)
    assert (buffer.get_num_episodes(), buffer.get_num_timesteps()) == (1, 10)
    assert list(buffer.episode_id_to_index) == ["whole"]
    buffer.rng = np.random.default_rng(0)
    if prioritized:
        batch = buffer.sample(200, n_step=4, gamma=0.5, include_infos=True,
                              include_extra_model_outputs=True)
    else:
        batch = buffer.sample(200, sample_episodes=True, n_step=4, gamma=0.5,
                              include_extra_model_outputs=True)
    starts = set()
    for e in batch:
        ts, _, _ = check_transition(e, fed, 4, 0.5, exact_end=not prioritized, infos=True,
                                    extras=True)
        starts.add(ts)
    # Transitions that cross the cut at 3 and the one at 7 were drawn.
    assert starts & {0, 1, 2} and starts & {4, 5, 6}


# -- prioritized draws -----------------------------------------------------------------------

# chi2.ppf(0.999, 14): a fit this bad happens once in a thousand seeds.
CHI2_999_DF14 = 36.123


def _step(e) -> tuple:
    num, t = e.get_observations(0)
    return int(num), int(t)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_prioritized_draws_follow_the_priorities(alpha):
    """With priorities set by update_priorities, a step is drawn with
    probability priority ** alpha / sum (chi-square, fixed seed), and gets
    the importance weight (p / p_min) ** -beta."""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=100, alpha=alpha)
    buffer.add([numbered_episode(k, n, terminated=True) for k, n in enumerate((4, 5, 6))])
    steps = [(k, t) for k, n in enumerate((4, 5, 6)) for t in range(n)]
    priority = {s: float(1 + (3 * i) % 7) for i, s in enumerate(steps)}   # 1 .. 7
    buffer.rng = np.random.default_rng(11)
    drawn = [_step(e) for e in buffer.sample(300)]
    assert set(drawn) == set(steps)
    buffer.update_priorities(np.array([priority[s] for s in drawn]))

    draws = 6000
    beta = 0.5
    batch = buffer.sample(draws, beta=beta)
    counts = collections.Counter(_step(e) for e in batch)
    leaf = {s: priority[s] ** alpha for s in steps}
    total = sum(leaf.values())
    observed = np.array([counts[s] for s in steps], float)
    expected = np.array([leaf[s] / total * draws for s in steps])
    assert ((observed - expected) ** 2 / expected).sum() < CHI2_999_DF14
    # The test has the power to tell: uniform draws would fail it.
    uniform = np.full(len(steps), draws / len(steps))
    assert ((observed - uniform) ** 2 / uniform).sum() > 10 * CHI2_999_DF14

    smallest = min(leaf.values())
    for e in batch[:200]:
        (weight,) = values(e.get_extra_model_outputs("weights"))
        assert weight == pytest.approx((leaf[_step(e)] / smallest) ** -beta, rel=1e-9)


# -- eviction --------------------------------------------------------------------------------


class StoredModel:
    """Which episodes a buffer of `capacity` keeps (id -> [first t, end t],
    oldest first) by RLlib's rules: the plain buffer stores each chunk,
    then evicts the oldest while over capacity and holding more than one
    episode; the prioritized one first evicts the oldest until the call's
    steps fit (or one episode would remain), dropping new chunks of the
    episodes it evicts, then stores the rest."""

    def __init__(self, capacity: int, prioritized: bool):
        self.capacity, self.prioritized = capacity, prioritized
        self.stored: dict = {}
        self.evicted = 0

    def steps(self) -> int:
        return sum(end - start for start, end in self.stored.values())

    def add(self, call) -> None:
        if not self.prioritized:
            for c in call:
                self._store(c)
                while self.steps() > self.capacity and len(self.stored) > 1:
                    self._evict(next(iter(self.stored)))
            return
        new = [c["id"] for c in call]
        total = self.steps() + sum(len(c["acts"]) for c in call)
        order, gone = list(self.stored), []
        while total > self.capacity and len(gone) < len(order) and \
                len((set(order) | set(new)) - set(gone)) != 1:
            x = order[len(gone)]
            gone.append(x)
            total -= self.stored[x][1] - self.stored[x][0]
            if x in new:
                total -= len(call[new.index(x)]["acts"])
        for x in gone:
            self._evict(x)
        for c in call:
            if c["id"] not in gone:
                self._store(c)

    def _store(self, c) -> None:
        k = len(c["acts"])
        if c["id"] in self.stored:
            assert self.stored[c["id"]][1] == c["t0"]
            self.stored[c["id"]][1] += k
        else:
            self.stored[c["id"]] = [c["t0"], c["t0"] + k]

    def _evict(self, x) -> None:
        del self.stored[x]
        self.evicted += 1


def check_stored(buffer, model: StoredModel, fed: Fed, lookback: bool) -> None:
    """The buffer holds the model's episodes, in its order, each the fed
    data from its first stored t to the last one fed."""
    assert list(buffer.episode_id_to_index) == list(model.stored)
    assert buffer.get_num_timesteps() == model.steps()
    assert buffer.get_num_episodes() == len(model.stored)
    assert buffer.get_num_episodes_evicted() == model.evicted
    for e in buffer.episodes:
        start, end = model.stored[e.id_]
        ep = fed.episodes[e.id_]
        assert end == len(ep["acts"])
        assert (e.t_started, len(e)) == (start, end - start)
        observations = e.get_observations()
        assert len(observations) == end - start + 1
        assert all(np.array_equal(a, b) for a, b in zip(observations, ep["obs"][start:]))
        assert values(e.get_actions()) == ep["acts"][start:]
        assert values(e.get_rewards()) == ep["rews"][start:]
        assert (e.is_terminated, e.is_truncated) == (ep["term"], ep["trunc"])
        # A stored episode that began with a continued chunk keeps its lookback.
        assert e.observations.lookback == (1 if lookback and start > 0 else 0)


def tree_leaves(capacity: int) -> int:
    """The leaves of RLlib's priority trees for `capacity`: twice the
    capacity rounded up to a power of two."""
    return 2 * 2 ** math.ceil(math.log2(capacity))


@pytest.mark.parametrize("capacity, lengths, kept", [(1, [3], ["ep9"]),
                                                     (4, [3, 3, 3], ["ep2", "ep9"]),
                                                     (4, [9], ["ep9"])])
def test_a_call_larger_than_the_trees_is_stored(capacity, lengths, kept):
    """One add() with more new steps than the priority trees have leaves
    (RLlib's add crashes popping from an empty deque, a pinned difference):
    ours stores them all, over capacity until the next add() evicts."""
    assert sum(lengths) > tree_leaves(capacity)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=capacity)
    buffer.add([numbered_episode(k, n) for k, n in enumerate(lengths)])
    assert buffer.get_num_timesteps() == sum(lengths)
    assert buffer.get_num_episodes() == len(lengths)
    buffer.rng = np.random.default_rng(0)
    steps = {_step(e) for e in buffer.sample(200)}
    assert steps == {(k, t) for k, n in enumerate(lengths) for t in range(n)}
    # Its checkpoint (of the doubled trees) loads into a fresh buffer.
    copy_ = PrioritizedEpisodeReplayBuffer(capacity=capacity)
    copy_.set_state(buffer.get_state())
    compare(plain_state(copy_.get_state()), plain_state(buffer.get_state()), "restored")
    # RLlib's rule: the oldest go until the steps fit or one episode is left.
    buffer.add(numbered_episode(9, 1))
    assert list(buffer.episode_id_to_index) == kept
    assert buffer.get_num_timesteps() == 1 + 3 * (len(kept) - 1)
    assert {_step(e) for e in buffer.sample(100)} == \
        {(int(i[2:]), t) for i in kept for t in range(1 if i == "ep9" else 3)}


@SETTINGS
@given(stream=STREAMS, capacity=st.integers(1, 30), prioritized=st.booleans(), flags=FLAGS,
       seed=SEEDS)
def test_eviction_keeps_the_newest_whole_episodes(stream, capacity, prioritized, flags, seed):
    """After every add(): the oldest episodes went first, whole; the
    capacity holds unless one episode alone exceeds it (or, for the
    prioritized buffer, the call's new episodes do); evictions are counted;
    transitions drawn span the stored chunks correctly."""
    if prioritized:
        # More steps at once than the priority trees have leaves: see
        # test_a_call_larger_than_the_trees_is_stored.
        model, peak = StoredModel(capacity, prioritized), 0
        for call in stream:
            model.add(call)
            peak = max(peak, model.steps())
        assume(peak <= tree_leaves(capacity))
    cls = PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer
    buffer = cls(capacity=capacity)
    buffer.rng = np.random.default_rng(seed)
    model = StoredModel(capacity, prioritized)
    before: set = set()

    def each_call(call, fed):
        nonlocal before
        model.add(call)
        check_stored(buffer, model, fed, flags["lookback"])
        stored = set(buffer.episode_id_to_index)
        assert buffer.get_num_timesteps() <= capacity or len(stored) == 1 or (
            prioritized and not stored & before)
        before = stored
        if not buffer.get_num_timesteps():
            return
        starts = {eid: start for eid, (start, _) in model.stored.items()}
        if prioritized:
            longest = max(end - start for start, end in model.stored.values())
            batch = buffer.sample(5, n_step=min(2, longest), gamma=0.9, include_infos=True,
                                  include_extra_model_outputs=flags["extras"])
        else:
            batch = buffer.sample(5, sample_episodes=True, n_step=2, gamma=0.9,
                                  include_extra_model_outputs=flags["extras"])
        for e in batch:
            check_transition(e, fed, (1, 3), 0.9, exact_end=not prioritized, infos=True,
                             extras=flags["extras"], starts=starts)

    feed(buffer, stream, each_call=each_call, **flags)


# -- sequences and the B x T batch ------------------------------------------------------------


@SETTINGS
@given(stream=STREAMS, flags=FLAGS, seed=SEEDS, batch_size=st.integers(1, 30),
       T=st.integers(1, 6), lookback=st.integers(0, 3), min_T=st.integers(0, 2))
def test_sequences_are_slices_of_one_stored_episode(stream, flags, seed, batch_size, T,
                                                    lookback, min_T):
    """sample(batch_length_T=T, n_step=1, sample_episodes=True, lookback=L):
    each sequence is steps ts .. of one stored episode (at most T, at least
    min_batch_length_T + 1 where T allows), with up to L steps of lookback
    before it, the episode's done flags only where it reaches the end."""
    buffer = EpisodeReplayBuffer(capacity=BIG)
    fed = feed(buffer, stream, **flags)
    assume(max(len(ep["acts"]) for ep in fed.episodes.values()) > min_T)
    buffer.rng = np.random.default_rng(seed)
    batch = buffer.sample(batch_size, batch_length_T=T, n_step=1, sample_episodes=True,
                          lookback=lookback, min_batch_length_T=min_T)
    counts = []
    for e in batch:
        observations = e.get_observations()
        eid, t = fed.where[key(observations[0])]
        ep = fed.episodes[eid]
        length, steps = len(ep["acts"]), len(e)
        assert t + min_T < length
        assert steps == min(T, length - t) and e.id_ == eid and e.t_started == t
        assert len(observations) == steps + 1
        assert all(np.array_equal(a, b) for a, b in zip(observations, ep["obs"][t:]))
        assert values(e.get_actions()) == ep["acts"][t:t + steps]
        assert values(e.get_rewards()) == ep["rews"][t:t + steps]
        assert e.get_infos() == ep["infos"][t:t + steps + 1]
        lb = e.observations.lookback
        assert lb == min(lookback, t)
        if lb:
            before = e.get_observations(list(range(-lb, 0)), neg_index_as_lookback=True)
            assert all(np.array_equal(a, b) for a, b in zip(before, ep["obs"][t - lb:t]))
            assert values(e.get_actions(list(range(-lb, 0)), neg_index_as_lookback=True)) \
                == ep["acts"][t - lb:t]
        ends = t + steps == length
        assert (e.is_terminated, e.is_truncated) == (ends and ep["term"], ends and ep["trunc"])
        # (These two get the lookback asked for, even where the episode has less.)
        for name, value in (("n_step", 1), ("weights", 1.0)):
            extra = e.extra_model_outputs[name]
            assert extra.lookback == lookback
            assert values(extra.data) == [value] * (steps + lookback)
        if flags["extras"]:
            assert values(e.get_extra_model_outputs("logp")) == ep["logp"][t:t + steps]
        counts.append(rllib_count(t, 1, T, length))
    assert_counted(counts, batch_size)


@SETTINGS
@given(stream=STREAMS, flags=FLAGS, seed=SEEDS, batch_size=st.integers(1, 8),
       T=st.integers(1, 12))
def test_batch_rows_are_episode_segments(stream, flags, seed, batch_size, T):
    """sample() (no sample_episodes): a (B, T) batch; each row is a drawn
    step's episode from there on, then whole episodes from their start,
    cut at T. is_first marks where each segment starts, is_last where it
    ends, is_terminated/is_truncated a segment that reaches its episode's
    end; the first reward of a segment is the one before its first step."""
    buffer = EpisodeReplayBuffer(capacity=BIG)
    fed = feed(buffer, stream, **flags)
    buffer.rng = np.random.default_rng(seed)
    out = buffer.sample(batch_size, batch_length_T=T)
    assert list(out) == ["obs", "actions", "rewards", "is_first", "is_last", "is_terminated",
                         "is_truncated"]
    assert all(v.shape[:2] == (batch_size, T) for v in out.values())
    assert buffer.get_sampled_timesteps() == batch_size * T
    for b in range(batch_size):
        starts = [k for k in range(T) if out["is_first"][b, k]]
        assert starts[0] == 0
        flags_at = {name: set() for name in ("is_last", "is_terminated", "is_truncated")}
        for j, a in enumerate(starts):
            z = starts[j + 1] if j + 1 < len(starts) else T
            eid, t = fed.where[key(out["obs"][b, a])]
            ep = fed.episodes[eid]
            length = len(ep["acts"])
            rest = length - t + 1          # observations left, the last one included
            assert t == 0 or j == 0        # later segments start at their episode's start
            assert z - a == rest if j + 1 < len(starts) else z - a <= rest
            for k in range(z - a):
                assert np.array_equal(out["obs"][b, a + k], ep["obs"][t + k])
                assert out["actions"][b, a + k] == ep["acts"][min(t + k, length - 1)]
                assert out["rewards"][b, a + k] == (ep["rews"][t + k - 1] if t + k else 0.0)
            flags_at["is_last"].add(z - 1)
            if z - a == rest:
                if ep["term"]:
                    flags_at["is_terminated"].add(z - 1)
                elif ep["trunc"]:
                    flags_at["is_truncated"].add(z - 1)
        for name, where in flags_at.items():
            assert set(np.flatnonzero(out[name][b])) == where, (name, b)


# -- checkpoints -----------------------------------------------------------------------------


def _draw_everything(buffer, prioritized: bool) -> list:
    """A seeded round of every kind of sample the buffer has, as views."""
    buffer.rng = np.random.default_rng(5)
    if prioritized:
        return [episode_view(e, with_id=False)
                for e in buffer.sample(10, n_step=(1, 3), beta=0.5, gamma=0.9,
                                       include_infos=True, include_extra_model_outputs=True)]
    out = [episode_view(e) for e in buffer.sample(10, sample_episodes=True, n_step=2,
                                                  include_extra_model_outputs=True)]
    out += [episode_view(e) for e in buffer.sample(6, sample_episodes=True, n_step=1,
                                                   batch_length_T=3, lookback=1)]
    out.append(buffer.sample(3, batch_length_T=4))
    return out


@SETTINGS
@given(stream=STREAMS, capacity=st.integers(4, 40), prioritized=st.booleans(), seed=SEEDS)
def test_a_restored_state_samples_the_same(stream, capacity, prioritized, seed):
    """get_state() -> set_state() into a fresh buffer (also through a
    pickle of the state): the same state, the same draws, and the same again
    after one more add()."""
    assume(len(stream) >= 2)
    cls = PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer
    buffer = cls(capacity=capacity, alpha=0.7) if prioritized else cls(capacity=capacity)
    feed(buffer, stream[:-1])
    if prioritized:
        buffer.rng = np.random.default_rng(seed)
        drawn = buffer.sample(6)
        priorities = np.random.default_rng(seed).uniform(0, 3, len(drawn)).astype(np.float32)
        buffer.update_priorities(priorities)
        buffer.sample(3)   # the last sampled indices are part of the state
    state = buffer.get_state()
    copies = []
    for loaded in (state, pickle.loads(pickle.dumps(state))):
        copy_ = cls(capacity=capacity, alpha=0.7) if prioritized else cls(capacity=capacity)
        copy_.set_state(loaded)
        compare(copy_.get_state(), state, "restored state")
        copies.append(copy_)
    expected = _draw_everything(buffer, prioritized)
    for copy_ in copies:
        compare(_draw_everything(copy_, prioritized), expected, "draws after set_state")
    last = [chunk_episode(SingleAgentEpisode, c, numpy=True, extras=True, lookback=True)
            for c in stream[-1]]
    for b in [buffer] + copies:
        b.add(last)
    for copy_ in copies:
        compare(copy_.get_state(), buffer.get_state(), "state after one more add")
    expected = _draw_everything(buffer, prioritized)
    for copy_ in copies:
        compare(_draw_everything(copy_, prioritized), expected, "draws after one more add")


def test_priorities_of_evicted_steps_are_dropped():
    """Steps drawn, then evicted before update_priorities(): the buffer's
    checkpoint still loads, the update lands on no free tree leaf, and
    later draws find only stored steps. (RLlib writes the priorities onto
    the freed leaves, and a later draw that lands there raises KeyError: a
    pinned difference.)"""
    buffer = PrioritizedEpisodeReplayBuffer(capacity=4)
    buffer.add([numbered_episode(0, 1), numbered_episode(1, 3)])
    buffer.rng = np.random.default_rng(0)
    drawn = [_step(e) for e in buffer.sample(20)]
    assert (0, 0) in drawn
    # Episode 0's next chunk pushes it out, with its drawn step.
    buffer.add(SingleAgentEpisode(id_="ep0", observations=[np.array([0, 1], np.float32)] * 2,
                                  actions=[0], rewards=[0.0], t_started=1,
                                  len_lookback_buffer=0))
    assert list(buffer.episode_id_to_index) == ["ep1"]
    restored = PrioritizedEpisodeReplayBuffer(capacity=4)
    restored.set_state(buffer.get_state())
    buffer.update_priorities(np.full(20, 3.0))
    state = buffer.get_state()
    size = len(state["_sum_segment"]) // 2
    used = {leaf for *_, leaf in state["_indices"]}
    assert all(state["_sum_segment"][size + leaf] == 0.0 for leaf in state["_free_nodes"])
    assert buffer._sum_segment.sum() == pytest.approx(3.0 * len(used))
    assert {_step(e) for e in buffer.sample(50)} <= {(1, 0), (1, 1), (1, 2)}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("numpy, turn_based", [(True, False), (False, False), (True, True),
                                               (False, True)],
                         ids=["numpy", "lists", "numpy-turn_based", "lists-turn_based"])
@pytest.mark.parametrize("cls", [MultiAgentEpisodeReplayBuffer,
                                 MultiAgentPrioritizedEpisodeReplayBuffer])
def test_a_restored_multi_agent_state_samples_the_same(cls, numpy, turn_based, seed):
    """The multi-agent buffers' get_state() -> pickle -> set_state() round
    trip, after each add() of a stream whose episodes (three agents on two
    modules, chunks of list-mode or numpy'ized episodes, agents that skip
    steps) get evicted: the same state and the same draws as the buffer it
    came from, and both take the next chunks alike (a checkpoint whose
    module holds an agent's actions as float64, as RLlib's concat makes
    them, still takes int64 ones)."""
    stream = multi_agent_stream(seed, (MultiAgentEpisode,), calls=16, numpy=numpy,
                                turn_based=turn_based)
    buffer = cls(capacity=30)
    restored = None
    for i, call in enumerate(stream):
        for b in (buffer, restored) if restored is not None else (buffer,):
            b.add([c[0] for c in call])
        if restored is not None:
            compare(plain_state(restored.get_state()), plain_state(buffer.get_state()),
                    f"state after add {i}")
        restored = cls(capacity=30)
        restored.set_state(pickle.loads(pickle.dumps(buffer.get_state())))
        compare(plain_state(restored.get_state()), plain_state(buffer.get_state()),
                f"restored state {i}")
        views = []
        for b in (buffer, restored):
            b.rng = np.random.default_rng(i)
            views.append([episode_view(e, with_id=False) for e in b.sample(6, n_step=1)])
        compare(views[1], views[0], f"draws after set_state {i}")
    assert buffer.get_num_episodes_evicted() >= 2


# -- observations that are not numbers -----------------------------------------------------------

OBJECT_OBSERVATIONS = {
    "str": lambda t: f"s{t}",
    "dict_with_str": lambda t: {"a": np.float32(t), "b": f"s{t}"},
    "tuple": lambda t: (np.array([t, -t], np.int64), float(t)),
    "ragged": lambda t: np.full(t + 1, float(t)),
    "None_then_str": lambda t: None if t % 2 else f"s{t}",
}


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("kind", list(OBJECT_OBSERVATIONS))
def test_transitions_of_object_observations(kind, prioritized):
    """n-step transitions of episodes whose observations are strings,
    ragged arrays, Dicts with a string leaf...: the observations of the
    step and of n steps later, as they were added (RLlib takes them all)."""
    make = OBJECT_OBSERVATIONS[kind]
    # Action 10 * k + t names step t of episode k.
    episodes = [SingleAgentEpisode(id_=f"e{k}", observations=[make(10 * k + t) for t in range(6)],
                                   actions=[10 * k + t for t in range(5)], rewards=[1.0] * 5,
                                   terminated=True, len_lookback_buffer=0) for k in range(2)]
    buffer = PrioritizedEpisodeReplayBuffer(capacity=50) if prioritized \
        else EpisodeReplayBuffer(capacity=50)
    buffer.add(episodes)
    buffer.rng = np.random.default_rng(0)
    batch = buffer.sample(20, n_step=2) if prioritized \
        else buffer.sample(20, sample_episodes=True, n_step=2)
    assert batch
    for e in batch:
        k, t = divmod(e.get_actions()[0], 10)
        assert e.t_started == t
        compare(e.get_observations(), [episodes[k].get_observations(t),
                                       episodes[k].get_observations(min(t + 2, 5))], kind)


# -- against RLlib: generated operation sequences ---------------------------------------------


class PrioritizedAgainstRLlib(RuleBasedStateMachine):
    """Our PrioritizedEpisodeReplayBuffer and RLlib's through the same
    generated add / sample / update_priorities / checkpoint operations:
    the same outcome of each, the same state after each. Where RLlib raises
    and ours must not (its add pops from an empty deque when one call's new
    steps exceed the capacity: a pinned difference), the run stops
    comparing."""

    @initialize(capacity=st.integers(4, 40), alpha=st.sampled_from([0.0, 0.6, 1.0]),
                seed=SEEDS, numpy=st.booleans(), lookback=st.booleans())
    def start(self, capacity, alpha, seed, numpy, lookback):
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode as TheirEpisode
        from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer as Theirs

        self.classes = (TheirEpisode, SingleAgentEpisode)
        self.capacity, self.alpha = capacity, alpha
        self.theirs, self.ours = Theirs(capacity=capacity, alpha=alpha), \
            PrioritizedEpisodeReplayBuffer(capacity=capacity, alpha=alpha)
        self.theirs.rng, self.ours.rng = np.random.default_rng(seed), np.random.default_rng(seed)
        self.data = np.random.default_rng(seed + 1)
        self.numpy, self.lookback = numpy, lookback
        self.envs = [None] * 4
        self.made = 0
        self.stopped = False
        self.drawn: list = []

    def _chunk(self, env: int, steps: int, end: str) -> dict:
        # The next chunk of env `env` (a new episode if its last one ended),
        # in single_agent_stream's format.
        rng = self.data
        if self.envs[env] is None:
            self.made += 1
            self.envs[env] = dict(id=f"m{self.made}", t=0, prev=None,
                                  obs=rng.normal(size=2).astype(np.float32))
        s = self.envs[env]
        obs = [s["obs"]] + [rng.normal(size=2).astype(np.float32) for _ in range(steps)]
        acts = [int(a) for a in rng.integers(0, 3, size=steps)]
        rews = [float(np.round(r, 2)) for r in rng.normal(size=steps)]
        logp = [float(x) for x in rng.normal(size=steps)]
        infos = [{"i": t} for t in range(steps + 1)]
        chunk = dict(id=s["id"], t0=s["t"], obs=obs, acts=acts, rews=rews, logp=logp,
                     infos=infos, term=end == "term", trunc=end == "trunc", prev=s["prev"])
        s.update(t=s["t"] + steps, obs=obs[-1],
                 prev=(obs[-2], acts[-1], rews[-1], logp[-1], infos[-2]))
        if end:
            self.envs[env] = None
        return chunk

    @rule(chunks=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6),
                                    st.sampled_from(["", "", "term", "trunc"])),
                          min_size=1, max_size=3, unique_by=lambda c: c[0]))
    def add(self, chunks):
        if self.stopped:
            return
        call = [self._chunk(*c) for c in chunks]
        theirs, ours = ([chunk_episode(cls, c, numpy=self.numpy, extras=True,
                                       lookback=self.lookback) for c in call]
                        for cls in self.classes)
        try:
            self.theirs.add(theirs)
        except Exception:   # noqa: BLE001 - RLlib's pinned crashes end the comparison
            self.stopped = True
            return
        self.ours.add(ours)

    @rule(batch_size=st.integers(1, 8),
          n_step=st.one_of(st.none(), st.integers(0, 3),
                           st.builds(lambda low, width: (low, low + width), st.integers(1, 2),
                                     st.integers(1, 2))),
          beta=st.sampled_from([0.0, 0.4, 1.0]), gamma=st.sampled_from([0.0, 0.9, 1.0]),
          infos=st.booleans(), extras=st.booleans())
    def sample(self, batch_size, n_step, beta, gamma, infos, extras):
        if self.stopped:
            return
        longest = max((len(e) for e in self.ours.episodes), default=0)
        if longest and longest < max(n_range(n_step or 1)):
            return   # no step could be drawn: both would loop forever
        kwargs = dict(n_step=n_step, beta=beta, gamma=gamma, include_infos=infos,
                      include_extra_model_outputs=extras)
        try:
            theirs = self.theirs.sample(batch_size, **kwargs)
        except Exception as error:   # noqa: BLE001 - an empty buffer: the same class
            with pytest.raises(type(error)):
                self.ours.sample(batch_size, **kwargs)
            return
        ours = self.ours.sample(batch_size, **kwargs)
        compare([episode_view(e, with_id=False) for e in ours],
                [episode_view(e, with_id=False) for e in theirs], "sample")
        self.drawn = self._their_steps()

    def _their_steps(self) -> list:
        # The (episode index, t) of RLlib's last sampled leaves (None: free).
        theirs = self.theirs
        return [tuple(theirs._indices[theirs._tree_idx_to_sample_idx[leaf]][:2])
                if leaf in theirs._tree_idx_to_sample_idx else None
                for leaf in theirs._last_sampled_indices]

    @precondition(lambda self: not self.stopped and self.theirs._last_sampled_indices)
    @rule(data=st.data(), as_numpy=st.booleans())
    def update_priorities(self, data, as_numpy):
        if self._their_steps() != self.drawn:
            # Steps drawn, then evicted: RLlib writes their priorities onto
            # their leaves, free (later draws that land there raise KeyError)
            # or taken by new steps since; ours drops them
            # (test_priorities_of_evicted_steps_are_dropped).
            self.stopped = True
            return
        k = len(self.ours._last_sampled_indices)
        priorities = data.draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 5.0)),
                                        min_size=k, max_size=k))
        if as_numpy:
            priorities = np.array(priorities, np.float32)
        self.theirs.update_priorities(priorities)
        self.ours.update_priorities(priorities)

    @precondition(lambda self: not self.stopped)
    @rule(from_rllib=st.booleans(), pickled=st.booleans())
    def checkpoint(self, from_rllib, pickled):
        their_state, our_state = self.theirs.get_state(), self.ours.get_state()
        if pickled:
            our_state = pickle.loads(pickle.dumps(our_state))
        theirs = type(self.theirs)(capacity=self.capacity, alpha=self.alpha)
        ours = PrioritizedEpisodeReplayBuffer(capacity=self.capacity, alpha=self.alpha)
        theirs.set_state(their_state)
        ours.set_state(their_state if from_rllib else our_state)
        for new, old in ((theirs, self.theirs), (ours, self.ours)):
            new.rng, new.metrics = old.rng, old.metrics
        self.theirs, self.ours = theirs, ours

    @invariant()
    def same_state(self):
        if getattr(self, "stopped", True):
            return
        compare(state_view(self.ours.get_state()), state_view(self.theirs.get_state()), "state")
        for name in ("get_num_timesteps", "get_num_episodes", "get_num_episodes_evicted",
                     "get_added_timesteps", "get_sampled_timesteps"):
            assert getattr(self.ours, name)() == getattr(self.theirs, name)(), name


@pytest.mark.rllib
def test_prioritized_buffer_runs_as_rllib():
    pytest.importorskip("ray.rllib")
    run_state_machine_as_test(
        PrioritizedAgainstRLlib,
        settings=settings(SETTINGS, max_examples=25, stateful_step_count=25))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lengths=st.lists(st.integers(2, 40), min_size=1,
                                                         max_size=12),
       batch_size=st.integers(1, 70), alpha=st.sampled_from([0.5, 1.0]))
def test_prioritized_sample_batch_lands_where_its_prefix_sums_fall(seed, lengths, batch_size,
                                                                   alpha):
    """The native prioritized draw (sample_batch, 1-step: no redraws) puts
    draw i on the stored step whose span of the cumulative priorities holds
    u_i * total, u_i the rng's i-th random(), and weighs it (p N) ** -beta
    over the largest weight: checked against numpy's cumulative sum, over
    batches that are no multiple of the 16 draws walked down together."""
    rng = np.random.default_rng(seed)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=1000, alpha=alpha)
    buffer.add([numbered_episode(i, n) for i, n in enumerate(lengths)])
    buffer.rng = np.random.default_rng(seed)
    first = buffer.sample_batch(8)
    buffer.update_priorities(rng.uniform(0.01, 5.0, 8))
    leaves = [leaf for _, _, leaf in buffer._indices]
    values = np.array([buffer._sum_segment[leaf] for leaf in leaves], np.float64)
    order = np.argsort(leaves)
    cumulative = np.cumsum(values[order])
    total = float(buffer._sum_segment.sum())
    expected_rng = np.random.default_rng(seed)
    expected_rng.bit_generator.state = buffer.rng.bit_generator.state
    u = expected_rng.random(batch_size)
    batch = buffer.sample_batch(batch_size, beta=0.5)
    target = u * total
    at = np.minimum(np.searchsorted(cumulative, target, side="right"), len(leaves) - 1)
    # (A sum within rounding of its span's ends may fall on either side.)
    edges = np.concatenate([[0.0], cumulative])
    clear = (np.abs(edges[at] - target) > 1e-9 * total) & \
        (np.abs(edges[at + 1] - target) > 1e-9 * total)
    drawn = np.array(buffer._last_sampled_indices)
    expected = np.array(leaves)[order][at]
    assert (drawn[clear] == expected[clear]).all()
    p = values[order][np.searchsorted(np.array(leaves)[order], drawn)] / total
    N = len(leaves)
    weights = (p * N) ** -0.5 / (values.min() / total * N) ** -0.5
    np.testing.assert_allclose(batch["weights"], weights, rtol=1e-5)
    assert len(first["obs"]) == 8


# -- the multi-agent buffers' sample_batch() ------------------------------------------------


def test_multi_agent_sample_batch_returns_the_stored_steps():
    """The repro of issue 28 (item 6.1): sample_batch() of a multi-agent
    buffer returned zeros of dtype int8; now a batch per module of the
    agent's real transitions."""
    for cls in (MultiAgentEpisodeReplayBuffer, MultiAgentPrioritizedEpisodeReplayBuffer):
        m = MultiAgentEpisode()
        m.add_env_reset(observations={"a": np.ones(2, np.float32)})
        for t in range(4):
            m.add_env_step({"a": np.full(2, t + 2, np.float32)}, {"a": t}, {"a": 5.0 + t})
        buffer = cls(capacity=100)
        buffer.add(m)
        buffer.rng = np.random.default_rng(0)
        batches = buffer.sample_batch(50)
        assert list(batches) == ["default_policy"]
        batch = batches["default_policy"]
        assert batch["obs"].dtype == batch["new_obs"].dtype == np.float32
        assert batch["obs"].shape == batch["new_obs"].shape == (50, 2)
        assert batch["actions"].dtype == np.int64 and batch["rewards"].dtype == np.float64
        # Observation ones, then 2, 3, 4, 5: transition t is (obs t, action t,
        # reward 5 + t, obs t + 1).
        t = batch["actions"]
        assert set(t.tolist()) <= {0, 1, 2, 3} and len(set(t.tolist())) > 1
        np.testing.assert_array_equal(batch["obs"][:, 0], np.where(t == 0, 1.0, t + 1.0))
        np.testing.assert_array_equal(batch["new_obs"][:, 0], t + 2.0)
        np.testing.assert_array_equal(batch["rewards"], 5.0 + t)
        np.testing.assert_array_equal(batch["terminateds"], np.zeros(50, bool))


def _two_module_episodes(seed: int, n: int):
    """`n` finished multi-agent episodes: agent "a" (module "ma") steps at
    every env step, "b" (module "mb") at every other one."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(n):
        m = MultiAgentEpisode(id_=f"two{i}", agent_to_module_mapping_fn=lambda a, e: "m" + a)
        m.add_env_reset(observations={"a": rng.normal(size=3).astype(np.float32),
                                      "b": rng.normal(size=3).astype(np.float32)})
        length = int(rng.integers(3, 12))
        for t in range(length):
            agents = ["a", "b"] if t % 2 else ["a"]
            last = t == length - 1
            m.add_env_step({a: rng.normal(size=3).astype(np.float32) for a in agents},
                           {a: int(rng.integers(4)) for a in agents},
                           {a: float(rng.normal()) for a in agents},
                           terminateds={"__all__": last}, truncateds={"__all__": False},
                           extra_model_outputs={a: {"q": float(rng.normal())} for a in agents})
        episodes.append(m)
    return episodes


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("kwargs", [dict(n_step=1), dict(n_step=(1, 4), gamma=0.9),
                                    dict(batch_length_T=3, lookback=1,
                                         include_extra_model_outputs=True)],
                         ids=["1-step", "n-step-range", "sequences"])
def test_multi_agent_sample_batch_draws_each_module_as_a_single_agent_buffer(prioritized,
                                                                             kwargs):
    """A module's batch is the batch the single-agent buffer holding the
    module's agent episodes draws (same rng, modules in turn): every key
    but `indices` (each store's own) equal."""
    cls = MultiAgentPrioritizedEpisodeReplayBuffer if prioritized \
        else MultiAgentEpisodeReplayBuffer
    single_cls = PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer
    episodes = _two_module_episodes(7, 6)
    buffer = cls(capacity=1000)
    singles = {"ma": single_cls(capacity=1000), "mb": single_cls(capacity=1000)}
    for m in episodes:
        buffer.add(m)
        for agent_id, agent_episode in m.agent_episodes.items():
            singles["m" + agent_id].add(SingleAgentEpisode.from_state(agent_episode.get_state()))
    if prioritized:
        kwargs = dict(kwargs, beta=0.4)
    buffer.rng = np.random.default_rng(3)
    shared = np.random.default_rng(3)
    for single in singles.values():
        single.rng = shared
    for round_ in range(3):
        got = buffer.sample_batch(9, modules_to_sample=["ma", "mb"], **kwargs)
        assert list(got) == ["ma", "mb"]
        for module_id, single in singles.items():
            expected = single.sample_batch(9, **kwargs)
            assert set(got[module_id]) == set(expected)
            for name, value in expected.items():
                if name != "indices":
                    np.testing.assert_array_equal(got[module_id][name], value, err_msg=name)
            if prioritized:
                priorities = np.arange(1.0, 10.0) * (round_ + 1)
                buffer.update_priorities(priorities, module_id)
                single.update_priorities(priorities)
                compare(buffer._modules[module_id].priorities.sum_values(),
                        single._sum_segment.get_state(), f"{module_id} sum tree")


def test_multi_agent_sample_batch_refuses_modules_without_steps():
    buffer = MultiAgentPrioritizedEpisodeReplayBuffer(capacity=100)
    with pytest.raises(ValueError, match="no timesteps"):
        buffer.sample_batch(4)
    buffer.add(_two_module_episodes(0, 1))
    buffer.rng = np.random.default_rng(0)
    state = buffer.rng.bit_generator.state
    with pytest.raises(ValueError, match="'mc' has no stored timesteps"):
        buffer.sample_batch(4, modules_to_sample=["ma", "mc"])
    with pytest.raises(ValueError, match="beta must be >= 0"):
        buffer.sample_batch(4, beta=-1.0)
    with pytest.raises(ValueError, match="beta weights a prioritized draw"):
        MultiAgentEpisodeReplayBuffer(capacity=100).sample_batch(4, beta=0.4)
    assert buffer.rng.bit_generator.state == state
    batch = buffer.sample_batch(4, modules_to_sample=["mb"])["mb"]
    with pytest.raises(ValueError, match="names no step"):
        buffer.update_priorities(np.ones(4), "ma", indices=batch["indices"])
    buffer.update_priorities(np.full(4, 3.0), "mb", indices=batch["indices"])
    assert buffer._module_to_max_priority["mb"] == 3.0


# -- checkpoints of the priority trees, packed -------------------------------------------------


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer,
                                 MultiAgentPrioritizedEpisodeReplayBuffer])
def test_an_empty_prioritized_buffer_pickles_small(cls):
    """Issue 28 (item 6.10): an empty buffer of capacity 1M pickled to 86 MB
    (every node of both trees and every free leaf); its pickle packs them:
    the trees keep only what is not neutral, the free leaves are runs.
    get_state() still returns RLlib's plain lists."""
    from episode.replay.prioritized import _packed_state

    buffer = cls(capacity=1_000_000)
    data = pickle.dumps(buffer, protocol=5)
    assert len(data) < 10_000
    state = buffer.get_state()
    assert type(state["_sum_segment"]) is list and type(state["_free_nodes"]) is list
    back = pickle.loads(pickle.dumps(_packed_state(buffer.get_state())))
    for key in ("_sum_segment", "_min_segment", "_free_nodes"):
        assert isinstance(back[key], list) and back[key] == state[key]
    _compare_long(plain_state(pickle.loads(data).get_state()), plain_state(state), "unpickled")


def _compare_long(ours, theirs, path):
    # compare(), with a long list of plain numbers checked whole: each
    # item's value and type (compare() walks 2M items in seconds).
    if type(ours) is list and type(theirs) is list and len(theirs) > 1000 \
            and set(map(type, theirs)) <= PLAIN_NUMBERS:
        assert ours == theirs and list(map(type, ours)) == list(map(type, theirs)), path
    elif type(ours) is dict and type(theirs) is dict:
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            _compare_long(ours[key], theirs[key], f"{path}.{key}")
    else:
        compare(ours, theirs, path)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(0, 60),
       kind=st.sampled_from(["float32", "float64", "python", "ints"]))
def test_packed_trees_unpickle_to_the_same_values_and_types(seed, steps, kind):
    """A prioritized buffer's checkpoint after adds, evictions and updates
    of each kind of priorities: pickled (packed) and loaded, every node value
    keeps its value and type (RLlib's numbers), the free leaves their order,
    and a buffer restored from it draws as the first."""
    rng = np.random.default_rng(seed)
    buffer = PrioritizedEpisodeReplayBuffer(capacity=40, alpha=0.6)
    buffer.rng = np.random.default_rng(seed)
    for i in range(steps // 5):
        buffer.add(numbered_episode(i, int(rng.integers(1, 9))))
        drawn = len(buffer.sample(4))
        values = rng.uniform(0.0, 3.0, drawn)
        buffer.update_priorities({"float32": values.astype(np.float32), "float64": values,
                                  "python": values.tolist(),
                                  "ints": [int(v) for v in values]}[kind])
    from episode.replay.prioritized import _packed_state

    state = buffer.get_state()
    back = pickle.loads(pickle.dumps(_packed_state(buffer.get_state())))
    for key in ("_sum_segment", "_min_segment", "_free_nodes"):
        assert [(type(x), x) for x in back[key]] == [(type(x), x) for x in state[key]], key
    restored = PrioritizedEpisodeReplayBuffer(capacity=40, alpha=0.6)
    restored.set_state(back)
    if buffer.get_num_timesteps():
        buffer.rng, restored.rng = np.random.default_rng(1), np.random.default_rng(1)
        compare([episode_view(e, with_id=False) for e in restored.sample(5)],
                [episode_view(e, with_id=False) for e in buffer.sample(5)], "draws")


def test_node_values_of_other_types_pickle_as_a_list():
    """Values the packing does not know (a bool, a huge int, a string put
    in by hand) pickle as the plain list would, unchanged."""
    from episode.replay.prioritized import _FreeLeaves, _MinValues, _SumValues

    for values in ([0.0, True, 0.0, 1.5], [0.0, 2**60, 0.0, 0.0], [0.0, "x", 0.0, 0.0],
                   [0.0, -0.0, 0.0, 0.0], [0.0] * 3):
        packed = _SumValues(values)
        back = pickle.loads(pickle.dumps(packed))
        assert type(back) is _SumValues and [(type(x), repr(x)) for x in back] == \
            [(type(x), repr(x)) for x in values]
    back = pickle.loads(pickle.dumps(_MinValues([float("inf")] * 8)))
    assert back == [float("inf")] * 8
    for leaves in ([5, 6, 7, 1, 2], [], [3, 3, 3], [True, 2], [2**70, 1]):
        back = pickle.loads(pickle.dumps(_FreeLeaves(leaves)))
        assert list(back) == leaves and [type(x) for x in back] == [type(x) for x in leaves]
