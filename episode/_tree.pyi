from typing import final

@final
class Node:
    """One level of a tree of Columns: a leaf, a dict or a tuple."""
    @property
    def kind(self) -> int: ...
