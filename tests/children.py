"""Child processes for the tests that must see a crash without dying of it
(garbage input, damaged files): the environment and the limits they run
with, the same under the plain and the sanitizer builds."""
from __future__ import annotations

import os
import resource

# Under AddressSanitizer (.ci/sanitize preloads its runtime) the children
# keep Python's allocations on malloc, where ASan watches them, and get no
# address-space limit: ASan reserves terabytes of shadow memory up front.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
MEMORY = 3 << 30  # address space: runaway allocations fail fast


def child_env(**extra: str) -> dict:
    """The environment of a crash-test child: faults print a traceback,
    Python's debug allocator catches heap overflows (outside ASan), one
    BLAS thread, a fixed hash seed."""
    env = dict(os.environ, PYTHONFAULTHANDLER="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", PYTHONHASHSEED="0", **extra)
    if not UNDER_ASAN:
        env["PYTHONMALLOC"] = "debug"
    return env


def limit_child() -> None:
    """preexec_fn of a crash-test child: no core files, and outside ASan an
    address-space limit so that a corrupt length fails fast."""
    if not UNDER_ASAN:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
