"""Several inputs (folders, dump files, archives) read as if copied into one folder.

A job on many hosts leaves each host's dumps on its own disk; users bring them back as
folders and archives (``commscope analyze hostA/ hostB.tar.gz hostC.zip``). The answer
must be the one the merged folder would give, and say where each rank came from.

Algorithm (:class:`Inputs`, used as ``with gather(paths) as inputs``):

1. **Check** every path (:func:`check_paths`): it exists and is a folder, a regular file
   (a dump) or an archive by name (:data:`~.archive.ARCHIVE_SUFFIXES`); other archive
   kinds (``.tar.xz``, ``.7z``, ...) are refused with what to do.
2. **Unpack** each archive (:func:`~.archive.unpack`: names, types and sizes checked)
   into a private temporary folder (mode 0700), ``<tmp>/<input number>/<member path>``.
   The archive's folder is the deepest one holding all its files (``hostB/tmp/job/``
   stripped), searched at any depth; refused members are reported under the archive's
   name, with the rank their name gives.
3. **Discover** each input's files as a folder's (:func:`~.load.discover`).
4. **Count a file once**: the same file in two inputs (one inode), or two files of
   different inputs with the same name, size and bytes (sha256), is read once; the copy
   with the first shown path is kept. Within one input nothing changes.
5. **Load** everything as one folder (:func:`~.load.load_found`): other jobs are set
   aside as ever (:mod:`.jobs`). Two different dumps of one rank of the same job: within
   an input the loader's rule; across inputs the first dump of the incident is kept
   (earliest dump time, then more records, then the first shown path), as the recorder
   keeps later dumps aside in ``commscope_later/``, and each other is named with why.
6. **Settle**: paths become what the user can find: ``<archive>/<member>`` for a member;
   the temporary folder is removed when the ``with`` block ends. Each input's
   :class:`InputReport` says which ranks it gave, or why it gave nothing.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from commscope.analyze.model import LoadResult, RankDump, Unreadable
from commscope.analyze.read.archive import ARCHIVE_SUFFIXES, Unpacked, is_archive_name, unpack
from commscope.analyze.read.load import (
    LATER_DIR,
    choose_newest,
    discover,
    load_found,
    rank_in_name,
)
from commscope.analyze.text import plural, rank_list

__all__ = ["InputReport", "Inputs", "Unpacking", "check_paths", "gather"]

logger = logging.getLogger(__name__)

Unpacking = Callable[[str, int, int], None]
"""``unpacking(archive, done, total)``: bytes of the archive read so far."""

_OTHER_ARCHIVES = (".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz", ".tar.zst", ".tzst",
                   ".tar.lz4", ".tar.lzma", ".7z", ".rar", ".bz2", ".xz", ".zst", ".lz4")


def check_paths(paths: Sequence[str]) -> None:
    """Step 1: raise ``FileNotFoundError`` for a missing path, ``ValueError`` for one that
    is neither a folder, a regular file nor an archive this reads."""
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p} does not exist")
        if os.path.isdir(p):
            continue
        if not os.path.isfile(p):  # a FIFO or a device would block or never end
            raise ValueError(f"{p} is neither a folder, a dump file nor an archive "
                             f"({', '.join(ARCHIVE_SUFFIXES)})")
        other = next((s for s in _OTHER_ARCHIVES if p.lower().endswith(s)), None)
        if other and not is_archive_name(p):
            raise ValueError(f"{p}: {other} archives are not read (only "
                             f"{', '.join(ARCHIVE_SUFFIXES)}): unpack it and pass the folder")


@dataclass
class InputReport:
    """What one input gave to the analysis."""

    path: str
    kind: str
    """``folder``, ``file`` or ``archive``."""
    ranks: list[int] = field(default_factory=list)
    """Ranks whose analyzed dump came from this input."""
    found: int = 0
    """Files named like dumps (after counting files once)."""
    identical: int = 0
    """Files also present in another input, counted there."""
    not_used: int = 0
    """Files listed as not used (unreadable, refused, set aside, another job's)."""
    other_jobs: int = 0
    """Of those, files of another job than the one analyzed."""
    ignored: int = 0
    """Other files (no rank number in the name)."""
    error: str | None = None
    """Why the archive could not be read whole."""

    def line(self) -> str:
        """``hostB.tar.gz: ranks 2, 3`` or ``DIR: nothing used: no file named like a dump``."""
        notes = []
        if self.identical:
            notes.append(f"{plural(self.identical, 'file')} also in another input, counted once")
        if self.not_used:
            notes.append(f"{plural(self.not_used, 'file')} not used (listed below)")
        if self.error:
            notes.append(self.error)
        if self.ranks:
            label = "rank" if len(self.ranks) == 1 else "ranks"
            more = f" ({'; '.join(notes)})" if notes else ""
            return f"{self.path}: {label} {rank_list(self.ranks)}{more}"
        if self.error and not self.found:
            why = f"not read: {self.error}"
        elif self.found == self.other_jobs and self.found:
            why = "its dumps belong to another job (listed below)"
        elif self.found or self.not_used:
            why = "its files were not used (listed below, with why)"
        elif self.identical:
            why = f"its {plural(self.identical, 'file')} are also in another input, counted once"
        else:
            others = f" ({plural(self.ignored, 'other file')})" if self.ignored else ""
            why = f"no file named like a dump{others}"
        return f"{self.path}: nothing used: {why}"


@dataclass
class _Input:
    path: str
    kind: str
    files: list[tuple[str, int | None]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    refused: list[Unreadable] = field(default_factory=list)
    error: str | None = None
    identical: int = 0
    """Files dropped as copies of another input's."""
    real: str = ""
    """For an archive: the folder it was unpacked into (shown as ``path``)."""


class Inputs:
    """Several inputs found, unpacked and counted once, loaded as one folder (module doc).

    Made by :func:`gather`; the unpacked files live until :meth:`close`.
    """

    def __init__(self, paths: Sequence[str], prefix: str | None = None,
                 unpacking: Unpacking | None = None) -> None:
        self.paths = [os.fspath(p) for p in paths]
        check_paths(self.paths)
        self.prefix = prefix
        self._tmp: str | None = None
        self._inputs: list[_Input] = []
        self._origin: dict[str, int] = {}
        self.reports: list[InputReport] = []
        """Filled by :meth:`load`."""
        try:
            for k, p in enumerate(self.paths):
                self._inputs.append(self._find(k, p, unpacking))
            self._count_once()
        except BaseException:
            self.close()
            raise

    @property
    def archives(self) -> bool:
        """Whether any input is an archive (its files go when :meth:`close` runs)."""
        return any(i.kind == "archive" for i in self._inputs)

    @property
    def root(self) -> str:
        """The folder the shown paths are relative to (the inputs' common one, or ``""``)."""
        if len(self.paths) == 1:
            return self.paths[0]
        try:
            return os.path.commonpath(self.paths)
        except ValueError:  # absolute and relative paths mixed
            return ""

    def _find(self, k: int, path: str, unpacking: Unpacking | None) -> _Input:
        """Steps 2-3 for one input."""
        if os.path.isdir(path):
            item = _Input(path, "folder")
            item.files, item.ignored = discover(path, self.prefix)
        elif not is_archive_name(path):
            item = _Input(path, "file")
            item.files, item.ignored = discover(path, self.prefix)
        else:
            item = _Input(path, "archive")
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="commscope-analyze-")
            item.real = os.path.join(self._tmp, str(k))
            os.mkdir(item.real, 0o700)
            progress = (lambda done, total: unpacking(path, done, total)) if unpacking else None
            try:
                out = unpack(path, item.real, progress)
            except Exception as exc:  # a bug of ours must not sink the other inputs
                logger.exception("unexpected error while unpacking %s", path)
                out = Unpacked(error=f"internal error while unpacking ({type(exc).__name__}: "
                                     f"{exc})")
            item.error = out.error
            for member, reason in out.refused:
                shown = f"{path}/{member}" if member else path
                rank = rank_in_name(member, self.prefix) if member else None
                item.refused.append(Unreadable(shown, f"archive member refused: {reason}"
                                               if member else reason, rank))
            if out.error:
                item.refused.append(Unreadable(path, out.error, None))
            if out.written:
                root = _archive_root(item.real, out.written)
                item.files, item.ignored = discover(root, self.prefix, max_depth=None)
        for f in [*(f for f, _ in item.files), *item.ignored]:
            self._origin.setdefault(f, k)  # a path given twice is the first input's
        return item

    def _count_once(self) -> None:
        """Step 4: drop the copies, in other inputs, of a file already there."""
        if len(self._inputs) < 2:
            return
        entries = sorted((self.shown(f), k, f) for k, item in enumerate(self._inputs)
                         for f in [*(f for f, _ in item.files), *item.ignored])
        drop: set[tuple[int, str]] = set()
        sizes: dict[str, int] = {}
        by_inode: dict[tuple[int, int], list[tuple[int, str]]] = {}
        by_size: dict[tuple[str, int], list[tuple[int, str]]] = {}
        for _, k, f in entries:
            try:
                info = os.stat(f)
            except OSError:
                continue  # reading it reports the problem
            if stat.S_ISREG(info.st_mode):  # a FIFO is never opened here
                sizes[f] = info.st_size
                by_inode.setdefault((info.st_dev, info.st_ino), []).append((k, f))
        for same in by_inode.values():
            drop.update(_copies(same))
        for _, k, f in entries:
            if f in sizes and (k, f) not in drop:
                by_size.setdefault((os.path.basename(f), sizes[f]), []).append((k, f))
        for group in by_size.values():
            if len({k for k, _ in group}) < 2:
                continue
            by_digest: dict[str, list[tuple[int, str]]] = {}
            for k, f in group:
                digest = _digest(f)
                if digest is not None:
                    by_digest.setdefault(digest, []).append((k, f))
            for same in by_digest.values():
                drop.update(_copies(same))
        for k, item in enumerate(self._inputs):
            before = len(item.files) + len(item.ignored)
            item.files = [(f, r) for f, r in item.files if (k, f) not in drop]
            item.ignored = [f for f in item.ignored if (k, f) not in drop]
            item.identical = before - len(item.files) - len(item.ignored)

    def shown(self, path: str) -> str:
        """The path a user can find: ``<archive>/<member>`` for an unpacked member."""
        if self._tmp is None or not path.startswith(self._tmp + os.sep):
            return path
        k, _, rest = path[len(self._tmp) + 1:].partition(os.sep)
        archive = self._inputs[int(k)].path
        return f"{archive}/{rest.replace(os.sep, '/')}" if rest else archive

    def _shown_text(self, text: str) -> str:
        if self._tmp is None or self._tmp not in text:
            return text
        for item in self._inputs:
            if item.real:
                text = text.replace(item.real + os.sep, item.path + "/")
        return text

    def _choose(self, rank: int, dumps: list[RankDump]) -> tuple[RankDump, list[Unreadable]]:
        """Step 5: within one input the loader's rule; across inputs the first dump."""
        by_input: dict[int, list[RankDump]] = {}
        for d in dumps:
            by_input.setdefault(self._origin.get(d.path, -1), []).append(d)
        firsts: list[RankDump] = []
        aside: list[Unreadable] = []
        for k in sorted(by_input):
            chosen, others = choose_newest(rank, by_input[k])
            firsts.append(chosen)
            aside.extend(others)
        firsts.sort(key=lambda d: (d.dump_time_ns is None, d.dump_time_ns or 0, -d.n_entries,
                                   len(d.problems), self.shown(d.path)))
        chosen, *later = firsts
        for other in later:
            aside.append(Unreadable(other.path, (
                f"another dump of rank {rank} of the same job, in another input: kept "
                f"{self.shown(chosen.path)} ({_why_first(chosen, other)}; the first dump of "
                f"an incident is the one analyzed, as the recorder keeps later ones in "
                f"{LATER_DIR}/)"), rank))
        return chosen, aside

    def load(self, *, jobs: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             end_times: bool = False, world_size: int | None = None) -> LoadResult:
        """Step 5: every input's files loaded as one folder, paths not yet shown (the
        files must stay readable until the analysis is done: :meth:`settle` then)."""
        files = sorted(f for item in self._inputs for f in item.files)
        ignored = sorted(f for item in self._inputs for f in item.ignored)
        refused = [u for item in self._inputs for u in item.refused]
        load = load_found(files, ignored, self.root, jobs=jobs, progress=progress,
                          end_times=end_times, world_size=world_size, refused=refused,
                          choose=self._choose)
        self.reports = self._reports(load)
        return load

    def _reports(self, load: LoadResult) -> list[InputReport]:
        refused_of = {u.file: k for k, item in enumerate(self._inputs) for u in item.refused}

        def origin(path: str) -> int:
            return self._origin.get(path, refused_of.get(path, -1))

        reports = [InputReport(item.path, item.kind, found=len(item.files),
                               identical=item.identical, error=item.error,
                               ignored=len(item.ignored)) for item in self._inputs]
        for rank, d in load.dumps.items():
            k = origin(d.path)
            if k >= 0:
                reports[k].ranks.append(rank)
        for u in load.unreadable:
            k = origin(u.file)
            if k >= 0 and u.file != self._inputs[k].path:  # the archive's own: its error
                reports[k].not_used += 1
        for u in load.other_jobs:
            k = origin(u.file)
            if k >= 0:
                reports[k].not_used += 1
                reports[k].other_jobs += 1
        for r in reports:
            r.ranks.sort()
        return reports

    def settle(self, load: LoadResult) -> None:
        """Step 6: every path in ``load`` as the user can find it (call once the analysis
        no longer reads the files)."""
        if self._tmp is None:
            return
        for d in load.dumps.values():
            d.path = self.shown(d.path)
        load.unreadable = sorted((Unreadable(self.shown(u.file), self._shown_text(u.error),
                                             u.rank) for u in load.unreadable),
                                 key=lambda u: u.file)
        load.other_jobs = sorted((Unreadable(self.shown(u.file), self._shown_text(u.error),
                                             u.rank) for u in load.other_jobs),
                                 key=lambda u: u.file)
        load.ignored = sorted(self.shown(p) for p in load.ignored)
        load.fatal = {r: replace(f, path=self.shown(f.path)) for r, f in load.fatal.items()}

    def close(self) -> None:
        """Remove the unpacked files (nothing else was written)."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


@contextmanager
def gather(paths: Sequence[str | os.PathLike[str]], prefix: str | None = None,
           unpacking: Unpacking | None = None) -> Iterator[Inputs]:
    """Steps 1-4 for ``paths``; the unpacked files are removed when the block ends."""
    inputs = Inputs([os.fspath(p) for p in paths], prefix, unpacking)
    try:
        yield inputs
    finally:
        inputs.close()


def _archive_root(folder: str, written: list[str]) -> str:
    """The deepest folder holding every unpacked file (never a ``commscope_later/``)."""
    parents = [m.rpartition("/")[0] for m in written]
    common = os.path.commonpath(parents) if all(parents) else ""
    parts = [p for p in common.split("/") if p]
    while parts and parts[-1] == LATER_DIR:
        parts.pop()
    return os.path.join(folder, *parts)


def _copies(same: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Of one file's copies ``(input, path)`` (sorted by shown path): those in another
    input than the first copy's (the same path given twice is two inputs' copies)."""
    first = same[0][0]
    return [(k, f) for k, f in same if k != first]


def _digest(path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _why_first(chosen: RankDump, other: RankDump) -> str:
    if chosen.dump_time_ns and other.dump_time_ns and chosen.dump_time_ns != other.dump_time_ns:
        later_s = (other.dump_time_ns - chosen.dump_time_ns) / 1e9
        return f"this one was written {later_s:.3f} s later"
    if chosen.n_entries != other.n_entries:
        return f"it holds more records: {chosen.n_entries} vs {other.n_entries}"
    return "same dump time and size; the first path in sorted order is kept"
