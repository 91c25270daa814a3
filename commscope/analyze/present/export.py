"""Write an analysis out: JSON, a Perfetto/Chrome timeline, an offline HTML report.

Perfetto (:func:`perfetto_trace`), Chrome trace-event JSON that ui.perfetto.dev and
``chrome://tracing`` open:

1. One process (``pid`` = rank) per rank, named by a ``process_name`` metadata event
   with its host and pid where known (``rank 3 (hostB, pid 4242)``), a host's ranks
   side by side (``process_sort_index``: hosts in order of their first rank, then
   rank; ``otherData.hosts``: host → its ranks); one thread (``tid``) per group, named
   ``group <name> (<desc>)``.
2. One complete event (``ph: "X"``, microseconds from the oldest record) per recorded
   collective. It ends at the recorded completion (``time_discovered_completed_ns`` or
   ``duration_ms``: ``RankDump.ends`` when loaded with ``end_times=True``, else read
   back from the file) when the dump has one, else at the next
   record of the same track (an upper bound: gloo records no completion); an
   unfinished record ends at the newest timestamp of the whole dump set. Slices never
   overlap inside a track.
3. Unfinished records that are not known to have completed elsewhere are *stuck*:
   named ``STUCK …``, coloured ``terrible`` (red), ``args.stuck = true``.
4. Flow arrows (``s``/``f`` pairs sharing an ``id``) join the same collective on
   consecutive ranks of its group, for the newest ``flows_per_group`` sequence numbers.
4b. Point-to-point ops get a thread of their own per group (``p2p, group …``): one
   slice per send/recv (``send → 3``, ``recv ← 1``; ``STUCK`` when unfinished), and an
   arrow from each send to the recv it pairs with (the k-th send of src to dst with
   the k-th recv of dst from src).
5. Large jobs are capped: ranks named by findings first, then the lowest, up to
   ``max_ranks``; the newest ``max_per_track`` records per track.

HTML (:func:`html_report`): one self-contained file (its hosts:
:func:`~commscope.analyze.present.byhost.host_section`; who waits for whom, drawn:
:mod:`~commscope.analyze.present.waitgraph`, as an SVG made here;
rank lists with their hosts when the job spans hosts), the data embedded in a
``<script type="application/json">`` block (Chromium refuses ``fetch()`` of a
neighbouring ``file://``), our own CSS and JS from ``commscope/viewer/report.*``,
nothing fetched from the network.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable
from importlib import resources
from itertools import pairwise
from typing import Any

from commscope.analyze.align.match import p2p_channels
from commscope.analyze.analysis import Analysis
from commscope.analyze.answer import is_note
from commscope.analyze.model import COMPLETED, GAP, RETIRED, Group, P2POp, RankDump, Track
from commscope.analyze.present.byhost import HostView, host_section, ranks_with_hosts
from commscope.analyze.present.report import GROUP_COLUMNS, group_table
from commscope.analyze.present.waitgraph import wait_graph
from commscope.analyze.present.waitsvg import render_svg
from commscope.analyze.read.frame_source import FrameSource
from commscope.analyze.text import rank_list

__all__ = [
    "analysis_json",
    "write_json",
    "perfetto_trace",
    "write_perfetto",
    "timeline_data",
    "html_report",
    "write_html",
]

_DONE = RETIRED | COMPLETED


def _write(path: str | os.PathLike[str], text: str) -> None:
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def analysis_json(a: Analysis) -> dict[str, Any]:
    """:meth:`Analysis.to_json` with the wait-for graph's model added (``wait_graph``:
    ``null`` when nobody waits; docs/analyze.md)."""
    doc = a.to_json()
    graph = wait_graph(a)
    doc["wait_graph"] = graph.to_json() if graph else None
    return doc


def write_json(a: Analysis, path: str | os.PathLike[str]) -> None:
    """Write :func:`analysis_json` to ``path`` (atomically)."""
    _write(path, json.dumps(analysis_json(a), indent=2) + "\n")


def _chosen_ranks(a: Analysis, max_ranks: int) -> list[int]:
    named: list[int] = []
    for f in a.findings:
        named += f.culprit_ranks + f.waiting_ranks[:4]
    order = list(dict.fromkeys(r for r in named if r in a.load.dumps))
    order += [r for r in sorted(a.load.dumps) if r not in set(order)]
    return sorted(order[:max_ranks])


def _horizon(a: Analysis) -> tuple[int, int]:
    t0, t1 = None, 0
    for d in a.load.dumps.values():
        for t in d.tracks.values():
            if not len(t):
                continue
            lo = min(t.created)  # C-level; gaps (0) and odd values need the filter
            if lo <= 0:
                lo = min((c for c in t.created if c > 0), default=None)
            if lo is not None:
                t0 = lo if t0 is None else min(t0, lo)
            t1 = max(t1, max(t.created))
        for op in d.p2p:
            if op.created > 0:
                t0 = op.created if t0 is None else min(t0, op.created)
                t1 = max(t1, op.created)
        if d.dump_time_ns:
            t1 = max(t1, d.dump_time_ns)
    t0 = t0 or 0
    return t0, max(t1, t0 + 1_000_000)


def _stuck_keys(a: Analysis) -> set[tuple[str, int]]:
    """``(group, seq)`` of the collectives some rank waits in and no rank finished."""
    pending = {(g, seq) for d in a.load.dumps.values() for g, seq, _ in d.pending if seq >= 0}
    stuck = set()
    for key, seq in pending:
        view = a.views.get(key)
        ranks = view.spans if view is not None else ()
        for r in ranks:
            t = a.load.dumps[r].tracks.get(key)
            i = seq - t.lo if t is not None else -1
            if 0 <= i < len(t.status) and t.status[i] & _DONE and t.sig[i] != GAP:
                break  # finished somewhere: not stuck
        else:
            stuck.add((key, seq))
    return stuck


def _end_ns(entry: Any) -> int | None:
    """When a record's collective ended, from the raw record (``None``: not recorded)."""
    if not isinstance(entry, dict):
        return None
    done = entry.get("time_discovered_completed_ns")
    if type(done) is int and 0 < done < 2**63:
        return done
    dur, created = entry.get("duration_ms"), entry.get("time_created_ns")
    if type(dur) in (int, float) and type(created) is int and 0 < created < 2**62 \
            and 0 <= dur < 1e9:
        return created + int(dur * 1e6)
    return None


