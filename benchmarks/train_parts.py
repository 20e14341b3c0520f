"""Timing an algorithm's train() part by part: a wrapper around each part's
call (no profiler: it would distort the Python-heavy parts) and a garbage-
collector callback that notes where full collections land. Used by
dqn_parts.py and offline_parts.py."""
from __future__ import annotations

import gc
import time


class Parts:
    """Seconds and calls of each wrapped call, and the full collections
    (with the part each landed in), since the last reset(). A part that
    runs inside another counts in both (times are inclusive); a part that
    calls itself (RLlib's OfflineData.sample does, when a pass ends)
    counts once."""

    def __init__(self):
        self.current = None             # the part running now
        self._running: set = set()      # the parts running now
        self._undo: list = []           # (object, name, what was there)
        self._started = 0.0
        self.reset()
        gc.callbacks.append(self._collection)

    def reset(self) -> None:
        self.seconds: dict = {}
        self.calls: dict = {}
        self.full_collections: dict = {}       # part -> full collections during it
        self.full_collection_seconds = 0.0

    def close(self) -> None:
        """Stops counting collections and puts back what was wrapped."""
        gc.callbacks.remove(self._collection)
        for obj, name, before in reversed(self._undo):
            if before is None:
                delattr(obj, name)
            else:
                setattr(obj, name, before)
        self._undo.clear()

    def wrap(self, obj, name: str, part: str, generator: bool = False) -> None:
        """Times `obj.name` as `part`: each call, or (`generator`) each step
        of the generator it returns. On a class, every instance's calls."""
        call = getattr(obj, name)
        self._undo.append((obj, name, vars(obj).get(name) if hasattr(obj, "__dict__") else None))
        if generator:
            def timed(*args, **kwargs):
                steps = call(*args, **kwargs)
                while True:
                    try:
                        item = self._timed(part, next, steps)
                    except StopIteration:
                        return
                    yield item
        else:
            def timed(*args, **kwargs):
                return self._timed(part, call, *args, **kwargs)
        setattr(obj, name, timed)

    def _timed(self, part: str, call, *args, **kwargs):
        if part in self._running:
            return call(*args, **kwargs)
        start = time.perf_counter()
        outer, self.current = self.current, part
        self._running.add(part)
        try:
            return call(*args, **kwargs)
        finally:
            self._running.discard(part)
            self.current = outer
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - start
            self.calls[part] = self.calls.get(part, 0) + 1

    def _collection(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.full_collection_seconds += time.perf_counter() - self._started
        where = self.current or "other"
        self.full_collections[where] = self.full_collections.get(where, 0) + 1

    def report(self) -> dict:
        return {"parts": dict(self.seconds), "calls": dict(self.calls),
                "full_collections": dict(self.full_collections),
                "full_collection_seconds": self.full_collection_seconds}
