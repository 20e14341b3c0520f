from typing import Any, final

from episode._draws import Draws
from episode._replay import Store

@final
class Picks:
    """The steps a draw picked."""
    weights: list[Any]
    leaves: list[int]
    resamples: int
    rejected: list[int]
    def __len__(self) -> int: ...

def draw_uniform(store: Store, draws: Draws, batch_size_B: int, batch_length_T: int,
                 n_step: Any, min_batch_length_T: int) -> Picks: ...
def draw_transitions(store: Store, draws: Draws, batch_size_B: int, n_step: Any) -> Picks: ...
def draw_prioritized(store: Store, draws: Draws, batch_size_B: int, n_step: Any, beta: Any,
                     num_timesteps: int | None = None) -> Picks: ...
def uniform_step(store: Store, draws: Draws) -> tuple[int, int]: ...
def draw_native(store: Store, draws: Draws, batch_size: int, n_step: Any, prioritized: bool,
                beta: float, batch_length_T: int, min_batch_length_T: int) -> Picks: ...