EndOf = Callable[[int], "int | None"]
"""A record's completion time (ns) by its position in the file, ``None`` if unknown."""


def _end_lookup(d: RankDump, source: FrameSource) -> EndOf:
    """Completion times of ``d``'s records: kept from loading (``end_times=True``), else
    read back from the file."""
    ends = d.ends
    if ends is not None:
        n = len(ends)
        return lambda pos: (ends[pos] or None) if 0 <= pos < n else None
    raw = source.entries(d.rank)
    return lambda pos: _end_ns(raw[pos]) if 0 <= pos < len(raw) else None


def _slices(t: Track, horizon: int, limit: int, end_of: EndOf
            ) -> list[tuple[int, int, int, bool]]:
    """(index, start_ns, end_ns, finished) for the newest ``limit`` records of a track."""
    n = len(t)
    return _spans([(i, t.created[i], bool(t.status[i] & _DONE), t.index[i])
                   for i in range(max(0, n - limit), n)
                   if t.sig[i] != GAP and t.created[i] > 0], horizon, end_of)


def _p2p_slices(ops: list[P2POp], horizon: int, limit: int, end_of: EndOf
                ) -> list[tuple[P2POp, int, int, bool]]:
    """(op, start_ns, end_ns, finished) for the newest ``limit`` p2p ops of one group."""
    ops = sorted((o for o in ops if o.created > 0), key=lambda o: (o.created, o.index))
    return _spans([(o, o.created, bool(o.status & _DONE), o.index) for o in ops[-limit:]],
                  horizon, end_of)


