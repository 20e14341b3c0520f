from typing import Any

import numpy as np

def read_file(
    data: Any,
) -> tuple[int, dict[str, Any], dict[bytes, bytes] | None,
           dict[tuple[str, ...], dict[bytes, bytes]]] | None: ...
