"""Property tests: whatever a field holds, no traceback escapes and every bad file is named.

Each example takes a small valid job (our format), replaces ONE field of one rank's dump
(top level or one record) with an arbitrary value, writes it as a pickle or JSON, and
analyzes the folder. The analysis must finish; when the value is not what the format
allows, that rank's file must be listed in ``unreadable`` with a reason.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commscope.analyze import analyze, format_entries
from commscope.analyze.present.export import perfetto_trace
from commscope.analyze.synth import SyntheticJob, write_dump

I64 = 2**63 - 1


def _int_ok(v, lo=-I64):
    return type(v) is int and lo <= v <= I64


def _shapes_ok(v):
    return isinstance(v, (list, tuple)) and all(
        isinstance(s, (list, tuple)) and len(s) <= 64 and all(type(d) is int and d >= 0
                                                             for d in s) for s in v)


def _strs_ok(v):
    return isinstance(v, (list, tuple)) and all(type(x) is str for x in v)


ENTRY_FIELDS = {
    "record_id": _int_ok,
    "pg_id": _int_ok,
    "p2p_seq_id": _int_ok,
    "time_created_ns": _int_ok,
    "collective_seq_id": lambda v: _int_ok(v, 0),
    "process_group": lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(
        type(x) is str for x in v),
    "profiling_name": lambda v: type(v) is str,
    "input_sizes": _shapes_ok,
    "output_sizes": _shapes_ok,
    "input_dtypes": _strs_ok,
    "output_dtypes": _strs_ok,
    "state": lambda v: v in ("scheduled", "started", "completed"),
    "retired": lambda v: type(v) is bool,
    "is_p2p": lambda v: type(v) is bool,
    "time_discovered_started_ns": lambda v: v is None or _int_ok(v),
    "time_discovered_completed_ns": lambda v: v is None or _int_ok(v),
    "duration_ms": lambda v: True,  # optional: a bad one only loses a slice's end
}
TOP_FIELDS = {
    "version": lambda v: type(v) is str,
    "entries": lambda v: isinstance(v, list),
    "world_size": lambda v: v is None or _int_ok(v, 1),
    "dump_time_ns": lambda v: v is None or _int_ok(v, 0),
    "rank": lambda v: _int_ok(v, 0) and v < 2**31,
}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True), st.text(max_size=8),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12)
pickle_values = st.recursive(
    st.one_of(scalars, st.binary(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=12)


def _job():
    job = SyntheticJob(3)
    job.group("1", "pair", [0, 1])
    for _ in range(3):
        job.collective("all_reduce")
        job.collective("all_gather", group="1")
    job.collective("all_reduce", ranks=[0, 1])
    return job


def _check(where, field, value, fmt):
    job = _job()
    with tempfile.TemporaryDirectory() as tmp:
        job.write(tmp, ranks=[0, 2])
        data = job.dump(1)
        if where == "top":
            data[field] = value
            bad = not TOP_FIELDS[field](value)
        else:
            entry = data["entries"][where % len(data["entries"])]
            entry[field] = value
            bad = not ENTRY_FIELDS[field](value)
        try:
            path = write_dump(data, os.path.join(tmp, "rank_1"), fmt=fmt)
        except (TypeError, ValueError, OverflowError, pickle.PicklingError):
            return  # not representable in this format: nothing to read
        result = analyze(tmp)  # must never raise
        assert result.findings and result.verdict
        json.dumps(result.to_json())
        format_entries(result, last=3)  # the side-by-side view copes with it too
        # Completion times kept while loading draw the same timeline as re-reading.
        kept = analyze(tmp, end_times=True)
        assert json.dumps(perfetto_trace(kept)) == json.dumps(perfetto_trace(result))
        named = [u for u in result.unreadable if u.file == path]
        if bad:
            assert named, f"{field}={value!r} not reported: {result.unreadable}"
            assert all(u.error for u in named)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(ENTRY_FIELDS)), where=st.integers(0, 20),
       value=pickle_values)
def test_any_record_field_pickle(field, where, value):
    _check(where, field, value, "pickle")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(ENTRY_FIELDS)), where=st.integers(0, 20),
       value=json_values)
def test_any_record_field_json(field, where, value):
    _check(where, field, value, "json")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(TOP_FIELDS)), value=pickle_values)
def test_any_top_level_field(field, value):
    _check("top", field, value, "pickle")


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=0, max_value=5000), noise=st.binary(max_size=64))
def test_truncated_or_noisy_bytes_are_named(cut, noise):
    job = _job()
    with tempfile.TemporaryDirectory() as tmp:
        job.write(tmp, ranks=[0, 2])
        raw = pickle.dumps(job.dump(1), protocol=2)
        if cut >= len(raw):
            cut = len(raw) - 1
        blob = raw[:cut] + noise
        path = os.path.join(tmp, "rank_1")
        with open(path, "wb") as f:
            f.write(blob)
        result = analyze(tmp)
        assert result.findings
        assert [u.file for u in result.unreadable if u.file == path] or 1 in result.loaded