def _spans(items: list[tuple[Any, int, bool, int]], horizon: int, end_of: EndOf
           ) -> list[tuple[Any, int, int, bool]]:
    """Give each ``(key, start_ns, finished, position in the file)`` of one track its end.

    The end is the recorded completion when the record has one, else the next item's
    start (an upper bound), else the horizon for an unfinished item; never past the
    next item's start, so slices of one track do not overlap.
    """
    out = []
    for j, (key, start, finished, pos) in enumerate(items):
        nxt = items[j + 1][1] if j + 1 < len(items) else None
        end = end_of(pos)
        if end is not None and end <= start:
            end = None
        if end is None:
            end = nxt if nxt is not None else (horizon if not finished else start + 1000)
        if nxt is not None:
            end = min(end, nxt)
        out.append((key, start, max(end, start + 1000), finished))
    return out


def _p2p_label(op: P2POp) -> str:
    peer = "?" if op.peer is None else op.peer
    return f"send → {peer}" if op.op == "send" else f"recv ← {peer}"


def _p2p_by_group(d: RankDump) -> dict[str, list[P2POp]]:
    by_group: dict[str, list[P2POp]] = {}
    for op in d.p2p:
        by_group.setdefault(op.group, []).append(op)
    return by_group


def perfetto_trace(a: Analysis, *, max_ranks: int = 128, max_per_track: int = 1000,
                   flows_per_group: int = 200) -> dict[str, Any]:
    """The analysis as Chrome trace-event JSON (see module doc)."""
    t0, horizon = _horizon(a)
    stuck = _stuck_keys(a)
    tids = {key: i + 1 for i, key in enumerate(sorted(a.views))}
    ranks = _chosen_ranks(a, max_ranks)
    events: list[dict[str, Any]] = []
    anchors: dict[tuple[str, int], list[tuple[int, float]]] = {}
    p2p_at: dict[int, tuple[int, float]] = {}
    p2p_tids = _p2p_tracks([a.load.dumps[r] for r in ranks], len(tids))
    sigs = a.load.sigs.sigs
    size_texts: dict[int, str] = {}  # every rank repeats the same few signatures

    def sizes(sig_id: int) -> str:
        text = size_texts.get(sig_id)
        if text is None:
            text = size_texts[sig_id] = sigs[sig_id].sizes_text()
        return text

    source = FrameSource(a.load)
    view = HostView.of(a.hosts)
    # a host's ranks side by side (hosts in order of their first rank), whatever the
    # launcher's placement (Slurm's cyclic distribution interleaves them)
    hosts_order = {h: i for i, h in enumerate(view.by_host)}
    order = sorted(ranks, key=lambda r: (hosts_order.get(view.host_of.get(r, ""), -1), r))
    sort_index = {r: i for i, r in enumerate(order)}
    for r in ranks:
        d = a.load.dumps[r]
        end_of = _end_lookup(d, source)
        label = view.label(r) or _dump_label(d)
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                       "args": {"name": f"rank {r} ({label})" if label else f"rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0,
                       "args": {"sort_index": sort_index[r]}})
        for key in sorted(d.tracks):
            t = d.tracks[key]
            g = a.groups.get(key)
            tid = tids.get(key, len(tids) + 1)
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                           "args": {"name": _track_name(key, g)}})
            top = t.hi - flows_per_group
            for i, start, end, finished in _slices(t, horizon, max_per_track, end_of):
                seq = t.lo + i
                sig = sigs[t.sig[i]]
                is_stuck = not finished and (key, seq) in stuck
                ts = (start - t0) / 1000.0
                ev: dict[str, Any] = {
                    "ph": "X", "pid": r, "tid": tid, "ts": ts, "dur": (end - start) / 1000.0,
                    "name": f"{'STUCK ' if is_stuck else ''}{sig.op} #{seq}", "cat": "collective",
                    "args": {"group": key, "collective_seq_id": seq,
                             "profiling_name": sig.profiling_name, "sizes": sizes(t.sig[i]),
                             "finished": finished, "stuck": is_stuck},
                }
                if is_stuck:
                    ev["cname"] = "terrible"
                events.append(ev)
                if seq > top:
                    anchors.setdefault((key, seq), []).append((r, ts + 0.0005))
        by_group = _p2p_by_group(d)
        for key in sorted(by_group):
            g = a.groups.get(key)
            tid = p2p_tids[key]
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid,
                           "args": {"name": f"p2p, {_track_name(key, g)}"}})
            for op, start, end, finished in _p2p_slices(by_group[key], horizon,
                                                         max_per_track, end_of):
                ts = (start - t0) / 1000.0
                ev = {
                    "ph": "X", "pid": r, "tid": tid, "ts": ts, "dur": (end - start) / 1000.0,
                    "name": f"{'STUCK ' if not finished else ''}{_p2p_label(op)}",
                    "cat": "p2p",
                    "args": {"group": key, "p2p_seq_id": op.p2p_seq, "peer": op.peer,
                             "profiling_name": sigs[op.sig].profiling_name,
                             "sizes": sizes(op.sig), "finished": finished,
                             "stuck": not finished},
                }
                if not finished:
                    ev["cname"] = "terrible"
                events.append(ev)
                p2p_at[id(op)] = (tid, ts + 0.0005)
    flow_id = 0
    for (group, src, dst), (s_ops, r_ops) in p2p_channels(a.load, ranks).items():
        for s_op, r_op in zip(s_ops, r_ops):  # the k-th send pairs with the k-th recv
            start, end = p2p_at.get(id(s_op)), p2p_at.get(id(r_op))
            if start is None or end is None:
                continue  # outside the newest max_per_track of its track
            flow_id += 1
            name = f"p2p {group} {src}→{dst}"
            events.append({"ph": "s", "id": flow_id, "pid": src, "tid": start[0],
                           "ts": start[1], "name": name, "cat": "p2p", "bp": "e"})
            events.append({"ph": "f", "id": flow_id, "pid": dst, "tid": end[0],
                           "ts": end[1], "name": name, "cat": "p2p", "bp": "e"})
    for (key, seq), points in sorted(anchors.items()):
        tid = tids.get(key, 0)
        points.sort()
        for (ra, ta), (rb, tb) in pairwise(points):
            flow_id += 1
            name = f"{key} #{seq}"
            events.append({"ph": "s", "id": flow_id, "pid": ra, "tid": tid, "ts": ta,
                           "name": name, "cat": "match", "bp": "e"})
            events.append({"ph": "f", "id": flow_id, "pid": rb, "tid": tid, "ts": tb,
                           "name": name, "cat": "match", "bp": "e"})
    other: dict[str, Any] = {"format": "commscope.analysis/2", "verdict": a.verdict,
                             "root_cause": a.findings[0].message if a.findings else ""}
    if view.by_host:
        other["hosts"] = {h: rank_list(rs, 64) for h, rs in view.by_host.items()}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def _dump_label(d: RankDump) -> str:
    """``node0, pid 1003`` from a dump's own ``hostname``/``pid`` (no place known)."""
    if not d.hostname:
        return ""
    return d.hostname + (f", pid {d.pid}" if d.pid is not None else "")


