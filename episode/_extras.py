"""The optional dependencies (ray[rllib], torch): what to raise when an
import of them fails, naming the extra that installs them."""
from __future__ import annotations

RLLIB_EXTRA = 'pip install "episode[rllib]"'


def rllib_missing(error: ModuleNotFoundError, what: str) -> ImportError:
    """The ImportError to raise (from `error`) when `what`, a feature that
    needs ray[rllib] or torch, cannot import them: it names the `rllib`
    extra."""
    return ImportError(f"{what} needs ray[rllib] 2.60 and torch ({error}): {RLLIB_EXTRA}",
                       name=error.name)
