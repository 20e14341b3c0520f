"""Property-based differential tests: random call sequences on both buffers.

A hypothesis state machine per kind of content drives one RLlib buffer and
one of ours (difftools.Twin) through random mixes of append / extend / pop /
finalize / get / set / lookback changes / state and pickle round trips, and
compares results, exception classes and buffer states after every step. Two
more machines hold Dict/Tuple items of a structure drawn per run: one without
a space whose items now and then change (a leaf promoted, a key added, ...),
one with a Dict/Tuple space of Discrete/MultiDiscrete/Box/MultiBinary leaves.
States are read through get_state(), so our list-mode buffer keeps its typed
storage until a rule reads `.data`. The deliberate differences
(test_lookback_buffer_differences.py) are avoided.
"""
from __future__ import annotations

import copy
import os
import pickle

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from difftools import (KINDS, Kind, KeptTwin, Other, compare_buffers, finalize_known_bug,
                       known_rllib_crash, rllib_buffer_class,
                       rllib_slice_assertion, rllib_stacks_otherwise, rows_of)

pytestmark = pytest.mark.rllib

from strategies import (ITEMS, LEAVES, OUTSIDE, SPACE_LEAVES, item_of, items_of, space_of,
                        structures)


INDEX = st.integers(-9, 9)
BOUND = st.one_of(st.none(), st.integers(-9, 9))
STEP = st.sampled_from([None, 1, 2, -1, 3, -2])
SLICE = st.builds(slice, BOUND, BOUND, STEP)


def make_batch(items):
    """A batch of `items` as RLlib's finalize() makes it, or None where RLlib
    cannot batch them (items of different structures)."""
    ref = rllib_buffer_class()(copy.deepcopy(list(items)))
    try:
        ref.finalize()
    except (ValueError, TypeError):
        return None
    return ref.data


