from typing import Any

def read_file(
    data: Any,
) -> tuple[int, dict[str, Any], dict[bytes, bytes] | None,
           dict[tuple[str, ...], dict[bytes, bytes]]] | None: ...
def read_episode_file(root: int, index: int) -> tuple[str, bytes] | None: ...
