"""Find and read every rank's dump safely; one bad file never sinks the rest.

Algorithm (:func:`load_dumps`):

1. **Discover** (:func:`discover`). A file argument is one dump. In a folder, every file
   whose name ends in a rank number, optionally followed by ``.json``, ``.pkl`` or
   ``.pickle`` and ``.gz`` (``rank_3``, ``nccl_trace_rank_3``, ``comm_lib_trace_rank_3``,
   ``rank_3.json.gz``), is a candidate; sub-folders are searched too (torchtitan writes
   ``<dump_folder>/comm_traces/rank_<N>``). With ``prefix`` only names (or paths
   relative to the folder) that start with it count, and the rank is the number right
   after it. Other files are listed as ignored.
2. **Read** (:func:`read_dump_file`): gzip is recognised by its magic bytes, JSON by a
   leading ``{``, a pickle by its protocol-2+ header. Pickles go through
   :class:`SafeUnpickler`, which refuses every import, so a hostile file cannot run code.
   Empty, truncated, corrupt, foreign (not a flight-recorder dict) files raise
   :class:`DumpError` with the reason.
3. **Extract** each dict into a compact :class:`~commscope.analyze.model.RankDump`
   (:func:`commscope.analyze.read.extract.extract_dump`); the rank inside the file wins over
   the one in its name.
4. With many files, steps 2-3 run in a pool of worker processes (``jobs``); workers send
   back compact columns, never the raw entries. The parent asks the kernel to read a
   window of files ahead of the workers, so disk or network reads overlap parsing. A
   worker that dies (killed for memory, a crash) does not hang or sink the analysis:
   the files it had not returned are read again one process each, and one that kills
   its reader again is reported as unreadable with that reason.
5. **Merge**: signatures are interned into one table; two files claiming one rank keep
   the one with the later dump time, then more records, then the smaller path, and
   the other is reported as a duplicate (:func:`choose_newest`; several inputs bring
   their own rule across inputs, :mod:`.inputs`). An unreadable file whose name does not look
   like the readable dumps' (``checkpoint_10000`` beside ``rank_<N>``) is listed but
   claims no rank. Half-written files (``rank_0.tmp1234``) are skipped. The result
   never depends on listing order.

In the worker processes, plain pickles are first offered to the optional C reader
``_fastread`` (built with the package when a compiler is there), which reads the records
straight into columns instead of 2 000 dicts per file; it answers only for the common
well-formed case and declines everything else to the standard path above, so results
are the same either way (``COMMSCOPE_NO_C_READER=1`` turns it off). It never runs in the
main process: were it ever to crash, that would cost one file (named), not the analysis.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import logging
import multiprocessing
import os
import pickle
import re
import stat
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from commscope.analyze.model import LoadResult, RankDump, SigTable, Unreadable
from commscope.analyze.read.extract import Declined, DumpError, extract_dump, finish_sigs
from commscope.analyze.read.fatal import read_fatal_logs
from commscope.analyze.read.jobs import split_jobs
from commscope.analyze.read.records import reader_columns

try:  # the optional C reader (built with the package when a compiler is there)
    from commscope.analyze.read import _fastread
except ImportError:  # pragma: no cover - depends on the build
    _fastread = None  # type: ignore[assignment]

__all__ = [
    "Choose",
    "DumpError",
    "SafeUnpickler",
    "choose_newest",
    "discover",
    "rank_in_name",
    "read_dump_file",
    "load_file",
    "load_dumps",
    "load_found",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^(?P<stem>.*?)(?P<rank>\d+)(?P<ext>(?:\.(?:json|pkl|pickle))?(?:\.gz)?)$")
_FATAL = re.compile(r"(?:^\.commscope-fatal-\d+\.log|\d+\.fatal)$")
"""The recorder's fatal logs (read by :mod:`.fatal`)."""
LATER_DIR = "commscope_later"
"""Where the recorder writes the dumps a rank makes after the first one of an incident
(``commscope.flight.out.dump``): set aside, the first one is the incident's."""
_SCRATCH = re.compile(r"\.(tmp|part|partial|swp|lock)\w*$|~$")
"""Half-written files of atomic writers (``rank_0.tmp1234``) are not dumps."""
_PARALLEL_MIN_FILES = 64
_PARALLEL_MIN_BYTES = 32 << 20
_PREFETCH_FILES = 128
"""How many files ahead of the workers the kernel is asked to read (parallel loads)."""
_PREFETCH_BYTES = 8 << 20
"""At most this much of each file is read ahead (a 20 000-record dump is ~5 MB)."""
_MAX_DEPTH = 3
_FAST_MAX_BYTES = 1 << 30
"""Bigger files are streamed through the standard unpickler, never read whole."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler for plain data only: dict, list, tuple, str, int, float, bool, None.

    Those are built by opcodes alone; anything else needs an import (``find_class``),
    which is always refused, so no constructor or function named in the file can run.
    """

    def find_class(self, module: str, name: str) -> Any:
        """Refuse every global: flight-recorder dumps never need one."""
        raise pickle.UnpicklingError(
            f"refused to import {module}.{name}: a flight-recorder dump holds only plain "
            "data, so this file is not one (or was tampered with)"
        )

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids (used by torch.save, never by dumps)."""
        raise pickle.UnpicklingError("refused a persistent id: not a flight-recorder dump")


def _describe_start(head: bytes) -> str:
    return repr(head[:8])


def _open_payload(raw: io.BufferedReader, path: str) -> tuple[io.BufferedReader, bool]:
    """Unwrap gzip when the magic says so; return a peekable stream and whether it was gz."""
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), 1 << 20), True  # type: ignore[arg-type]
    return raw, False


def read_dump_file(path: str | os.PathLike[str]) -> Any:
    """Read one dump file (pickle or JSON, optionally gzip) into plain Python data.

    Raises :class:`DumpError` naming what is wrong: empty, truncated, corrupt gzip,
    invalid JSON, a pickle that wants to import something, or bytes that are neither.
    """
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    if size == 0:
        raise DumpError("empty file (0 bytes)")
    try:
        with open(p, "rb", buffering=1 << 20) as raw:
            stream, gz = _open_payload(raw, p)
            head = stream.peek(16)[:16]
            if not head:
                raise DumpError("empty after gzip decompression")
            first = head.lstrip()[:1]
            if first in (b"{", b"["):
                try:
                    return json.loads(stream.read())
                except UnicodeDecodeError:
                    raise DumpError("starts like JSON but is not UTF-8 text") from None
                except (ValueError, RecursionError) as exc:
                    raise DumpError(f"invalid JSON: {exc}") from None
            if head[:1] != b"\x80" or head[1:2] not in (b"\x02", b"\x03", b"\x04", b"\x05"):
                what = "gzip data" if gz else "file"
                raise DumpError(
                    f"not a flight-recorder dump: {what} starts with {_describe_start(head)}, "
                    "expected a pickle (protocol 2+) or JSON"
                )
            try:
                data = SafeUnpickler(stream).load()
            except EOFError:
                raise DumpError(
                    f"truncated pickle ({size} bytes on disk): the writer was cut off"
                ) from None
            except pickle.UnpicklingError as exc:
                text = str(exc)
                if "truncated" in text:
                    raise DumpError(f"truncated pickle ({size} bytes on disk)") from None
                raise DumpError(f"corrupt pickle: {text}") from None
            except (gzip.BadGzipFile, zlib.error) as exc:
                raise DumpError(f"corrupt gzip data: {exc}") from None
            except (ValueError, TypeError, KeyError, IndexError, AttributeError,
                    MemoryError, RecursionError, OverflowError) as exc:
                raise DumpError(f"corrupt pickle: {type(exc).__name__}: {exc}") from None
            return data
    except DumpError:
        raise
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DumpError(f"corrupt gzip data: {exc}") from None
    except EOFError:
        raise DumpError("truncated gzip stream (compressed file ended early)") from None
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None


def discover(
    path: str | os.PathLike[str], prefix: str | None = None,
    max_depth: int | None = _MAX_DEPTH,
) -> tuple[list[tuple[str, int | None]], list[str]]:
    """List candidate dump files under ``path`` with the rank their name gives.

    Returns ``(candidates, ignored)``; candidates are ``(path, rank_from_name)`` sorted
    by path. Sub-folders are searched ``max_depth`` levels deep (``None``: all of them,
    for an unpacked archive, whose size is already bounded). Raises
    ``FileNotFoundError`` when ``path`` does not exist.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root} does not exist")
    if root.is_file():
        m = _NAME.match(root.name)
        return [(str(root), int(m.group("rank")) if m else None)], []
    candidates: list[tuple[str, int | None]] = []
    ignored: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        depth = 0 if str(rel_dir) == "." else len(rel_dir.parts)
        later = [os.path.join(dirpath, d) for d in dirnames if d == LATER_DIR]
        for folder in later:  # the later dumps of an incident: the first one is analyzed
            ignored.extend(os.path.join(folder, f) for f in sorted(os.listdir(folder))
                           if not f.startswith("."))  # a write cut short is no dump
        deeper = max_depth is None or depth < max_depth
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith(".") and d != LATER_DIR and deeper)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = name if depth == 0 else (rel_dir / name).as_posix()
            rank = _rank_from_name(name, rel, prefix)
            if rank is _NO_MATCH:
                if not name.startswith(".") or _FATAL.search(name):
                    ignored.append(full)  # a hidden fatal log is the recorder's
                continue
            candidates.append((full, rank))  # type: ignore[arg-type]
    candidates.sort()
    return candidates, sorted(ignored)


