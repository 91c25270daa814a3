"""Read the fatal logs the recorder leaves when a rank dies in C.

Named ``.commscope-fatal-<rank>.log`` (``.<name><rank>.fatal`` before: still read).

Python's faulthandler writes them (see :mod:`commscope.flight.out.fatal`): a first line
such as ``Fatal Python error: Aborted``, then one block per thread::

    Thread 0x00007fbf8e3c8b80 (most recent call first):
      File "/home/user/train.py", line 213 in step

Algorithm (:func:`read_fatal_logs`):

1. Among the files discovery ignored, take those named as above and
   non-empty; read at most :data:`MAX_BYTES` of each as text (undecodable bytes
   replaced): a file is never executed or unpickled.
2. The error is the first line that starts with ``Fatal Python error`` (else the first
   non-empty line).
3. The main thread is the block whose outermost frame is not the ``threading`` module's
   bootstrap (a thread started by ``threading`` always ends there); with several such
   blocks, the ``Current thread`` one, else the first.
4. A file that does not parse gives an error text and no frames, never an exception.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from commscope.analyze.model import FatalLog

__all__ = ["read_fatal_logs", "parse_fatal", "MAX_BYTES"]

MAX_BYTES = 256 << 10
_NAME = re.compile(r"(?:^\.commscope-fatal-(?P<rank>\d+)\.log|(?P<old>\d+)\.fatal)$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>\S.*)$')
_BLOCK = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+")


def parse_fatal(text: str, rank: int, path: str) -> FatalLog:
    """One fatal file's content (see module doc, steps 2-4)."""
    lines = text.splitlines()
    error = next((ln.strip() for ln in lines if ln.startswith("Fatal Python error")),
                 next((ln.strip() for ln in lines if ln.strip()), "unknown fatal error"))
    blocks: list[tuple[bool, list[tuple[str, str, int]]]] = []
    for ln in lines:
        m = _BLOCK.match(ln)
        if m:
            blocks.append((m.group("current") == "Current thread", []))
            continue
        f = _FRAME.match(ln)
        if f and blocks:
            blocks[-1][1].append((f.group("name").strip(), f.group("file"), int(f.group("line"))))
    if not blocks:  # a single-thread report starts with "Stack (most recent call first)"
        frames = [(f.group("name").strip(), f.group("file"), int(f.group("line")))
                  for f in map(_FRAME.match, lines) if f]
        blocks = [(True, frames)] if frames else []
    mains = [b for b in blocks if b[1] and not _started_by_threading(b[1])]
    pick = next((b for b in mains if b[0]), mains[0] if mains else (blocks[0] if blocks else None))
    return FatalLog(rank=rank, path=path, error=error[:300],
                    frames=tuple(pick[1][:64]) if pick else ())


def _started_by_threading(frames: list[tuple[str, str, int]]) -> bool:
    name, filename, _ = frames[-1]
    return name == "_bootstrap" and os.path.basename(filename) == "threading.py"


def read_fatal_logs(paths: Iterable[str]) -> tuple[dict[int, FatalLog], list[str]]:
    """Step 1: the fatal logs among ``paths`` by rank, and the paths that are not one."""
    logs: dict[int, FatalLog] = {}
    rest: list[str] = []
    for path in paths:
        m = _NAME.search(os.path.basename(path))
        if not m:
            rest.append(path)
            continue
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_BYTES)
        except OSError:
            rest.append(path)
            continue
        if not raw.strip():
            continue  # armed but never written: the rank did not die in C
        rank = int(m.group("rank") or m.group("old"))
        log = parse_fatal(raw.decode("utf-8", "replace"), rank, path)
        if rank not in logs or path < logs[rank].path:
            logs[rank] = log
    return logs, rest