def _p2p_tracks(dumps: list[RankDump], n_collective: int) -> dict[str, int]:
    """A thread id per group with p2p ops, after every group's collective thread."""
    keys = sorted({op.group for d in dumps for op in d.p2p})
    return {key: n_collective + 1 + i for i, key in enumerate(keys)}


def _track_name(key: str, g: Group | None) -> str:
    """``group 0 (default_pg)``; ``group mesh_dp (d876ba23)`` for hash-named groups."""
    if g is None:
        return f"group {key}"
    if g.short:
        return g.ref()
    return f"group {key} ({g.desc})" if g.desc else f"group {key}"


def write_perfetto(a: Analysis, path: str | os.PathLike[str], **caps: int) -> None:
    """Write :func:`perfetto_trace` to ``path``."""
    _write(path, json.dumps(perfetto_trace(a, **caps), separators=(",", ":")))


def timeline_data(a: Analysis, *, max_ranks: int = 32, max_per_track: int = 60) -> dict[str, Any]:
    """Compact timeline for the HTML drawing: newest records of the most relevant ranks."""
    t0, horizon = _horizon(a)
    stuck = _stuck_keys(a)
    lanes: list[dict[str, Any]] = []
    source = FrameSource(a.load)
    view = HostView.of(a.hosts)
    for r in _chosen_ranks(a, max_ranks):
        d = a.load.dumps[r]
        end_of = _end_lookup(d, source)
        first = len(lanes)
        for key in sorted(d.tracks):
            t = d.tracks[key]
            items = []
            for i, start, end, finished in _slices(t, horizon, max_per_track, end_of):
                sig = a.load.sigs.sigs[t.sig[i]]
                seq = t.lo + i
                items.append([round((start - t0) / 1e3, 1), round((end - start) / 1e3, 1),
                              f"{sig.op} #{seq}", int(not finished and (key, seq) in stuck)])
            if items:
                g = a.groups.get(key)
                lanes.append({"rank": r, "group": g.display if g else key, "items": items})
        by_group = _p2p_by_group(d)
        for key in sorted(by_group):
            items = [[round((start - t0) / 1e3, 1), round((end - start) / 1e3, 1),
                      _p2p_label(op), int(not finished)]
                     for op, start, end, finished in _p2p_slices(
                         by_group[key], horizon, max_per_track, end_of)]
            if items:
                g = a.groups.get(key)
                lanes.append({"rank": r, "group": f"p2p {g.display if g else key}",
                              "items": items})
        if view.several and r in view.host_of:
            for lane in lanes[first:]:
                lane["host"] = view.host_of[r]
    return {"span_us": round((horizon - t0) / 1e3, 1), "lanes": lanes}


