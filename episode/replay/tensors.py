"""sample_batch(device=...): a drawn batch's arrays as torch tensors.

torch is imported only when a device is asked for, so importing the replay
package (or `episode`) never imports it. On the CPU a tensor shares its
array's memory (torch.from_numpy: no copy); on another device it is that
tensor copied there. Everything is checked before the draw: a call that
cannot hand out tensors draws nothing and changes no counter."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from episode._replay import Store
from episode.replay.draws import _leaves_of


def _torch_device(device) -> Tuple[Any, Any]:
    """(torch, torch.device) for a `device` argument: a torch.device, a
    string torch takes ("cpu", "cuda:0") or a device index. ImportError
    (naming torch) without torch; TypeError or ValueError for what names
    no usable device."""
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"sample_batch(device={device!r}) returns torch tensors and needs "
                          f"torch ({error}): pip install torch", name="torch") from error
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be a torch.device, a device string such as 'cpu' or "
                        f"'cuda:0', or None for numpy arrays, not {type(device).__name__}")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device {device!r} names no torch device: {error}") from None
    if device.type != "cpu":
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError) as error:
            raise ValueError(f"device {str(device)!r} is not available here: {error}") \
                from None
    return torch, device


def _check_numeric(store: Store, extras: bool) -> None:
    """TypeError, before a draw, where a track the batch would hold keeps
    Python objects (strings, ragged rows): those have no tensor."""
    layout = store.layout
    tracks = [("obs", layout["obs"]), ("actions", layout["actions"]),
              ("rewards", layout["rewards"])]
    if extras:
        tracks += [(key, structure) for key, structure in layout["extras"].items()]
    for name, structure in tracks:
        for leaf in _leaves_of(structure):
            if store.leaf_dtype(leaf) is None:
                raise TypeError(f"sample_batch(device=...): the stored {name!r} hold Python "
                                f"objects, which make no tensor; sample without device= "
                                f"for numpy arrays")


def _to_torch(value, torch, device):
    """A batch (dicts and tuples of arrays, as sample_batch() nests them)
    with each array a tensor of the same dtype and shape on `device`."""
    if isinstance(value, np.ndarray):
        if not value.flags.writeable or any(s < 0 for s in value.strides):
            # (torch.from_numpy warns on read-only memory, refuses negative strides.)
            value = np.array(value)
        tensor = torch.from_numpy(value)
        return tensor if device.type == "cpu" else tensor.to(device)
    if isinstance(value, dict):
        return {key: _to_torch(item, torch, device) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_to_torch(item, torch, device) for item in value)
    raise TypeError(f"a sample_batch() entry of type {type(value).__name__} makes no tensor")