class BufferMachine(RuleBasedStateMachine):
    kind = None  # set by the per-kind subclasses below

    def __init__(self):
        super().__init__()
        self.twin = None
        self.items = ITEMS.get(self.kind.name)       # item strategy
        self.outside = OUTSIDE.get(self.kind.name)   # items outside the space, or None

    # -- helpers --------------------------------------------------------------

    @property
    def fin(self):
        return self.twin.theirs.finalized

    @property
    def lookback(self):
        return self.twin.theirs.lookback

    def fill_ok(self, fill):
        """False for the deliberate difference: fill on finalized multi-dim or
        struct rows without a space."""
        k = self.kind
        return not (fill is not None and self.fin and k.space is None
                    and (k.row_ndim > 0 or k.struct))

    def wraps(self, idx, neg, fill, one_hot, ignore):
        """RLlib's finalized fast path wraps idx < -lookback around (deliberate)."""
        return (self.fin and not self.kind.struct and neg and fill is None and not one_hot
                and not ignore and self.lookback + idx < 0)

    def finalize_differs(self):
        """finalize() of the list-mode items would meet a deliberate stacking
        difference or a known bug (see difftools)."""
        items = self.twin.theirs.data
        return not self.fin and (rllib_stacks_otherwise(items) or finalize_known_bug(items))

    def get_opts(self, data):
        k = self.kind
        neg = data.draw(st.booleans(), label="neg_index_as_lookback")
        fill = data.draw(st.sampled_from([None, k.fill]), label="fill")
        one_hot = data.draw(st.booleans(), label="one_hot") if k.space is not None else False
        ignore = data.draw(st.booleans(), label="_ignore_last_ts")
        return neg, fill, one_hot, ignore

    # -- rules ------------------------------------------------------------------

    @initialize(data=st.data(), lookback=st.integers(0, 6))
    def init(self, data, lookback):
        items = data.draw(st.lists(self.items, max_size=6), label="initial items")
        self.twin = KeptTwin(items, lookback, self.kind.space)

    @rule(data=st.data())
    def append(self, data):
        item = data.draw(self.items, label="item")
        self.twin.call("append", item)

    @rule(data=st.data())
    def extend(self, data):
        items = data.draw(st.lists(self.items, min_size=1 if self.fin else 0,
                                   max_size=3), label="items")
        if self.fin and (self.kind.struct or data.draw(st.booleans(), label="as batch")):
            batch = make_batch(items)
            if batch is not None:
                self.twin.call("extend", batch)
        else:
            self.twin.call("extend", items)

    @rule(index=st.one_of(st.none(), INDEX))
    def pop(self, index):
        if index is None:
            self.twin.call("pop")
        else:
            self.twin.call("pop", index)

    @precondition(lambda self: self.twin.theirs.len_incl_lookback() > 0)
    @rule()
    def finalize(self):
        if not self.finalize_differs():
            self.twin.call("finalize")

    @rule(lookback=st.integers(0, 8))
    def set_lookback(self, lookback):
        self.twin.ours.lookback = lookback
        self.twin.theirs.lookback = lookback
        self.twin.check_state(f"lookback = {lookback}")

    @rule(data=st.data(), idx=INDEX)
    def get_int(self, data, idx):
        neg, fill, one_hot, ignore = self.get_opts(data)
        if self.wraps(idx, neg, fill, one_hot, ignore) or not self.fill_ok(fill):
            return
        self.twin.call("get", idx, neg_index_as_lookback=neg, fill=fill,
                       one_hot_discrete=one_hot, _ignore_last_ts=ignore, known=known_rllib_crash)

    @rule(data=st.data(), indices=st.lists(INDEX, min_size=1, max_size=4))
    def get_list(self, data, indices):
        neg, fill, one_hot, ignore = self.get_opts(data)
        if any(self.wraps(i, neg, fill, one_hot, ignore) for i in indices) \
                or not self.fill_ok(fill):
            return
        self.twin.call("get", indices, neg_index_as_lookback=neg, fill=fill,
                       one_hot_discrete=one_hot, _ignore_last_ts=ignore, known=known_rllib_crash)

    @rule(data=st.data(), sl=SLICE)
    def get_slice(self, data, sl):
        neg, fill, one_hot, ignore = self.get_opts(data)
        if not self.fill_ok(fill):
            return
        self.twin.call("get", sl, neg_index_as_lookback=neg, fill=fill,
                       one_hot_discrete=one_hot, _ignore_last_ts=ignore, known=known_rllib_crash)

    @rule(data=st.data())
    def get_all(self, data):
        neg, fill, one_hot, ignore = self.get_opts(data)
        if not self.fill_ok(fill):
            return
        self.twin.call("get", None, neg_index_as_lookback=neg, fill=fill,
                       one_hot_discrete=one_hot, _ignore_last_ts=ignore, known=known_rllib_crash)

    @precondition(lambda self: self.kind.row_ndim == 0 and not self.kind.struct
                  and self.kind.name != "string")
    @rule(data=st.data(), idx=INDEX)
    def get_add_last_ts_value(self, data, idx):
        """_add_last_ts_value: only the int-index path with scalar data (the
        slice path is a deliberate difference)."""
        neg, fill, _, ignore = self.get_opts(data)
        extra = data.draw(self.items, label="_add_last_ts_value")
        self.twin.call("get", idx, neg_index_as_lookback=neg, fill=fill, _ignore_last_ts=ignore,
                       _add_last_ts_value=extra)

    @rule(key=st.one_of(INDEX, SLICE, st.lists(INDEX, min_size=1, max_size=3)))
    def getitem(self, key):
        if isinstance(key, int) and self.wraps(key, False, None, False, False):
            return
        self.twin.call("__getitem__", key, known=known_rllib_crash)

    def can_set(self):
        # Deliberate difference: set on finalized Dict/Tuple data with a space.
        return not (self.fin and self.kind.struct and self.kind.space is not None)

    def new_item(self, data, outside=False):
        """An item of the kind; with `outside`, one outside the space (if the
        kind has such items)."""
        if outside and self.outside is not None:
            return data.draw(self.outside, label="item outside the space")
        return data.draw(self.items, label="item")

    @rule(data=st.data(), idx=INDEX, neg=st.booleans(), dunder=st.booleans(),
          outside=st.sampled_from([False] * 3 + [True]))
    def set_int(self, data, idx, neg, dunder, outside):
        if not self.can_set():
            return
        item = self.new_item(data, outside)
        if dunder:
            self.twin.call("__setitem__", idx, item)
        else:
            self.twin.call("set", item, at_indices=idx, neg_index_as_lookback=neg)

    @rule(data=st.data(), indices=st.lists(INDEX, min_size=1, max_size=3), neg=st.booleans(),
          outside=st.sampled_from([False] * 3 + [True]), as_batch=st.booleans(),
          extra=st.sampled_from([0, 0, 0, 1, -1]))
    def set_list(self, data, indices, neg, outside, as_batch, extra):
        """A list of indices with as many items (+ extra), one of them now and
        then outside the space; a batch or a list once finalized."""
        if not self.can_set():
            return
        count = max(len(indices) + extra, 0)
        where = data.draw(st.integers(0, max(count - 1, 0)), label="outside at")
        items = [self.new_item(data, outside and i == where) for i in range(count)]
        new = make_batch(items) if self.fin and as_batch and items else items
        if new is None:
            return
        self.twin.call("set", new, at_indices=indices, neg_index_as_lookback=neg)

    @rule(data=st.data(), sl=st.one_of(st.none(), SLICE), neg=st.booleans(),
          extra=st.sampled_from([0, 0, 0, 1, -1]), outside=st.sampled_from([False] * 3 + [True]),
          as_list=st.sampled_from([False] * 5 + [True]))
    def set_slice(self, data, sl, neg, extra, outside, as_list):
        """Sets a slice (None: everything after the lookback) with as many items
        as RLlib's get() of that slice returns (+ extra, to test mismatches),
        the first now and then outside the space; after finalize() a batch, or
        now and then a plain list."""
        if not self.can_set():
            return
        probe = copy.deepcopy(self.twin.theirs)
        try:
            current = probe.get(sl, neg_index_as_lookback=neg) if sl is not None else probe.get()
        except Exception:  # noqa: BLE001 - any length will do then
            current = []
        count = max(rows_of(current) + extra, 0)
        items = [self.new_item(data, outside and i == 0) for i in range(count)]
        if self.fin and items and not as_list:
            new = make_batch(items)
            if new is None:
                return
        else:
            new = items  # (a list after finalize: dm-tree nesting errors in RLlib)
        if sl is None:
            self.twin.call("set", new, known=rllib_slice_assertion)
        else:
            self.twin.call("set", new, at_indices=sl, neg_index_as_lookback=neg,
                           known=rllib_slice_assertion)

    @rule()
    def len_and_repr(self):
        self.twin.call("__len__")
        self.twin.call("len_incl_lookback")
        if not (self.fin and self.kind.struct):
            self.twin.call("__repr__")

    @rule()
    def state_round_trip(self):
        """Continues with buffers rebuilt by from_state(): ours from RLlib's state."""
        state = self.twin.theirs.get_state()
        self.twin.call("get_state")
        ours = self.twin.Ours.from_state(copy.deepcopy(state))
        theirs = self.twin.Rllib.from_state(copy.deepcopy(state))
        self.twin = KeptTwin.from_buffers(ours, theirs)
        self.twin.check_state("from_state")

    @rule()
    def pickle_round_trip(self):
        ours = pickle.loads(pickle.dumps(self.twin.ours, protocol=5))
        theirs = pickle.loads(pickle.dumps(self.twin.theirs, protocol=5))
        self.twin = KeptTwin.from_buffers(ours, theirs)
        self.twin.check_state("pickle round trip")

    @rule(now=st.sampled_from([False] * 4 + [True]))
    def read_data(self, now):
        """Now and then compares `.data` itself. In list mode that hands out
        our live list, so the typed storage moves to a plain list from here on."""
        if now:
            compare_buffers(self.twin.ours, self.twin.theirs, "data", read_data=True)

    @rule()
    def eq_copy(self):
        other = KeptTwin.from_buffers(copy.deepcopy(self.twin.ours),
                                      copy.deepcopy(self.twin.theirs))
        self.twin.call("__eq__", Other(other))

    @precondition(lambda self: not self.twin.theirs.finalized)
    @rule(data=st.data(), other_lookback=st.integers(0, 3))
    def concat(self, data, other_lookback):
        items = data.draw(st.lists(self.items, max_size=4), label="other items")
        other = KeptTwin(items, other_lookback, self.kind.space)
        self.twin.call("concat", Other(other))

    @precondition(lambda self: not self.twin.theirs.finalized)
    @rule(data=st.data())
    def add(self, data):
        items = data.draw(st.lists(self.items, max_size=3), label="other items")
        results = {}

        def keep(ours, theirs):
            compare_buffers(ours, theirs, "__add__ result")
            results["pair"] = (ours, theirs)

        self.twin.call("__add__", items, result_check=keep)
        self.twin = KeptTwin.from_buffers(*results["pair"])


