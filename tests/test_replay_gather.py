"""The gathers (episode._gather) on their own: a drawn step's rows, its end
step's rows and its discounted return are the stored episode's."""
import numpy as np
import pytest

from episode import SingleAgentEpisode, _gather, _picks
from episode._draws import Draws
from episode._replay import Store


# n-steps of more than 64 sum their rewards through another buffer; the
# 150-step episode is added in chunks, so that they cross runs.
@pytest.mark.parametrize("n_step, steps", [(1, 10), (3, 10), ((1, 5), 10), (100, 150)])
def test_gathered_rows_and_returns_are_the_episodes(n_step, steps):
    obs = np.arange((steps + 1) * 3, dtype=np.float32).reshape(steps + 1, 3)
    rewards = [float(r) for r in range(1, steps + 1)]
    store = Store(1024)
    episode = SingleAgentEpisode(observations=list(obs), actions=list(range(steps)),
                                 rewards=rewards, terminated=True, len_lookback_buffer=0)
    chunk = 64
    for start in range(0, steps, chunk):
        store.add(episode[start:start + chunk])
    picks = _picks.draw_transitions(store, Draws(np.random.default_rng(0)), 32, n_step)
    slots, ts, ns, ends = _gather.pick_fields(store, picks)
    assert (slots == 0).all() and (ends == np.minimum(ts + ns, steps)).all()
    _gather.locate_ends(store, picks)
    first, last = _gather.gather_both(store, picks, store.layout["obs"])
    np.testing.assert_array_equal(first, obs[ts])
    np.testing.assert_array_equal(last, obs[ends])
    pairs = _gather.gather_pairs(store, picks, store.layout["obs"])
    np.testing.assert_array_equal(pairs[0::2], first)
    np.testing.assert_array_equal(pairs[1::2], last)
    np.testing.assert_array_equal(_gather.gather(store, picks, store.layout["actions"]), ts)
    want = [sum(0.9 ** j * rewards[t + j] for j in range(e - t)) for t, e in zip(ts, ends)]
    np.testing.assert_allclose(_gather.returns(store, picks, 0.9), want)
    assert _gather.gather_infos(store, picks) == [{}] * len(ts)


def test_a_leaf_that_is_not_there_is_refused():
    store = Store(64)
    store.add(SingleAgentEpisode(observations=[0.0, 1.0], actions=[0], rewards=[1.0],
                                 len_lookback_buffer=0))
    picks = _picks.draw_transitions(store, Draws(np.random.default_rng(0)), 2, 1)
    for leaf in (-1, store.nleaves):
        with pytest.raises(IndexError):
            _gather.gather(store, picks, leaf)
        with pytest.raises(IndexError):
            _gather.gather_both(store, picks, leaf)
        with pytest.raises(IndexError):
            _gather.gather_pairs(store, picks, leaf)
    with pytest.raises(ValueError):    # (only observations have a row after the end)
        _gather.gather(store, picks, store.layout["actions"], True)
