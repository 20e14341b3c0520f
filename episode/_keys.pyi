from typing import final

@final
class KeyTable:
    """Key -> slot of a replay store's episodes."""
