from typing import final

from typing_extensions import Self

@final
class Pages:
    """Bytes on pages mapped for them, as a writable buffer."""
    def __new__(cls, nbytes: int) -> Self: ...
