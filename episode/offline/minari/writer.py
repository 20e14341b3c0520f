"""`to_minari`: episodes written as a Minari dataset, aside and then
renamed into place, with the metadata Minari keeps."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile
from typing import Any, Dict, Iterable, Tuple, Union

import gymnasium as gym

from episode._episode import EpisodeCore
from episode.offline.minari.arrow import _write_arrow
from episode.offline.minari.hdf5 import _write_hdf5
from episode.offline.minari.layout import (_FORMATS, _LAYOUT_VERSION, _METADATA,
                                           _NAMESPACE_METADATA, _NEWEST_LAYOUT, _VERSIONED_ID,
                                           _datasets_root)
from episode.offline.minari.spaces import _leaves, _space_to_json
from episode.offline.minari.tracks import _as_ours, _episode_tracks, _same_dtypes

__all__ = ["to_minari"]


# Metadata keys that describe the data itself: to_minari writes them.
_RESERVED = frozenset({"dataset_id", "total_episodes", "total_steps", "data_format",
                       "minari_version", "dataset_size"})


def _check_spaces(episodes: list, metadata: dict) -> Tuple[gym.Space, gym.Space]:
    """The dataset's spaces: given as keywords, else the episodes' (one
    each), else the env_spec's env's."""
    spaces = []
    for key in ("observation_space", "action_space"):
        space = metadata.pop(key, None)
        if space is None:
            found = [getattr(ep, key) for ep in episodes if getattr(ep, key) is not None]
            if any(s != found[0] for s in found):
                raise ValueError(f"the episodes have different {key}s: give {key}=")
            space = found[0] if found else None
        if space is None and metadata.get("env_spec") is not None:
            with gym.make(_env_spec(metadata["env_spec"])) as env:
                space = getattr(env, key)
        if space is None:
            raise ValueError(f"Minari datasets name their {key}: give {key}= (the episodes "
                             f"have none)")
        if not isinstance(space, gym.Space):
            raise TypeError(f"{key} is a gymnasium space, not {type(space).__name__}")
        spaces.append(space)
    return spaces[0], spaces[1]


def _env_spec(value: Any) -> gym.envs.registration.EnvSpec:
    if isinstance(value, gym.envs.registration.EnvSpec):
        return value
    if isinstance(value, gym.Env):
        if value.spec is None:
            raise ValueError("an env without a spec names no env")
        return value.spec
    if isinstance(value, str):
        if value.lstrip().startswith("{"):
            return gym.envs.registration.EnvSpec.from_json(value)
        return gym.spec(value)
    raise TypeError(f"an env spec is an EnvSpec, an env or an env id, not "
                    f"{type(value).__name__}")


def _dataset_metadata(dataset_id: str, fmt: str, obs_space: gym.Space, act_space: gym.Space,
                      tracks: list, metadata: dict) -> dict:
    """metadata.json's content, in the order Minari writes it."""
    out: Dict[str, Any] = {
        "total_episodes": len(tracks),
        "total_steps": int(sum(t["n"] for t in tracks)),
        "data_format": fmt,
        "observation_space": json.dumps(_space_to_json(obs_space)),
        "action_space": json.dumps(_space_to_json(act_space)),
    }
    extra = dict(metadata)
    for key in ("env_spec", "eval_env_spec"):
        if extra.get(key) is not None:
            out[key] = _env_spec(extra.pop(key)).to_json()
        else:
            extra.pop(key, None)
    out["dataset_id"] = dataset_id
    for key in ("author", "author_email"):
        value = extra.get(key)
        if value is None:
            extra.pop(key, None)
        elif isinstance(value, str):
            extra[key] = [value]
        elif isinstance(value, (set, frozenset, list, tuple)) and all(
                isinstance(v, str) for v in value):
            extra[key] = sorted(value) if isinstance(value, (set, frozenset)) else list(value)
        else:
            raise TypeError(f"{key} is a string or a set of strings, not {value!r:.100}")
    for key in ("algorithm_name", "code_permalink", "description"):
        if key in extra and extra[key] is not None and not isinstance(extra[key], str):
            raise TypeError(f"{key} is a string, not {type(extra[key]).__name__}")
    for key, value in extra.items():
        if value is None:
            continue
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata {key!r} is not JSON-serializable ({exc})") from None
        out[key] = value
    out["minari_version"] = _written_version()
    return out


def _written_version() -> str:
    """The minari_version written: the installed Minari's when its layout is
    the one written here (it then opens the dataset), else the newest such."""
    try:
        import importlib.metadata
        version = importlib.metadata.version("minari")
    except Exception:
        return _NEWEST_LAYOUT
    return version if _LAYOUT_VERSION.match(version) else _NEWEST_LAYOUT


def _folder_size_mb(path: pathlib.Path) -> float:
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return round(size / 1e6, 1)