_NO_MATCH = object()


def rank_in_name(rel: str, prefix: str | None = None) -> int | None:
    """The rank a file at ``rel`` (a ``/``-joined path under the folder) would be read
    for by :func:`discover`; ``None`` when it would not be a dump candidate with a rank."""
    rank = _rank_from_name(rel.rpartition("/")[2], rel, prefix)
    return rank if isinstance(rank, int) else None


def _rank_from_name(name: str, rel: str, prefix: str | None) -> object:
    if prefix:
        for text in (rel, name):
            if text.startswith(prefix):
                m = _NAME.match(text[len(prefix):]) if text != prefix else None
                if m and not m.group("stem"):
                    return int(m.group("rank"))
                return None  # claimed by the prefix, but no rank number after it
        return _NO_MATCH
    m = _NAME.match(name)
    if not m or name.endswith((".py", ".txt", ".html", ".md")) or _SCRATCH.search(name):
        return _NO_MATCH
    return int(m.group("rank"))


def _stem(path: str) -> str:
    m = _NAME.match(os.path.basename(path))
    return m.group("stem") if m else ""


def _read_fast(path: str, name_rank: int | None, end_times: bool) -> RankDump | None:
    """The columnar reader's :class:`RankDump` of a plain pickle, or ``None`` when it
    declines (not built or turned off, not a regular file of sane size, not the common
    case)."""
    if _fastread is None or os.environ.get("COMMSCOPE_NO_C_READER"):
        return None
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or not 0 < info.st_size <= _FAST_MAX_BYTES:
            return None
        with open(path, "rb") as f:
            result = _fastread.read_columns(f.read(_FAST_MAX_BYTES + 1))
        if result is None:
            return None
        return extract_dump(result[0], path, name_rank, end_times=end_times,
                            fast=reader_columns(result))
    except Declined:
        return None  # the standard path reads it and says what is wrong, if anything
    except Exception as exc:  # never worse than the standard path: it gets the file
        logger.debug("columnar reader gave up on %s: %r", path, exc)
        return None


