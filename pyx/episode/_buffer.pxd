from episode._column cimport Column
from episode._index cimport SliceSpec

cdef class BufferCore:
    # Storage: set through set_storage, which checks what the C paths trust.
    cdef readonly Column _col      # the data when it is one track (always before finalize)
    cdef readonly object _tree     # finalized Dict/Tuple data: a dict/tuple tree of Columns
    cdef Py_ssize_t _lookback      # 0..LOOKBACK_LIMIT, through the checked `lookback` property
    cdef public object _space          # the gymnasium space, or None
    cdef public object _space_struct   # its dict/tuple struct of leaf spaces

    # The compiled fill path's plan, kept from the last call (see _make_fill_plan).
    cdef Column _plan_col
    cdef object _plan_data_dtype
    cdef object _plan_space, _plan_fill
    cdef object _plan_dtype, _plan_value, _plan_fill_dtype, _plan_fill_value

    cpdef Py_ssize_t len_incl_lookback(self)
    cdef int set_storage(self, Column col, object tree) except -1

    # Inline: add_env_step's pushes reach the Column's inline push with no call.
    cdef inline int push(self, object item) except -1:
        if self._col is not None:
            return self._col.push(item)
        self._append_struct(item)     # finalized Dict/Tuple data (the facade)
        return 0

    cdef inline int push_empty_dict(self) except -1:
        # A new empty dict, only counted while all items are empty dicts.
        if self._col is not None and self._col.counts_empty_dicts():
            self._col.size += 1
            return 0
        return self.push({})

    cpdef check_append(self, object item)
    cdef object cget(self, object indices, bint neg_index_as_lookback, object fill,
                     bint one_hot_discrete, bint ignore_last_ts, object add_last_ts_value)
    cpdef BufferCore sub_buffer(self, object slice_, bint neg_index_as_lookback,
                                Py_ssize_t lookback, object space)
    cdef object _get_int(self, object index, bint neg_index_as_lookback)
    cdef object _get_slice(self, object slice_, bint neg_index_as_lookback)
    cdef object _slice_rows(self, SliceSpec* spec)
    cdef object _get_slice_filled(self, object slice_, bint neg_index_as_lookback,
                                  object fill)
    cdef bint _fill_plan_matches(self, Column col, object fill)
    cdef bint _make_fill_plan(self, Column col, object fill) except -1


cdef BufferCore empty_buffer(type cls, object space, object space_struct)
