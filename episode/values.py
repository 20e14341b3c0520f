"""Values as msgpack bytes that hold data and nothing else.

What a file of ours keeps besides its raw rows (a dataset's infos, ids,
custom data and object-path items; a kept replay buffer's metadata) goes
through `pack`/`unpack`: msgpack for the plain types, msgpack extension
types for numpy arrays, scalars and dtypes, tuples, sets, ints past 64
bits and gymnasium spaces (as `episode.spaces.space_to_dict` describes
them). Reading builds only those types: no class is looked up by a name
from the file and no code of the file's runs (this is why these files are
not pickles). Anything else is refused when written (TypeError).

Arrays may be kept apart (`pack(..., apart=list)`): an array of at least
`APART_BYTES` is then appended to the list and stored as its index, and
`unpack(..., apart=buffers)` views it in the buffer of that index (a
memory-mapped file's bytes, read in place).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

__all__ = ["APART_BYTES", "pack", "unpack"]

# msgpack extension codes (the dataset format's first six are kept as they were).
_ARRAY, _SCALAR, _TUPLE, _INT, _SET, _OBJECTS, _DTYPE, _SPACE, _APART = range(1, 10)
APART_BYTES = 1 << 10


def _msgpack():
    try:
        import msgpack
    except ModuleNotFoundError as error:      # (a dependency: an incomplete install)
        raise ModuleNotFoundError("episode needs msgpack: pip install msgpack") from error
    return msgpack


def _descr(dtype: np.dtype) -> Any:
    # numpy's .npy header form: a string, or a structured dtype's fields.
    return np.lib.format.dtype_to_descr(dtype)


def _default_for(apart: Optional[list]) -> Callable[[Any], Any]:
    def default(obj: Any) -> Any:
        ext = _msgpack().ExtType
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                if obj.dtype != object:
                    raise TypeError(f"cannot store an array of {obj.dtype}: it holds objects")
                return ext(_OBJECTS, pack([list(obj.shape), obj.ravel().tolist()]))
            data = np.ascontiguousarray(obj)
            if apart is not None and data.nbytes >= APART_BYTES:
                apart.append(data)
                return ext(_APART, pack([_descr(data.dtype), list(data.shape),
                                          len(apart) - 1]))
            return ext(_ARRAY, pack([_descr(data.dtype), list(data.shape), data.tobytes()]))
        if isinstance(obj, np.generic):
            if obj.dtype.hasobject:
                raise TypeError(f"cannot store a numpy object scalar {obj!r:.80}")
            return ext(_SCALAR, pack([_descr(obj.dtype), obj.tobytes()]))
        if isinstance(obj, np.dtype):
            if obj.hasobject:
                raise TypeError(f"cannot store the dtype {obj}: it holds objects")
            return ext(_DTYPE, pack(_descr(obj)))
        if type(obj) is tuple:
            return ext(_TUPLE, pack(list(obj), apart))
        if type(obj) is int:     # past 64 bits
            return ext(_INT, str(obj).encode())
        if type(obj) in (set, frozenset):
            return ext(_SET, pack([type(obj) is frozenset, list(obj)], apart))
        # Subclasses of the plain types (OrderedDict, IntEnum, ...) come back as them.
        for plain in (dict, list, bool, int, float, str, bytes):
            if isinstance(obj, plain):
                return plain(obj)
        if type(obj).__module__.startswith(("gymnasium.", "ray.rllib.")) and \
                hasattr(obj, "sample") and hasattr(obj, "contains"):
            from episode.spaces import space_to_dict

            try:
                described = space_to_dict(obj)
            except ValueError as error:
                raise TypeError(f"cannot store the space {obj!r:.80}: {error}") from None
            return ext(_SPACE, pack(described))
        raise TypeError(f"stored values are numbers, strings, bytes, None, lists, tuples, "
                        f"dicts, sets, numpy arrays and gymnasium spaces, not "
                        f"{type(obj).__module__}.{type(obj).__qualname__}")
    return default


def pack(obj: Any, apart: Optional[list] = None) -> bytes:
    """`obj` as msgpack bytes that `unpack` turns back into an equal object
    of the same types. With `apart`, arrays of `APART_BYTES` or more are
    appended to it instead (C-contiguous) and stored by their index.
    TypeError for a value of any other type."""
    return _msgpack().packb(obj, default=_default_for(apart), use_bin_type=True,
                            strict_types=True)


def _hook_for(apart: Optional[Sequence[Any]]) -> Callable[[int, bytes], Any]:
    def fields(data: bytes, n: int) -> list:
        out = _unpackb(data, hook)
        if not isinstance(out, list) or len(out) != n:
            raise ValueError("a malformed stored value")
        return out

    def hook(code: int, data: bytes) -> Any:
        if code == _ARRAY:
            dtype, shape, raw = fields(data, 3)
            dtype, shape = _plain_dtype(dtype), _shape(shape)
            if not isinstance(raw, bytes) or len(raw) != dtype.itemsize * _count(shape):
                raise ValueError("a stored array's bytes do not match its shape")
            return np.frombuffer(raw, dtype).reshape(shape).copy()
        if code == _APART:
            dtype, shape, index = fields(data, 3)
            dtype, shape = _plain_dtype(dtype), _shape(shape)
            if apart is None or type(index) is not int or not 0 <= index < len(apart):
                raise ValueError(f"a stored array kept apart as {index!r}, which is not there")
            raw = apart[index]
            if len(raw) != dtype.itemsize * _count(shape):
                raise ValueError("an array kept apart does not match its shape")
            return np.frombuffer(raw, dtype).reshape(shape)
        if code == _SCALAR:
            dtype, raw = fields(data, 2)
            dtype = _plain_dtype(dtype)
            if not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
                raise ValueError("a stored scalar's bytes do not match its dtype")
            return np.frombuffer(raw, dtype)[0]
        if code == _DTYPE:
            return _plain_dtype(_unpackb(data, hook))
        if code == _OBJECTS:
            shape, items = fields(data, 2)
            shape = _shape(shape)
            if not isinstance(items, list) or len(items) != _count(shape):
                raise ValueError("a stored object array's items do not match its shape")
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out.reshape(shape)
        if code == _TUPLE:
            items = _unpackb(data, hook)
            if not isinstance(items, list):
                raise ValueError("a stored tuple is not a sequence")
            return tuple(items)
        if code == _INT:
            return int(data.decode("ascii"))
        if code == _SET:
            frozen, items = fields(data, 2)
            if type(frozen) is not bool or not isinstance(items, list):
                raise ValueError("a malformed stored set")
            return frozenset(items) if frozen else set(items)
        if code == _SPACE:
            from episode.spaces import space_from_dict

            described = _unpackb(data, hook)
            try:
                return space_from_dict(described)
            except Exception as error:     # noqa: BLE001 - any malformed description
                raise ValueError(f"a stored space that is not one: {error!r:.200}") from None
        raise ValueError(f"unknown stored value type {code}")
    return hook


def _shape(shape: Any) -> tuple:
    if not isinstance(shape, list) or len(shape) > 64 \
            or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape):
        raise ValueError(f"a stored array of shape {shape!r:.80}")
    return tuple(shape)


def _count(shape: tuple) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _from_descr(descr: Any) -> Any:
    # dtype_to_descr's form after msgpack, which turned its tuples into lists
    # (a field is [name, type] or [name, type, shape]).
    if isinstance(descr, str):
        return descr
    if not isinstance(descr, list):
        raise ValueError(f"not a dtype: {descr!r:.80}")
    fields = []
    for field in descr:
        if not isinstance(field, (list, tuple)) or len(field) not in (2, 3):
            raise ValueError(f"not a dtype field: {field!r:.80}")
        name = tuple(field[0]) if isinstance(field[0], list) else field[0]
        entry = (name, _from_descr(field[1]))
        if len(field) == 3:
            entry += (tuple(field[2]),)
        fields.append(entry)
    return fields


def _plain_dtype(descr: Any) -> np.dtype:
    try:
        dtype = np.lib.format.descr_to_dtype(_from_descr(descr))
    except Exception as error:     # noqa: BLE001 - numpy's parsers raise many kinds
        raise ValueError(f"no dtype {descr!r:.80}: {error}") from None
    if dtype.hasobject:
        raise ValueError(f"a stored array of {dtype} would hold objects")
    return dtype


def _unpackb(blob: Any, hook: Callable[[int, bytes], Any]) -> Any:
    return _msgpack().unpackb(blob, ext_hook=hook, raw=False, strict_map_key=False,
                              use_list=True)


def unpack(blob: Any, apart: Optional[Sequence[Any]] = None) -> Any:
    """The object `pack` stored (ValueError for bytes that are not one).
    `apart`: the buffers of the arrays kept apart, by index (each array is a
    read-only view of its buffer where the buffer is read-only)."""
    try:
        return _unpackb(blob, _hook_for(apart))
    except MemoryError:
        raise
    except Exception as error:     # noqa: BLE001 - damaged bytes fail in many ways
        raise ValueError(f"not a stored value: {type(error).__name__}: {error}") from None


def unpack_each(blobs: Sequence[Optional[bytes]]) -> list:
    """unpack() of each blob (None stays None), by one msgpack Unpacker over
    their bytes (a column of them: unpackb per blob costs a microsecond
    more). ValueError if any blob is not exactly one stored value."""
    data = b"".join([blob for blob in blobs if blob is not None])
    unpacker = _msgpack().Unpacker(ext_hook=_hook_for(None), raw=False, strict_map_key=False,
                                   use_list=True, max_buffer_size=max(1, len(data)))
    unpacker.feed(data)
    out, end = [], 0
    try:
        for blob in blobs:
            if blob is None:
                out.append(None)
                continue
            out.append(unpacker.unpack())
            end += len(blob)
            if unpacker.tell() != end:
                raise ValueError("a blob that is not one stored value")
    except MemoryError:
        raise
    except Exception as error:     # noqa: BLE001 - damaged bytes fail in many ways
        raise ValueError(f"not a stored value: {type(error).__name__}: {error}") from None
    return out


def kept_apart(arrays: List[np.ndarray], align: int = 64) -> tuple:
    """(pieces, layout): the bytes of `arrays` one after the other, each at
    a multiple of `align`, as pieces to write, and each one's (offset,
    bytes) for reading them back."""
    pieces: list = []
    layout = []
    offset = 0
    for array in arrays:
        raw = memoryview(array).cast("B")
        pad = -offset % align
        pieces += [bytes(pad), raw]
        layout.append((offset + pad, raw.nbytes))
        offset += pad + raw.nbytes
    return pieces, layout
