from typing import Any

import numpy as np

def gather_next_rows(episodes: list[Any], data_col: str, shifts: Any,
                     zeros_before: bool) -> np.ndarray | None: ...