def load_file(path: str, name_rank: int | None, end_times: bool = False,
              columnar: bool = False) -> RankDump | Unreadable:
    """Read and extract one file; never raises for bad content.

    ``columnar`` first offers the file to the C reader: the worker processes do, so
    that native code runs only where a crash would cost one file, not the analysis.
    """
    try:
        fast = _read_fast(path, name_rank, end_times) if columnar else None
        if fast is not None:
            return fast
        data = read_dump_file(path)
        return extract_dump(data, path, name_rank, end_times=end_times)
    except DumpError as exc:
        return Unreadable(path, str(exc), name_rank)
    except Exception as exc:  # a bug of ours must not sink the other files
        logger.exception("unexpected error while reading %s", path)
        return Unreadable(
            path, f"internal error while reading ({type(exc).__name__}: {exc})", name_rank
        )


def _load_chunk(chunk: Sequence[tuple[str, int | None]], end_times: bool = False,
                columnar: bool = False) -> list[RankDump | Unreadable]:
    # Loading builds millions of short-lived containers and no reference cycles: the
    # cyclic collector would only rescan them (fr_trace disables it for the same reason).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return [load_file(p, r, end_times, columnar) for p, r in chunk]
    finally:
        if enabled:
            gc.enable()


def _total_bytes(files: Sequence[tuple[str, int | None]], enough: int) -> int:
    """The files' size, counted until ``enough`` (unreadable ones count 0)."""
    total = 0
    for path, _ in files:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
        if total >= enough:
            break
    return total


