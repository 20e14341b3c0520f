"""The replay store's runs (episode._runs): the k-th live step found through
the Fenwick tree is the k-th of the runs' live steps in insertion order,
as the ring grows, wraps and drops its evicted front."""
import numpy as np
import pytest

from episode._runs import Runs


def _live_steps(runs):
    # (run, offset) of every live step, oldest first: what find() must give.
    return [(seq, off) for seq, n, ts, alive in runs if alive and ts >= 0 for off in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_the_kth_live_step_in_insertion_order(seed):
    rng = np.random.default_rng(seed)
    store, mine = Runs(), []
    for _ in range(300):
        if mine and rng.random() < 0.3:
            alive = [i for i, r in enumerate(mine) if r[3]]
            if alive:
                i = alive[0] if rng.random() < 0.7 else int(rng.choice(alive))
                store.kill(mine[i][0])
                mine[i] = mine[i][:3] + (False,)
        n, ts = int(rng.integers(0, 9)), int(rng.integers(-2, 20))
        mine.append((store.add_run(0, 0, n, 1, ts), n, ts, True))
        want = _live_steps(mine)
        assert store.live_steps == len(want)
        for k in rng.integers(0, len(want), 5) if want else ():
            assert store.find(int(k)) == (want[k], want[k])
    # The ring held the runs from the first live one on.
    first = next(seq for seq, _, _, alive in mine if alive)
    assert store.head == first and store.tail == len(mine)
    assert store.cap >= store.tail - store.head and store.cap & (store.cap - 1) == 0


def test_steps_outside_the_live_ones_are_refused():
    store = Runs()
    seq = store.add_run(0, 0, 3, 0, 0)
    store.add_run(0, 3, 2, 0, -2)          # lookback rows: not live
    for k in (-1, 3, 1 << 40):
        with pytest.raises(IndexError):
            store.find(k)
    with pytest.raises(ValueError):
        store.add_run(0, 0, -1, 0, 0)
    store.kill(seq)
    with pytest.raises(IndexError):
        store.kill(seq)
    assert store.live_steps == 0 and store.head == 1
