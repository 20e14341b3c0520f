"""Our four kinds of replay buffers, by class: what a saved buffer's or a
state's kind names. A leaf module: episode.replay's __init__ lists the
kinds once all are defined; the buffers and their saving look them up."""
from __future__ import annotations

from typing import List

KINDS: List[type] = []


def register(*classes: type) -> None:
    """Lists our kinds of buffers (once, when the package is imported)."""
    KINDS[:] = classes


def kind_of_class(cls: type) -> type:
    """Which of our kinds `cls` is (itself, or a subclass of it); `cls`
    for another class."""
    for base in cls.__mro__:
        if base in KINDS:
            return base
    return cls


def kind_of(buffer: object) -> str:
    """The name of the buffer's kind (one of ours, whatever subclass it is)."""
    return kind_of_class(type(buffer)).__name__


def by_name() -> dict:
    """Our kinds by class name (as a saved buffer names its kind)."""
    return {kind.__name__: kind for kind in KINDS}
