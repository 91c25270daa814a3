"""Unpack one ``.tar``, ``.tar.gz``/``.tgz`` or ``.zip`` of dumps safely, into a folder of ours.

Hosts' dump folders arrive packed (``scp``, a scheduler's collection step). An archive is
input from anywhere, so nothing in it is trusted: not its names, not its sizes, not its
member types. Nothing is extracted by the archive modules themselves (no
``tarfile.extractall``): every member is read as bytes and written by this module, to a
path it checked, under a private folder the caller made.

Algorithm (:func:`unpack`):

1. **Kind** from the first bytes, never from the name: gzip (``1f 8b``, a tar inside),
   zip (``PK``, or a ``.zip`` name), else tar. Anything else is "not an archive".
2. **Members in order.** A tar is streamed (never seeked, so a ``.tar.gz`` is
   decompressed once); a zip's central directory is sized from its end record before
   Python parses it, so a forged directory of millions of entries is refused cheaply.
   At most :data:`MAX_MEMBERS` members; past it reading stops.
3. **Names** (:func:`member_parts`): relative, no ``..``, no backslash or drive letter, no
   control characters (they would reach the terminal), UTF-8, at most 32 levels, each
   part at most 255 bytes. A refused name is reported and its data skipped.
4. **Types**: regular files only; folders are implied by the paths (and macOS Finder's
   ``__MACOSX/`` metadata is passed over). Symbolic and hard
   links, devices, FIFOs and sockets are refused (links are never followed), so are
   encrypted zip members.
5. **Bytes** are counted as decompression actually produces them, never taken from a
   header: a member past :data:`MAX_MEMBER_BYTES` is refused and its partial file
   removed; an archive whose decompressed stream (tar: headers and skipped data
   included) passes :data:`MAX_TOTAL_BYTES` stops there (a zip or gzip bomb).
6. **Writing**: ``dest/<checked path>``, created exclusively (``O_EXCL``, no
   symlink followed), mode 0600; a second member with the same path is refused, the
   first kept.
7. **Damage**: a corrupt or truncated archive keeps the members read whole before the
   damage; the member being read is dropped; the archive is reported with the reason.

Each refused member and the archive's own problem come back as ``(name, reason)`` in
:class:`Unpacked`; nothing here raises for bad content.
"""

from __future__ import annotations

import gzip
import logging
import os
import stat
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = [
    "ARCHIVE_SUFFIXES",
    "MAX_MEMBERS",
    "MAX_MEMBER_BYTES",
    "MAX_TOTAL_BYTES",
    "Unpacked",
    "is_archive_name",
    "member_parts",
    "shown_name",
    "unpack",
]

logger = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
"""The archive kinds read (by name; the content decides how)."""
MAX_MEMBERS = 100_000
"""Members read from one archive (a 4 096-rank job with later dumps and fatal logs is
~12 000)."""
MAX_MEMBER_BYTES = 1 << 30
"""Bytes one member may hold once decompressed (a 20 000-record dump is ~5 MB)."""
MAX_TOTAL_BYTES = 16 << 30
"""Decompressed bytes read from one archive, everything counted (a zip or gzip bomb)."""
_MAX_PARTS = 32
_CHUNK = 1 << 20
_CD_BYTES_PER_MEMBER = 1024
"""A zip central directory larger than this per allowed member is refused unparsed."""
_PROGRESS_EVERY = 64 << 20


@dataclass
class Unpacked:
    """What :func:`unpack` wrote and what it refused."""

    written: list[str] = field(default_factory=list)
    """Checked member paths written under ``dest`` (``/``-joined, relative)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(member path as shown, or ``""`` for a name itself refused; reason)."""
    error: str | None = None
    """Why the archive could not be read, or stopped early (members before it are kept)."""


class _TooMuch(Exception):
    """The archive's decompressed bytes passed :data:`MAX_TOTAL_BYTES`."""


class _WriteFailed(Exception):
    """Writing into the destination folder failed (a full disk): stops the archive."""


def is_archive_name(path: str | os.PathLike[str]) -> bool:
    """Whether the name ends in one of :data:`ARCHIVE_SUFFIXES` (any case)."""
    return os.fspath(path).lower().endswith(ARCHIVE_SUFFIXES)


