"""What the Minari tests share: datasets written through Minari's own API
(imported only when one is written, so that the tests of our readers alone
need no minari)."""
import warnings

import numpy as np


def quiet_create(*args, **kwargs):
    """minari.create_dataset_from_buffers(), without its warning for every
    metadata field left out."""
    import minari

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return minari.create_dataset_from_buffers(*args, **kwargs)


def done_flags(n: int, end: bool) -> np.ndarray:
    """An episode's n terminations (or truncations): the last one `end`."""
    out = np.zeros(n, bool)
    if n and end:
        out[-1] = True
    return out
