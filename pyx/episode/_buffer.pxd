from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from episode._column cimport Column, KIND_EMPTY, KIND_EMPTY_DICT, KIND_OBJECT
from episode._index cimport SliceSpec
from episode._tree cimport Node


cdef class FillPlan:
    # How a finalized Column's rows and a scalar `fill` combine (see make()),
    # kept from the last call for the same Column, space and fill.
    cdef Column col
    cdef object data_dtype         # the storage's dtype object (held: its address identifies it)
    cdef object space, fill
    cdef object dtype, value       # the result's dtype and the fill element in it
    cdef object fill_dtype, fill_value   # the same for all-fill results

    cdef bint fits(self, Column col, object space, object fill)
    cdef bint make(self, Column col, object space, object fill) except -1
    cdef object rows(self, Column col, SliceSpec* spec, Py_ssize_t first, Py_ssize_t count,
                     Py_ssize_t step)


cdef class FillState:
    # The compiled fill/one-hot path's view of a buffer: one plan per leaf and
    # the leaf spaces, kept until the storage or the space changes.
    cdef list plans
    cdef object tree, space        # what they were made for
    cdef list spaces               # None: the space does not fit the tree (general path)
    cdef bint same_order           # a Dict space lists its keys in the data's order


cdef class BufferCore:
    # The storage is one tree: a Column for flat items, a dict/tuple of
    # Columns (one per leaf) for Dict/Tuple items. Set only through
    # set_storage, which checks what the C paths trust.
    cdef readonly object _tree
    cdef Node _node                # _tree's walker when it is an exact dict/tuple, else None
    cdef tuple _tree_leaves        # a dict/tuple tree's Columns in dm-tree (sorted-key)
                                   # order, one length; None for one Column
    cdef Py_ssize_t _lookback      # 0..LOOKBACK_LIMIT, through the checked `lookback` property
    cdef readonly object _space        # the gymnasium space, or None (set: _set_space)
    cdef readonly object _space_struct # its dict/tuple struct of leaf spaces

    cdef FillState _fill           # made on the first filled or one-hot get

    cdef inline Column flat(self):
        # _tree when it is one Column (the flat fast paths), else None.
        return <Column>self._tree if self._tree_leaves is None else None

    cdef inline Py_ssize_t nleaves(self) noexcept:
        return 1 if self._tree_leaves is None else PyTuple_GET_SIZE(self._tree_leaves)

    cdef inline Column leaf(self, Py_ssize_t k):
        # 0 <= k < nleaves()
        return <Column>self._tree if self._tree_leaves is None \
            else <Column>PyTuple_GET_ITEM(self._tree_leaves, k)

    cdef inline Column first(self):
        # A leaf: the length and mode of them all (flat() if flat).
        return self.leaf(0)

    cpdef Py_ssize_t len_incl_lookback(self)
    cdef int set_storage(self, object tree) except -1
    cdef int untrack(self) except -1
    cdef void track(self) noexcept
    cdef void release_leaves(self) noexcept

    cdef inline bint is_finalized(self) noexcept:
        return self.first().finalized

    # Inline: add_env_step's pushes reach the Column's inline push with no call.
    cdef inline int push(self, object item) except -1:
        cdef Column col = self.flat()
        if col is not None and (col.kind != KIND_EMPTY or col.finalized):
            return col.push(item)
        return self.push_struct(item)

    cdef inline int push_empty_dict(self) except -1:
        # A new empty dict, only counted while all items are empty dicts.
        cdef Column col = self.flat()
        if col is not None and col.counts_empty_dicts():
            col.size += 1
            return 0
        return self.push({})

    cpdef finalize(self)
    cpdef object prepare_finalize(self)
    cpdef commit_finalize(self, object storage)
    cdef int push_struct(self, object item) except -1
    cdef int to_object_path(self) except -1
    cpdef check_append(self, object item)
    cdef object item_at(self, Py_ssize_t pos)
    cdef object assembled(self, list results)
    cdef object cget(self, object indices, bint neg_index_as_lookback, object fill,
                     bint one_hot_discrete, bint ignore_last_ts, object add_last_ts_value)
    cpdef BufferCore sub_buffer(self, object slice_, bint neg_index_as_lookback,
                                Py_ssize_t lookback, object space)
    cdef object _get_int(self, object index, bint neg_index_as_lookback)
    cdef object _get_slice(self, object slice_, bint neg_index_as_lookback)
    cdef object _slice_rows(self, SliceSpec* spec)
    cdef object _get_slice_filled(self, object slice_, bint neg_index_as_lookback,
                                  object fill)
    cdef object _get_one_hot(self, object indices, bint neg_index_as_lookback, object fill)
    cdef object _one_hot_leaves(self, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step,
                                bint rows, Py_ssize_t left, Py_ssize_t right, double fill_value)
    cdef FillState fill_state(self)


cdef BufferCore empty_buffer(type cls, object space, object space_struct)


# spaces.base_struct(space) (the space itself for Box, Discrete and None).
cdef object space_struct(object space)

# What one pickled state (a multi-agent episode's) is written and read
# with (see _buffer.pyx).
cdef class StateWriter:
    cdef readonly bint raw         # plain rows as PickleBuffers (pickle protocol 5)
    cdef dict spaces               # id(space) -> its state
    cdef dict dtype_texts          # id(dtype) -> its string (see column_state)
    cdef object space_state(self, object space)

cdef class StateReader:
    cdef dict spaces               # id(space state) -> the space
    cdef object space_from_state(self, object state)

# A buffer's pickled state and the buffer of class `cls` (a BufferCore
# subclass) it describes, checked: ValueError/TypeError if corrupt.
cdef tuple buffer_state(BufferCore buffer, StateWriter writer)
cdef BufferCore buffer_from_state(type cls, object state, StateReader reader)
