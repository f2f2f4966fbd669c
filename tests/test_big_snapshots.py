"""Big snapshots: the streaming generator (tests/snapshot_gen.py) and the
native snapshot reader (gpumem._C.read_snapshot_pickle, Note [Compact trace
entries]) against the reference, Python's unpickler."""

from __future__ import annotations

import pickle

import pytest

from snapshot_gen import synthetic_dict, write_snapshot


@pytest.mark.parametrize("events", [0, 1, 250, 3001])
def test_the_generator_writes_the_dict_it_describes(tmp_path, events):
    path = tmp_path / "big.pickle"
    size = write_snapshot(path, events)
    assert size == path.stat().st_size
    snap = pickle.loads(path.read_bytes())
    assert snap == synthetic_dict(events)
    assert len(snap["device_traces"][0]) == events