def shown_name(name: str) -> str:
    """A member name safe to print: control and unprintable characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def member_parts(name: str) -> tuple[str, ...] | str:
    """The checked parts of a member's path, or why the name is refused (step 3)."""
    if name.startswith("/"):
        return "an absolute path: refused (it would name a file outside the archive's folder)"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "a path with '..': refused (it would name a file outside the archive's folder)"
    if "\\" in name or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        return "a Windows path (a backslash or a drive letter): refused"
    if any(not c.isprintable() for c in name):
        return "a name with control or unprintable characters: refused"
    if not parts:
        return "an empty name: refused"
    if len(parts) > _MAX_PARTS:
        return f"{len(parts)} folders deep (at most {_MAX_PARTS}): refused"
    try:
        longest = max(len(p.encode("utf-8")) for p in parts)
    except UnicodeEncodeError:
        return "a name that is not UTF-8: refused"
    if longest > 255:
        return "a name part longer than 255 bytes: refused"
    return tuple(parts)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


class _Capped:
    """A read-only stream that counts what it hands out and stops past ``limit``."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        """Read like the wrapped stream; raise :class:`_TooMuch` past the limit."""
        if n is None or n < 0:
            n = self.limit + 1 - self.count
        data = self.stream.read(max(0, min(n, self.limit + 1 - self.count)))
        self.count += len(data)
        if self.count > self.limit:
            raise _TooMuch()
        return data


class _Writer:
    """Writes members under ``dest``, counting bytes against both caps (steps 5-6)."""

    def __init__(self, dest: str, out: Unpacked, progress: Callable[[], None]) -> None:
        self.dest = dest
        self.out = out
        self.total = 0
        self.progress = progress
        self.next_report = _PROGRESS_EVERY

    def write(self, parts: tuple[str, ...], src: IO[bytes]) -> str | None:
        """Copy ``src`` to ``dest/parts``; return why it was refused, or ``None``."""
        target = os.path.join(self.dest, *parts)
        try:
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            return ("a second member with this path (or a file where the archive also has a "
                    "folder): the first one is used")
        except OSError as exc:
            raise _WriteFailed(exc.strerror or str(exc)) from None
        size = 0
        done = False
        try:
            with os.fdopen(fd, "wb") as f:
                while True:
                    chunk = src.read(min(_CHUNK, MAX_MEMBER_BYTES + 1 - size))
                    if not chunk:
                        break
                    size += len(chunk)
                    self.total += len(chunk)
                    if size > MAX_MEMBER_BYTES:
                        return (f"more than {_size(MAX_MEMBER_BYTES)} once decompressed: "
                                "refused (the limit of one member)")
                    if self.total > MAX_TOTAL_BYTES:
                        raise _TooMuch()
                    try:
                        f.write(chunk)
                    except OSError as exc:
                        raise _WriteFailed(exc.strerror or str(exc)) from None
                    if self.total >= self.next_report:
                        self.next_report += _PROGRESS_EVERY
                        self.progress()
            done = True
        finally:
            if not done:
                os.unlink(target)
        self.out.written.append("/".join(parts))
        return None


def _kind(head: bytes, path: str) -> str:
    if head[:2] == b"\x1f\x8b":
        return "tar.gz"
    if head[:2] == b"PK" or path.lower().endswith(".zip"):
        return "zip"
    return "tar"


def unpack(path: str, dest: str,
           progress: Callable[[int, int], None] | None = None) -> Unpacked:
    """Unpack the archive ``path`` into the existing private folder ``dest`` (module doc).

    ``progress(done, total)`` follows the archive's own bytes read. Never raises for bad
    content: problems are in the returned :class:`Unpacked`.
    """
    out = Unpacked()
    try:
        total = os.path.getsize(path)
        raw = open(path, "rb")  # noqa: SIM115 - closed below, after every exit path
    except OSError as exc:
        out.error = f"cannot read: {exc.strerror or exc}"
        return out

    def report() -> None:
        if progress is not None:
            try:
                progress(min(raw.tell(), total), total)
            except (OSError, ValueError):
                pass

    writer = _Writer(dest, out, report)
    try:
        report()
        head = raw.read(512)
        raw.seek(0)
        if not head:
            out.error = "empty file (0 bytes): not an archive"
        elif _kind(head, path) == "zip":
            _unpack_zip(raw, writer, out)
        else:
            _unpack_tar(raw, head, writer, out)
    except _WriteFailed as exc:
        out.error = (f"cannot unpack into the temporary folder ({exc}): the members before "
                     "are used; TMPDIR chooses where it is")
    finally:
        if progress is not None:
            progress(total, total)
        raw.close()
    return out


def _refuse(out: Unpacked, name: str, reason: str) -> None:
    parts = member_parts(name)
    if isinstance(parts, tuple):
        out.refused.append(("/".join(parts), reason))
    else:
        out.refused.append(("", f"member '{shown_name(name)}': {reason}"))


def _stopped(out: Unpacked, what: str) -> str:
    kept = len(out.written)
    if not kept:
        return f"{what}; no member was read whole before it"
    return f"{what}; the {kept} member{'s' if kept != 1 else ''} read whole before it are used"


def _unpack_tar(raw: IO[bytes], head: bytes, writer: _Writer, out: Unpacked) -> None:
    gz = head[:2] == b"\x1f\x8b"
    stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    capped = _Capped(stream, MAX_TOTAL_BYTES)
    current = ""
    count = 0
    try:
        with tarfile.open(fileobj=capped, mode="r|") as tf:  # type: ignore[call-overload]
            for info in tf:
                count += 1
                if count > MAX_MEMBERS:
                    out.error = _stopped(out, f"more than {MAX_MEMBERS} members: reading "
                                         "stopped there")
                    return
                current = info.name
                reason = _tar_refusal(info)
                if reason == _SKIP:
                    continue
                if reason is None:
                    parts = member_parts(info.name)
                    assert isinstance(parts, tuple)
                    src = tf.extractfile(info)
                    reason = writer.write(parts, src) if src is not None else None
                if reason is not None:
                    _refuse(out, info.name, reason)
                current = ""
                writer.progress()
    except _TooMuch:
        out.error = _stopped(out, f"more than {_size(MAX_TOTAL_BYTES)} once decompressed "
                             "(a decompression bomb?): reading stopped there")
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error, OSError,
            UnicodeError, ValueError) as exc:
        at = f" in member '{shown_name(current)}'" if current else ""
        if count == 0 and not isinstance(exc, EOFError):
            what = "gzip data holding no tar archive" if gz else "not a tar, gzip or zip archive"
            out.error = f"{what} (named like {_named(raw)}): {_text(exc)}"
        elif isinstance(exc, EOFError) or "unexpected end" in str(exc):
            out.error = _stopped(out, f"truncated archive (it ends early{at})")
        else:
            out.error = _stopped(out, f"corrupt archive{at} ({_text(exc)})")


def _named(raw: IO[bytes]) -> str:
    name = os.fspath(getattr(raw, "name", ""))
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return f"a {suffix} file"
    return "an archive"


def _text(exc: BaseException) -> str:
    return shown_name(str(exc) or type(exc).__name__)[:200]


def _tar_refusal(info: tarfile.TarInfo) -> str | None:
    """Why this tar member is not written, or ``None`` (steps 3-4; folders: ``_SKIP``)."""
    if info.isdir() or _finder_metadata(info.name):
        return _SKIP  # written by nobody: its files' own paths are checked
    parts = member_parts(info.name)
    if isinstance(parts, str):
        return parts
    if info.issym():
        return f"a symbolic link (to '{shown_name(info.linkname)}'): links are never followed"
    if info.islnk():
        return f"a hard link (to '{shown_name(info.linkname)}'): links are never followed"
    if info.ischr() or info.isblk():
        return "a device file: only regular files are read"
    if info.isfifo():
        return "a FIFO: only regular files are read"
    if not info.isreg():
        return f"not a regular file (tar type {info.type!r}): only regular files are read"
    if info.size > MAX_MEMBER_BYTES:
        return (f"more than {_size(MAX_MEMBER_BYTES)} ({_size(info.size)} by its header): "
                "refused (the limit of one member)")
    return None


_SKIP = "folder"
"""Folders are implied by their files' paths: nothing to write, nothing to report."""


