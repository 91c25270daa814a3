"""Several jobs in one folder: tell them apart, keep the newest, set the others aside.

A restarted job (torchrun ``--max-restarts``, a scheduler's requeue) or a reused dump
folder leaves the files of an earlier attempt beside the new ones, sometimes with more
ranks. Merged, they invent mismatches and crashes; so they are never merged.

Algorithm (:func:`split_jobs`):

1. ``--world-size N`` given: a file of a rank ``>= N`` is another job's.
2. Our dumps carry the id every rank of one attempt agreed on through the job's store
   (``commscope_job``): equal ids, one job.
3. A file without an id (PyTorch's native dumps; ours from before ids) is placed by
   what it says of itself: its world size (``world_size``, or its default group's
   members) and when it recorded. A job's *start* is the earliest first record of its
   files; a file whose newest record is older than the newest job's start (it recorded
   nothing while that job ran) belongs to an earlier attempt, as does one whose world
   size differs from the newest job's.
4. The newest job is the one with the newest activity (its latest record or dump
   time); every file of another job is set aside with the reason, never analyzed.
"""

from __future__ import annotations

from collections.abc import Iterable

from commscope.analyze.model import RankDump, Unreadable

__all__ = ["split_jobs"]

_SLACK_NS = 500_000_000
"""Clock skew between a job's hosts that still counts as "at the same time"."""


def _world(d: RankDump) -> int | None:
    if d.job is not None and d.job[3]:
        return d.job[3]
    if d.world_size:
        return d.world_size
    if d.world_hint:
        return max(d.world_hint) + 1
    return None


def _newest(d: RankDump) -> int:
    return max(d.last_created_ns or 0, d.dump_time_ns or 0, d.first_created_ns or 0)


def _started(dumps: Iterable[RankDump]) -> int | None:
    starts = [d.job[2] for d in dumps if d.job is not None and d.job[2]]
    starts += [d.first_created_ns for d in dumps
               if d.first_created_ns and not d.wrapped and d.job is None]
    return min(starts) if starts else None


def _ago(newer: int | None, older: int) -> str:
    if not newer or not older or newer <= older:
        return ""
    return f", {(newer - older) / 1e9:.0f} s before the newest job's"


def split_jobs(dumps: list[RankDump],
               world_size: int | None = None) -> tuple[list[RankDump], list[Unreadable]]:
    """The dumps of the newest job, and the files of other jobs with why (module doc)."""
    aside: list[Unreadable] = []
    kept: list[RankDump] = []
    for d in dumps:
        if world_size is not None and d.rank >= world_size:
            aside.append(Unreadable(d.path, f"rank {d.rank} is outside the world size "
                                    f"{world_size} given (--world-size): another job's file",
                                    d.rank))
        else:
            kept.append(d)
    if len(kept) < 2:
        return kept, aside
    by_id: dict[str, list[RankDump]] = {}
    loose: list[RankDump] = []
    for d in kept:
        if d.job is not None and d.job[0]:
            by_id.setdefault(d.job[0], []).append(d)
        else:
            loose.append(d)
    newest_id = max(by_id, key=lambda k: max(_newest(d) for d in by_id[k]), default=None)
    newest_loose = max(loose, key=_newest, default=None)
    if newest_id is not None and (newest_loose is None or max(
            _newest(d) for d in by_id[newest_id]) >= _newest(newest_loose) - _SLACK_NS):
        job = list(by_id[newest_id])
        others = [d for k, ds in by_id.items() if k != newest_id for d in ds]
        for d in others:
            aside.append(Unreadable(d.path, f"rank {d.rank}'s file belongs to another job "
                                    f"(job id {d.job[0][:8]} vs {newest_id[:8]}, "  # type: ignore[index]
                                    f"{_world(d) or '?'} ranks){_ago(_started(job), _newest(d))}",
                                    d.rank))
    else:
        job = [newest_loose] if newest_loose is not None else []
        for ds in by_id.values():
            for d in ds:
                aside.append(Unreadable(d.path, f"rank {d.rank}'s file belongs to an older "
                                        "job (its dumps are older than the newest files)", d.rank))
        loose = [d for d in loose if d is not newest_loose]
    world = _world(job[0]) if job else None
    start = _started(job)
    in_job = {id(d) for d in job}  # identity: comparing whole dumps is quadratic
    for d in loose:
        if id(d) in in_job:
            continue
        w = _world(d)
        if world is not None and w is not None and w != world:
            aside.append(Unreadable(d.path, f"rank {d.rank}'s file is of a job of {w} ranks; "
                                    f"the newest job has {world}", d.rank))
            continue
        if start is not None and _newest(d) and _newest(d) < start - _SLACK_NS:
            aside.append(Unreadable(d.path, f"rank {d.rank}'s file recorded nothing after "
                                    f"the newest job started{_ago(start, _newest(d))}: an "
                                    "earlier attempt's", d.rank))
            continue
        job.append(d)
        if start is None or (d.first_created_ns and not d.wrapped
                             and d.first_created_ns < start):
            start = _started(job)
    return job, aside
