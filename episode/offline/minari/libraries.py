"""The libraries Minari's files are read and written with (h5py, pyarrow,
pillow), each imported on first use: a missing one raises an ImportError
that names the extra that installs them."""
from __future__ import annotations

_INSTALL = 'pip install "episode[minari]"'


def _import(name: str, why: str):
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as exc:
        raise ImportError(f"{why} needs {name.split('.')[0]}: {_INSTALL}") from exc


def _h5py():
    return _import("h5py", "Minari's HDF5 datasets")


def _pyarrow():
    pa = _import("pyarrow", "Minari's Arrow datasets")
    _import("pyarrow.ipc", "Minari's Arrow datasets")
    return pa


def _parquet():
    _pyarrow()
    return _import("pyarrow.parquet", "Minari's Parquet datasets")


def _pil_image():
    return _import("PIL.Image", "Minari's image observations")
