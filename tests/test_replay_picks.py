"""The draws (episode._picks) on their own: over a small store of two
episodes, each picks the steps a list of the stored steps in insertion
order would give for the same seeded Generator calls, as RLlib's buffers
draw them."""
import numpy as np
import pytest

from episode import SingleAgentEpisode, _gather, _picks
from episode._draws import Draws
from episode._replay import Store


def two_episodes():
    store = Store(1024)
    steps = []
    for slot, length in enumerate((7, 4)):
        store.add(SingleAgentEpisode(observations=[np.float32(i) for i in range(length + 1)],
                                     actions=list(range(length)), rewards=[1.0] * length,
                                     terminated=True, len_lookback_buffer=0))
        steps += [(slot, ts, length) for ts in range(length)]
    return store, steps


def test_uniform_step_is_the_kth_stored_step():
    store, steps = two_episodes()
    draws, rng = Draws(np.random.default_rng(3)), np.random.default_rng(3)
    for _ in range(20):
        slot, ts, _ = steps[rng.integers(len(steps))]
        assert _picks.uniform_step(store, draws) == (slot, ts)


@pytest.mark.parametrize("n_step", [1, 3, (1, 4)])
def test_transitions_redraw_steps_too_near_their_end(n_step):
    store, steps = two_episodes()
    picks = _picks.draw_transitions(store, Draws(np.random.default_rng(5)), 16, n_step)
    rng = np.random.default_rng(5)
    want, rejected = [], []
    while len(want) < 16:
        slot, ts, length = steps[rng.integers(len(steps))]
        n = rng.integers(*n_step) if isinstance(n_step, tuple) else n_step
        if ts + n > length:
            rejected.append(slot)
            continue
        want.append((slot, ts, n, ts + n))
    slots, ts, ns, ends = _gather.pick_fields(store, picks)
    assert list(zip(slots.tolist(), ts.tolist(), ns.tolist(), ends.tolist())) == want
    assert picks.rejected == rejected and picks.resamples == len(rejected)