def to_minari(episodes: Iterable[Any], dataset_id: str, *, data_format: str = "hdf5",
              root: Union[str, os.PathLike, None] = None, **metadata: Any) -> pathlib.Path:
    """Writes `episodes` as the Minari dataset `dataset_id` and returns its
    folder (``<root>/<dataset_id>``, which ``minari.load_dataset(dataset_id)``
    opens when `root` is Minari's datasets folder).

    Args:
        episodes: single-agent episodes (ours or RLlib's, list-mode or
            numpy'd), each whole from its reset (``t_started == 0``, no
            lookback rows) to its end (terminated or truncated).
        dataset_id: Minari's ``(namespace/)name-v<N>``; the dataset must not
            exist yet.
        data_format: "hdf5" (Minari's default), "arrow" or "parquet".
        root: the datasets folder (default: $MINARI_DATASETS_PATH, else
            ~/.minari/datasets, as Minari finds it).
        **metadata: what Minari's ``create_dataset_from_buffers`` takes and
            keeps: ``author``, ``author_email``, ``algorithm_name``,
            ``code_permalink``, ``description``, ``requirements``,
            ``env_spec``/``eval_env_spec`` (an EnvSpec, env or env id),
            ``ref_min_score``, ``ref_max_score``, ... (any JSON-serializable
            value); and ``observation_space``/``action_space`` when the
            episodes have none.

    Each episode's observations (N+1 rows), actions, rewards, infos (every
    step's info of one structure: numbers, numpy arrays, strings or dicts of
    them) and its end (terminations/truncations, set at the last step only)
    are stored as Minari stores them; its ``id_`` and extra model outputs
    too, where Minari reads past them. Pictures (image spaces) are stored as
    PNG, which Minari opens, so they read back exactly.

    The dataset is written in a hidden folder beside its place and renamed
    into it at the end: a write that fails leaves nothing behind.

    Raises:
        ValueError: a multi-agent episode, one that does not start at its
            reset or has lookback rows, one still running (not done), data that does not match the spaces,
            infos whose structure changes between steps, a malformed id or
            an existing dataset.
        TypeError: something other than episodes or a metadata value of the
            wrong type.
    """
    if not isinstance(dataset_id, str) or not _VERSIONED_ID.match(dataset_id):
        raise ValueError(f"a Minari dataset id is (namespace/)name-v<version>, not "
                         f"{dataset_id!r:.100}")
    if data_format not in _FORMATS:
        raise ValueError(f"data_format is one of {_FORMATS}, not {data_format!r:.50}")
    reserved = _RESERVED.intersection(metadata)
    if reserved:
        raise ValueError(f"to_minari writes {sorted(reserved)} itself")
    if isinstance(episodes, (EpisodeCore, str, bytes)) or not isinstance(episodes, Iterable):
        raise TypeError(f"episodes are an iterable of episodes, not "
                        f"{type(episodes).__name__}")
    episodes = [_as_ours(ep, k) for k, ep in enumerate(episodes)]
    obs_space, act_space = _check_spaces(episodes, metadata)
    obs_leaves, action_leaves = _leaves(obs_space), _leaves(act_space)
    by_path = ({leaf.path: leaf for leaf in obs_leaves},
               {leaf.path: leaf for leaf in action_leaves})
    tracks = [_episode_tracks(ep, k, obs_space, act_space, *by_path)
              for k, ep in enumerate(episodes)]
    _same_dtypes(tracks, obs_leaves, action_leaves)
    content = _dataset_metadata(dataset_id, data_format, obs_space, act_space, tracks, metadata)
    for k, ep in enumerate(episodes):
        if not (ep.is_terminated or ep.is_truncated):
            raise ValueError(f"episode {k} is still running (neither terminated nor "
                             f"truncated): to_minari writes complete episodes; finish it, or "
                             f"mark it cut off with episode.is_truncated = True")

    base = _datasets_root(root)
    target = base / dataset_id
    if os.path.lexists(target):
        raise ValueError(f"a Minari dataset {dataset_id!r} already exists at {target}")
    base.mkdir(parents=True, exist_ok=True)
    aside = pathlib.Path(tempfile.mkdtemp(prefix=".episode-minari-", dir=base))
    try:
        data = aside / "data"
        data.mkdir()
        if data_format == "hdf5":
            _write_hdf5(data, tracks, obs_leaves, action_leaves)
        else:
            _write_arrow(data, tracks, obs_space, act_space, data_format)
        content["dataset_size"] = _folder_size_mb(data)
        with open(data / _METADATA, "w") as fh:
            json.dump(content, fh)
        _make_namespaces(base, dataset_id)
        if os.path.lexists(target):
            raise ValueError(f"a Minari dataset {dataset_id!r} appeared at {target} while "
                             f"this one was written")
        os.rename(aside, target)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    return target


def _make_namespaces(base: pathlib.Path, dataset_id: str) -> None:
    """The namespace folders of `dataset_id`, each with the (empty) metadata
    file Minari's namespaces have."""
    parts = dataset_id.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        folder = base.joinpath(*parts[:depth])
        folder.mkdir(exist_ok=True)
        meta = folder / _NAMESPACE_METADATA
        if not meta.exists():
            with open(meta, "w") as fh:
                json.dump({}, fh)