def _finder_metadata(name: str) -> bool:
    """The ``__MACOSX/`` copies (``._rank_0``) in a zip the macOS Finder made: never dumps."""
    return name.startswith("__MACOSX/")


def _zip_directory(raw: IO[bytes]) -> tuple[int, int] | None:
    """(members, bytes) of a zip's central directory as its end record says, or ``None``
    when the record is not found (zipfile then says what is wrong)."""
    raw.seek(0, os.SEEK_END)
    size = raw.tell()
    tail_len = min(size, 22 + 65535)
    raw.seek(size - tail_len)
    tail = raw.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        return None
    _, _, _, _, members, cd_size, _, _ = struct.unpack("<4s4H2LH", tail[at:at + 22])
    if (members == 0xFFFF or cd_size == 0xFFFFFFFF) and at >= 20:
        loc = tail[at - 20:at]
        if loc[:4] == b"PK\x06\x07":
            offset = struct.unpack("<Q", loc[8:16])[0]
            if offset + 56 <= size:
                raw.seek(offset)
                rec = raw.read(56)
                if rec[:4] == b"PK\x06\x06":
                    members, cd_size = struct.unpack("<2Q", rec[32:48])
    return members, cd_size


def _unpack_zip(raw: IO[bytes], writer: _Writer, out: Unpacked) -> None:
    try:
        directory = _zip_directory(raw)
        raw.seek(0)
        if directory is not None and (directory[0] > MAX_MEMBERS or directory[1] >
                                      MAX_MEMBERS * _CD_BYTES_PER_MEMBER):
            out.error = (f"its directory lists {directory[0]} members in "
                         f"{_size(directory[1])} (at most {MAX_MEMBERS} are read): refused")
            return
        zf = zipfile.ZipFile(raw)  # closed below; ``raw`` stays the caller's
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error,
            NotImplementedError, UnicodeError) as exc:
        out.error = (f"not a zip archive, or a truncated one (a zip's directory is at its "
                     f"end): {_text(exc)}")
        return
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        out.error = f"more than {MAX_MEMBERS} members: the first {MAX_MEMBERS} are read"
        infos = infos[:MAX_MEMBERS]
    with zf:
        _zip_members(zf, infos, writer, out)


