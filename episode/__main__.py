"""`python -m episode`: a short demonstration of the lookback buffer."""
from __future__ import annotations

import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from episode import InfiniteLookbackBuffer

    steps = 100_000
    rng = np.random.default_rng(0)
    rows = list(rng.standard_normal((steps, 4)).astype(np.float32))

    buf = InfiniteLookbackBuffer(rows[:1], lookback=1)
    t0 = time.perf_counter()
    for row in rows[1:]:
        buf.append(row)
    t1 = time.perf_counter()
    buf.finalize()
    t2 = time.perf_counter()
    stack = buf.get(slice(-3, 1), neg_index_as_lookback=True, fill=0.0)

    print(f"appended {steps - 1:,} CartPole-sized rows in {(t1 - t0) * 1e3:.1f} ms "
          f"({(t1 - t0) / (steps - 1) * 1e9:.0f} ns per append)")
    print(f"finalize() took {(t2 - t1) * 1e6:.1f} us; data is {buf.data.dtype}{buf.data.shape}")
    print(f"frame stack at t=0 with zero fill:\n{stack}")
    print(buf.__class__.__name__, "len", len(buf), "lookback", buf.lookback)
    return 0


if __name__ == "__main__":
    sys.exit(main())