def _asset(name: str) -> str:
    return resources.files("commscope").joinpath("viewer", name).read_text(encoding="utf-8")


def _wait_graph(a: Analysis) -> dict[str, Any] | None:
    """The "who waits for whom" section: the drawing and its model (``None``: nobody
    waits)."""
    graph = wait_graph(a)
    if not graph:
        return None
    return {"svg": render_svg(graph), "model": graph.to_json(), "caption": graph.caption}


def html_report(a: Analysis, title: str | None = None) -> str:
    """The analysis as one self-contained HTML page (see module doc)."""
    doc = a.to_json()
    view = HostView.of(a.hosts)
    groups, groups_after = group_table(a)
    data = {
        "analysis": doc,
        "hosts": host_section(a, doc["hosts"], doc["exclude_hosts"]),
        # ranks with their hosts, per finding, when the job spans hosts
        "finding_ranks": [{
            "culprits": ranks_with_hosts(f.culprit_ranks, view),
            "waiting": ranks_with_hosts(f.waiting_ranks, view),
            "victims": ranks_with_hosts(f.victims, view),
        } for f in a.findings] if view.several else None,
        "kinds": [f.kind for f in a.findings],
        "blocking": [f.blocking for f in a.findings],
        # the findings the answer folded into its notes (listed there, not below)
        "notes": [is_note(f) for f in a.findings],
        # hash-named groups (member-only creation) shown by their short name
        "group_labels": [f.group.display if f.group else None for f in a.findings],
        "group_columns": list(GROUP_COLUMNS),
        "groups": groups,
        "groups_after": groups_after,
        "timeline": timeline_data(a),
        "wait_graph": _wait_graph(a),
        "source": a.load.root,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "elapsed_s": round(a.elapsed_s, 3),
    }
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/").replace(
        "<!--", "<\\!--")
    page_title = html.escape(title or f"commscope analysis: {a.verdict}")
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{page_title}</title>\n<style>\n{_asset('report.css')}\n</style></head>\n"
        "<body><main id=\"app\"><noscript>This report needs JavaScript to draw; the raw "
        "analysis is in the page source.</noscript></main>\n"
        f"<script type=\"application/json\" id=\"commscope-data\">{payload}</script>\n"
        f"<script>\n{_asset('report.js')}\n</script>\n</body></html>\n"
    )


def write_html(a: Analysis, path: str | os.PathLike[str], title: str | None = None) -> None:
    """Write :func:`html_report` to ``path``."""
    _write(path, html_report(a, title))