def _zip_members(zf: zipfile.ZipFile, infos: list[zipfile.ZipInfo], writer: _Writer,
                 out: Unpacked) -> None:
    try:
        for info in infos:
            reason = _zip_refusal(info)
            if reason == _SKIP:
                continue
            if reason is None:
                parts = member_parts(info.filename)
                assert isinstance(parts, tuple)
                try:
                    with zf.open(info) as src:
                        reason = writer.write(parts, src)
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError,
                        RuntimeError) as exc:
                    if isinstance(exc, EOFError):
                        reason = "truncated (its compressed data ends early)"
                    else:
                        reason = f"corrupt ({_text(exc)})"
                except NotImplementedError as exc:
                    reason = f"compressed with a method Python cannot read ({_text(exc)})"
            if reason is not None:
                _refuse(out, info.filename, reason)
            writer.progress()
    except _TooMuch:
        out.error = _stopped(out, f"more than {_size(MAX_TOTAL_BYTES)} once decompressed "
                             "(a decompression bomb?): reading stopped there")


def _zip_refusal(info: zipfile.ZipInfo) -> str | None:
    """Why this zip member is not written, or ``None`` (steps 3-4; folders: ``_SKIP``)."""
    mode = info.external_attr >> 16 if info.create_system == 3 else 0
    if info.is_dir() or stat.S_ISDIR(mode) or _finder_metadata(info.filename):
        return _SKIP  # written by nobody: its files' own paths are checked
    parts = member_parts(info.filename)
    if isinstance(parts, str):
        return parts
    if stat.S_ISLNK(mode):
        return "a symbolic link: links are never followed"
    if mode and stat.S_IFMT(mode) and not stat.S_ISREG(mode):
        return "a device, FIFO or socket: only regular files are read"
    if info.flag_bits & 0x1:
        return "encrypted: cannot be read without its password"
    return None