class StructMachine(BufferMachine):
    """Dict/Tuple items of a structure drawn per run (see strategies.structures).
    Without a space, about one item in six changes the structure or promotes
    a leaf; with one (`spaced`), every item lies in it."""

    spaced = False
    kind = Kind("struct", None, None, struct=True)  # replaced per run in init()

    @initialize(data=st.data(), lookback=st.integers(0, 6),
                finalize=st.sampled_from([False, False, True]))
    def init(self, data, lookback, finalize):
        if self.spaced:
            structure = data.draw(structures(SPACE_LEAVES), label="structure")
            ordered = data.draw(st.booleans(), label="the space keeps the key order")
            space, self.items = space_of(structure, ordered), item_of(structure)
            fill = data.draw(st.sampled_from([0, 0.0]), label="fill value")
        else:
            structure = data.draw(structures(list(LEAVES) + list(SPACE_LEAVES)),
                                  label="structure")
            # Half the runs without changes, so that more of them finalize.
            changed = data.draw(st.sampled_from([0, 1]), label="changed items in 6")
            space, self.items, fill = None, items_of(structure, changed), 0.0
        self.kind = Kind("struct", space, None, fill=fill, struct=True)
        super().init(data=data, lookback=lookback)
        if finalize and self.twin.theirs.len_incl_lookback() and not self.finalize_differs():
            self.twin.call("finalize")

    @precondition(lambda self: not self.fin)
    @rule(data=st.data(), idx=INDEX)
    def get_add_last_ts_value_struct(self, data, idx):
        """_add_last_ts_value with an int index in list mode. (With a slice,
        RLlib's np.append gives an array: a known bug in test_struct_items.py;
        after finalize() it flattens rows: a deliberate difference.)"""
        neg, fill, _, ignore = self.get_opts(data)
        extra = data.draw(self.items, label="_add_last_ts_value")
        self.twin.call("get", idx, neg_index_as_lookback=neg, fill=fill, _ignore_last_ts=ignore,
                       _add_last_ts_value=extra)


# PROPS_MAX_EXAMPLES=1000 for a longer hunt; the default keeps the suite fast.
SETTINGS = settings(max_examples=int(os.environ.get("PROPS_MAX_EXAMPLES", 60)),
                    stateful_step_count=30, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

def _register(base, attribute, variants, case_settings):
    """One TestRandomSequences_<name> test case per (name, value) variant of
    the machine `base` (with `attribute` set to the value)."""
    for name, value in variants:
        case = type(f"Machine_{name}", (base,), {attribute: value}).TestCase
        case.settings = case_settings
        case.__name__ = f"TestRandomSequences_{name}"
        globals()[case.__name__] = case


_register(BufferMachine, "kind", KINDS.items(), SETTINGS)
# The structure is drawn anew in every run: more runs than for a fixed kind.
STRUCT_SETTINGS = settings(SETTINGS, max_examples=int(os.environ.get("PROPS_MAX_EXAMPLES", 100)))
_register(StructMachine, "spaced", [("struct_changing", False), ("struct_space", True)],
          STRUCT_SETTINGS)