def _default_jobs(files: Sequence[tuple[str, int | None]]) -> int:
    """One reader process per CPU (up to 8) from 64 files, or from 2 files holding 32 MB
    (a few ranks with big rings: 20 000 records a rank is ~3.5 MB); else none."""
    if len(files) < 2 or (len(files) < _PARALLEL_MIN_FILES and
                          _total_bytes(files, _PARALLEL_MIN_BYTES) < _PARALLEL_MIN_BYTES):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 8))


def _chunks(files: Sequence[Any], jobs: int) -> list[Sequence[Any]]:
    """Split ``files`` into work units: big ones first (fewer round trips), then single
    files, so that no worker is left with a long chunk while the others are idle."""
    big = max(1, min(16, len(files) // (jobs * 8)))
    tail = min(len(files), jobs * 4)
    head = len(files) - tail
    out = [files[i:min(i + big, head)] for i in range(0, head, big)]
    return out + [files[i:i + 1] for i in range(head, len(files))]


class _Prefetch:
    """Ask the kernel to read the next files ahead (``posix_fadvise(WILLNEED)``) while
    the workers parse the ones before them, a bounded window at a time: a cold disk or
    a network file system then overlaps with parsing instead of stalling it."""

    def __init__(self, files: Sequence[tuple[str, int | None]], window: int) -> None:
        self.files = files
        self.window = window
        self.next = 0
        self.enabled = hasattr(os, "posix_fadvise")

    def up_to(self, done: int) -> None:
        """Make sure files up to ``done + window`` have been asked for."""
        if not self.enabled:
            return
        stop = min(len(self.files), done + self.window)
        while self.next < stop:
            path = self.files[self.next][0]
            self.next += 1
            try:  # non-blocking: a FIFO planted among the dumps must not stall us
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            except OSError:
                continue  # reading it later reports the problem
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode):
                    # The head only of a huge file: a 50 GB checkpoint named like a
                    # dump (``checkpoint_10000``) is refused after its first bytes.
                    size = min(info.st_size, _PREFETCH_BYTES)
                    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            except OSError:
                self.enabled = False  # a file system without read-ahead: stop asking
            finally:
                os.close(fd)


def _iter_loaded(
    files: Sequence[tuple[str, int | None]], jobs: int, end_times: bool
) -> Iterable[list[RankDump | Unreadable]]:
    if jobs <= 1 or len(files) < 2:
        for item in files:
            yield _load_chunk([item], end_times)
        return
    chunks = _chunks(files, jobs)
    prefetch = _Prefetch([f for chunk in chunks for f in chunk], _PREFETCH_FILES)
    prefetch.up_to(0)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(method)
    done = 0
    yielded: set[Future[Any]] = set()
    pool = ProcessPoolExecutor(jobs, mp_context=ctx)
    try:
        futures = {pool.submit(_load_chunk, chunk, end_times, True): chunk for chunk in chunks}
        for future in as_completed(futures):
            try:
                batch = future.result()
            except BrokenProcessPool:
                break  # a worker died: every unfinished future fails the same way
            except Exception:  # e.g. a result that could not be sent back
                continue  # read again below, alone
            yielded.add(future)
            done += len(batch)
            prefetch.up_to(done)
            yield batch
    finally:  # an interrupted load does not wait for the files still queued
        pool.shutdown(wait=True, cancel_futures=True)
    left = []
    for future, chunk in futures.items():
        if future in yielded:
            continue
        if future.done() and not future.cancelled() and future.exception() is None:
            yield future.result()  # finished before the pool broke
        else:
            left.append(chunk)
    if left:
        logger.warning("a reader process failed; reading its %d files again one by one",
                       sum(map(len, left)))
        for item in (item for chunk in left for item in chunk):
            yield _load_alone(item, end_times, ctx)


def _load_alone(item: tuple[str, int | None], end_times: bool, ctx: Any
                ) -> list[RankDump | Unreadable]:
    """Read one file in a process of its own; report the file if that process dies."""
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        try:
            return pool.submit(_load_chunk, [item], end_times, True).result()
        except BrokenProcessPool:
            return [Unreadable(item[0], "the process reading this file died (killed by the "
                               "system, e.g. for memory, or crashed); the other files were "
                               "analysed", item[1])]
        except Exception as exc:
            return [Unreadable(item[0], f"internal error while reading ({type(exc).__name__}: "
                               f"{exc})", item[1])]


def load_dumps(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    prefix: str | None = None,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    end_times: bool = False,
    world_size: int | None = None,
) -> LoadResult:
    """Load every rank's dump under ``path`` (a folder, one file, or a list of files).

    Files of other jobs than the newest (an earlier attempt of a restarted job, a reused
    folder; :mod:`.jobs`; ``world_size``: the job's size when the user knows it) are
    set aside in ``LoadResult.other_jobs``, never merged.

    ``jobs`` worker processes read files in parallel (default: one per CPU, up to 8,
    when there are at least 64 files or 32 MB of them). ``progress(done, total)`` is
    called as files are read. Unreadable files are listed in ``LoadResult.unreadable``
    with the reason.
    ``end_times`` keeps each record's completion time too (``RankDump.ends``: 8 bytes
    a record), so that a timeline need not read the files again.
    """
    ignored: list[str] = []
    if isinstance(path, (str, os.PathLike)):
        files, ignored = discover(path, prefix)
        root = os.fspath(path)
    else:
        files = []
        for p in path:
            found, skipped = discover(p, prefix)
            files.extend(found)
            ignored.extend(skipped)
        files.sort()
        root = os.path.commonpath([os.fspath(p) for p in path]) if path else ""
    return load_found(files, ignored, root, jobs=jobs, progress=progress,
                      end_times=end_times, world_size=world_size)


Choose = Callable[[int, list[RankDump]], tuple[RankDump, list[Unreadable]]]
"""Given a rank and every dump of it, the one analyzed and why each other is set aside."""


def load_found(
    files: Sequence[tuple[str, int | None]],
    ignored: Sequence[str],
    root: str,
    *,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    end_times: bool = False,
    world_size: int | None = None,
    refused: Sequence[Unreadable] = (),
    choose: Choose | None = None,
) -> LoadResult:
    """Steps 2-5 of :func:`load_dumps` on files already found (:func:`discover`).

    ``refused``: files reported before reading (archive members that were not
    unpacked), treated like unreadable ones. ``choose`` picks among several dumps of one
    rank (default :func:`choose_newest`). ``root`` is only recorded, never read.
    """
    ignored = list(ignored)
    n_jobs = _default_jobs(files) if jobs is None else max(1, int(jobs))
    table = SigTable()
    unreadable: list[Unreadable] = list(refused)
    by_rank: dict[int, list[RankDump]] = {}
    rank_lists: dict[Any, Any] = {}
    done = 0
    if progress:
        progress(0, len(files))
    loaded: list[RankDump] = []
    for batch in _iter_loaded(files, n_jobs, end_times):
        for item in batch:
            if isinstance(item, Unreadable):
                unreadable.append(item)
            else:
                loaded.append(item)
        done += len(batch)
        if progress:
            progress(done, len(files))
    loaded, other_jobs = split_jobs(loaded, world_size)
    for item in loaded:
        finish_sigs(item, table)
        _share_ranks(item, rank_lists)
        by_rank.setdefault(item.rank, []).append(item)
        if item.problems:
            unreadable.append(Unreadable(item.path, _partial_text(item), item.rank))
    dumps: dict[int, RankDump] = {}
    for rank in sorted(by_rank):
        dumps[rank], aside = (choose or choose_newest)(rank, by_rank[rank])
        unreadable.extend(aside)
    _share_columns(dumps)
    table.columns.clear()
    stems = {_stem(d.path) for d in dumps.values()}
    unreadable = [u if u.rank is None or not stems or _stem(u.file) in stems
                  or u.rank in dumps else Unreadable(u.file, u.error, None)
                  for u in unreadable]
    unreadable.sort(key=lambda u: u.file)
    fatal, ignored = read_fatal_logs(ignored)
    ignored = [p for p in ignored if os.path.basename(p) != "watch.json"]  # commscope watch's
    return LoadResult(dumps=dumps, unreadable=unreadable, sigs=table, ignored=ignored, root=root,
                      fatal=fatal, other_jobs=sorted(other_jobs, key=lambda u: u.file))


def _share_ranks(dump: RankDump, seen: dict[Any, Any]) -> None:
    """One tuple object per distinct rank list: worker processes send copies, and 4 096
    ranks x the default group's 4 096 ranks would otherwise cost gigabytes. A worker's
    batch carries one object for all its dumps: known objects are found by identity
    (kept alive in ``seen``, so an id is never reused) before hashing 4 096 ranks."""

    def shared(v: tuple[int, ...]) -> tuple[int, ...]:
        hit = seen.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        canonical = seen.setdefault(v, v)
        seen[id(v)] = (v, canonical)
        return canonical

    dump.config = {k: shared(v) for k, v in dump.config.items()}
    if dump.world_hint is not None:
        dump.world_hint = shared(dump.world_hint)


def _partial_text(dump: RankDump) -> str:
    shown = "; ".join(dump.problems[:3])
    more = f" (+{len(dump.problems) - 3} more)" if len(dump.problems) > 3 else ""
    return f"partly used (rank {dump.rank}, {dump.n_entries} records kept): {shown}{more}"


def choose_newest(rank: int, dumps: list[RankDump]) -> tuple[RankDump, list[Unreadable]]:
    """Of several files claiming ``rank`` in one folder: the later dump time, then more
    records, then fewer problems, then the smaller path; the others are duplicates."""
    chosen, *others = sorted(dumps, key=_preference)
    return chosen, [Unreadable(other.path, f"duplicate dump of rank {rank}: kept {chosen.path} "
                               f"({_why_kept(chosen, other)})", rank) for other in others]


def _preference(d: RankDump) -> tuple[Any, ...]:
    return (-(d.dump_time_ns or 0), -d.n_entries, len(d.problems), d.path)


def _why_kept(chosen: RankDump, other: RankDump) -> str:
    if (chosen.dump_time_ns or 0) != (other.dump_time_ns or 0):
        return "its dump is newer"
    if chosen.n_entries != other.n_entries:
        return f"it holds more records: {chosen.n_entries} vs {other.n_entries}"
    return "same content size; the first path in sorted order is kept"


def _share_columns(dumps: dict[int, RankDump]) -> None:
    """Make identical signature/status columns of different ranks one object (memory)."""
    seen: dict[tuple[str, int, bytes], array] = {}
    for d in dumps.values():
        for track in d.tracks.values():
            for name in ("status",):  # sig and mk are shared by finish_sigs already
                col = getattr(track, name)
                if col is None:
                    continue
                key = (name, track.lo, col.tobytes())
                shared = seen.setdefault(key, col)
                if shared is not col:
                    setattr(track, name, shared)
