"""The recorder's stack capture: a flat ``[code, offset, code, offset, ...]`` list.

Each entry keeps the code object and instruction offset of the frames that issued
its collective, innermost first; source lines are worked out only when a dump is
written (:func:`commscope.flight.record.entry.line_of`). :func:`capture_stack` is the
small C walk of ``commscope.flight.record._stack`` when it was built with the package (a
C compiler and Python 3.11+), else :func:`capture_stack_py`, which returns the same list.
Set ``COMMSCOPE_NO_C_STACK=1`` to use the Python walk.

A collective issued deep inside FSDP2, DTensor or DDP has only library frames among its
innermost ``max_frames``: :func:`capture_to_user` walks on past them and appends the
innermost :data:`USER_FRAMES` frames that are the user's own (not torch's, not
commscope's, not the standard library's; :func:`is_library`), so every record names the
user's line.

Under ``torch.compile`` a collective runs from code torch generated: inductor's output
module (``c<hash>.py`` in its cache folder) or an FX graph's ``forward``
(``<eval_with_key>.N``), called through dynamo's and AOTAutograd's wrappers from the
user's function (the frame dynamo took over, at its first line). Those generated files
count as library code (:func:`generated_file`), so the walk goes on to the user's
frames; nothing more is done while recording. When a dump is written,
:func:`with_compiled_source` puts before each frame of inductor's output code the frames
of the user's source that line was compiled from (inductor's own line map), marked
``"compiled": True``: the line of the compiled function that issued the collective.
"""

from __future__ import annotations

import bisect
import linecache
import os
import re
import sys
import sysconfig
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = ["capture_stack", "capture_stack_py", "capture_to_user", "is_library",
           "library_file", "generated_file", "is_generated", "with_compiled_source",
           "trim_to_user", "C_STACK", "USER_FRAMES"]

USER_FRAMES = 2
"""User frames kept beyond ``max_frames`` when none was among them."""
_MAX_WALK = 256
"""How far past ``max_frames`` the walk looks for a user frame."""


def capture_stack_py(frame: FrameType | None, limit: int) -> list[Any]:
    """``frame`` and its callers, at most ``limit`` of them, as ``[code, offset, ...]``."""
    frames: list[Any] = []
    push = frames.append
    f = frame
    while f is not None and limit > 0:
        push(f.f_code)
        push(f.f_lasti)
        f = f.f_back
        limit -= 1
    return frames


def _load_c() -> Callable[[FrameType | None, int], list[Any]] | None:
    if os.environ.get("COMMSCOPE_NO_C_STACK"):
        return None
    try:
        from commscope.flight.record import _stack
    except ImportError:
        return None
    return _stack.capture  # type: ignore[no-any-return]


_c_capture = _load_c()

C_STACK = _c_capture is not None
"""Whether the C stack walk is in use."""

capture_stack: Callable[[FrameType | None, int], list[Any]] = _c_capture or capture_stack_py
"""The stack walk in use: the C one when built, else :func:`capture_stack_py`."""


def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(torch's and commscope's folders, the standard library's)."""
    here = os.path.abspath(__file__)
    packages = [os.path.dirname(os.path.dirname(os.path.dirname(here))) + os.sep]
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        packages.append(os.path.dirname(os.path.abspath(torch_file)) + os.sep)
    paths = sysconfig.get_paths()
    stdlib = [os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths]
    return tuple(dict.fromkeys(packages)), tuple(dict.fromkeys(stdlib))


_ROOTS: tuple[tuple[str, ...], tuple[str, ...]] | None = None
_MARKERS = ("<frozen ", "typing_extensions", "c10d_logger")
_GENERATED_MARKERS = ("<eval_with_key", "torchinductor_")
_INDUCTOR_OUTPUT = re.compile(r"[/\\][a-z0-9]{2}[/\\]c[a-z0-9]{51}\.py$")
"""Inductor's output modules: ``<cache folder>/<2 chars>/c<51 chars of hash>.py``."""


def generated_file(filename: str) -> bool:
    """Whether ``filename`` is code that ``torch.compile`` generated: an FX graph's
    ``forward`` (``<eval_with_key>.N``) or inductor's output code (a ``c<hash>.py``
    module of its cache folder, by default under ``/tmp/torchinductor_<user>/``)."""
    return (any(m in filename for m in _GENERATED_MARKERS)
            or _INDUCTOR_OUTPUT.search(filename) is not None)


def library_file(filename: str) -> bool:
    """Whether ``filename`` is torch's, commscope's or the standard library's, or code
    torch generated (:func:`generated_file`): not the user's program. Other installed
    packages count as the user's: a Lightning or accelerate line is closer to the user
    than torch's."""
    global _ROOTS
    if _ROOTS is None:
        _ROOTS = _library_roots()
    if any(m in filename for m in _MARKERS) or generated_file(filename):
        return True
    packages, stdlib = _ROOTS
    path = filename if os.path.isabs(filename) else os.path.abspath(filename)
    if path.startswith(packages):
        return True
    if "site-packages" in path or "dist-packages" in path:
        return False
    return path.startswith(stdlib)


_LIBRARY_CODE: dict[int, tuple[CodeType, bool]] = {}


def is_library(code: CodeType) -> bool:
    """:func:`library_file` of a code object's file, remembered per code object."""
    hit = _LIBRARY_CODE.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    flag = library_file(code.co_filename)
    if len(_LIBRARY_CODE) > 65536:
        _LIBRARY_CODE.clear()
    _LIBRARY_CODE[id(code)] = (code, flag)  # keeps the code alive: its id stays its own
    return flag


def capture_to_user(frame: FrameType | None, limit: int) -> list[Any]:
    """:func:`capture_stack`, plus the innermost user frames beyond ``limit`` when the
    first ``limit`` frames are all library code (see module doc)."""
    frames = capture_stack(frame, limit)
    if len(frames) < 2 * limit or limit <= 0:
        return frames  # the whole stack is there
    for i in range(0, len(frames), 2):
        if not is_library(frames[i]):
            return frames
    f = frame
    for _ in range(limit):
        f = f.f_back if f is not None else None
    extra: list[Any] = []
    walked = users = 0
    while f is not None and walked < _MAX_WALK:
        code = f.f_code
        if not is_library(code):
            extra.append(code)
            extra.append(f.f_lasti)
            users += 1
            if users >= USER_FRAMES:
                break
        elif is_generated(code):  # kept: the dump names the user's line it was compiled from
            extra.append(code)
            extra.append(f.f_lasti)
        f = f.f_back
        walked += 1
    return frames + extra if extra else frames


def trim_to_user(frames: Any, n: int) -> list[Any]:
    """The innermost ``n`` frames of a flat ``[code, offset, ...]`` stack, plus its
    innermost :data:`USER_FRAMES` user frames (and the frames of code torch.compile
    generated before them) when none of those ``n`` is the user's."""
    head = list(frames[: 2 * n])
    if any(not is_library(head[i]) for i in range(0, len(head), 2)):
        return head
    extra: list[Any] = []
    users = 0
    for i in range(2 * n, len(frames) - 1, 2):
        if not is_library(frames[i]):
            extra += [frames[i], frames[i + 1]]
            users += 1
            if users >= USER_FRAMES:
                break
        elif is_generated(frames[i]):
            extra += [frames[i], frames[i + 1]]
    return head + extra


# --------------------------------------------------------------------------- torch.compile

_TRACE_FRAME = re.compile(r'File "(.+)", line (\d+), in (.+)\n(?:[ \t]+(?!File ")(\S.*)\n)?')
"""One frame of a formatted stack trace, and the source line shown under it."""
_RESUMED = re.compile(r"^torch_dynamo_resume_in_(.+)_at_\d+$")
"""The name dynamo gives the rest of a function after a graph break."""
_MAX_CODE_CHARS = 160
"""As in the dump's thread stacks (``commscope.flight.out.threads``)."""
_SOURCES: dict[tuple[str, int], tuple[tuple[str, int, str], ...] | None] = {}
_GENERATED: dict[str, bool] = {}


def _is_generated(filename: Any) -> bool:
    hit = _GENERATED.get(filename)
    if hit is None:
        hit = isinstance(filename, str) and generated_file(filename)
        if len(_GENERATED) > 65536:
            _GENERATED.clear()
        _GENERATED[filename] = hit
    return hit


def is_generated(code: CodeType) -> bool:
    """:func:`generated_file` of a code object's file, remembered per file name."""
    return _is_generated(code.co_filename)


def _inductor_source(filename: str, line: int) -> tuple[tuple[str, int, str], ...] | None:
    """The user's frames (innermost first) that line ``line`` of inductor's output module
    ``filename`` was compiled from, from the line map inductor keeps for the modules it
    loaded in this process; ``None`` when there is none, or when the source it quotes is
    no longer the file's (a compile-cache hit made from other or older source)."""
    key = (filename, line)
    if key in _SOURCES:
        return _SOURCES[key]
    found: tuple[tuple[str, int, str], ...] | None = None
    codecache = sys.modules.get("torch._inductor.codecache")
    linemaps = getattr(getattr(codecache, "PyCodeCache", None), "linemaps", None)
    try:
        starts, traces = linemaps.get(filename) or ((), ())  # type: ignore[union-attr]
        at = bisect.bisect_right(starts, line)
        trace = traces[at - 1] if at > 0 else None
    except Exception:  # another torch's layout: no source, only the skipping
        trace = None
    if isinstance(trace, str):
        frames: list[tuple[str, int, str]] = []
        for m in _TRACE_FRAME.finditer(trace):
            path, number, name, text = m.group(1), int(m.group(2)), m.group(3), m.group(4)
            if text is not None and linecache.getline(path, number).strip() != text.strip():
                frames = []
                break
            frames.append((path, number, name))
        found = tuple(reversed(frames)) or None
    if len(_SOURCES) > 4096:
        _SOURCES.clear()
    _SOURCES[key] = found
    return found


def _compiled_from(frames: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    """Frame dicts of the user's source that generated frame ``frames[at]`` ran, when the
    function they start from is on the stack outside it (see :func:`with_compiled_source`)."""
    gen = frames[at]
    line = gen.get("line")
    if type(line) is not int or not isinstance(gen.get("filename"), str):
        return []
    source = _inductor_source(gen["filename"], line)
    if not source:
        return []
    top_file, _, top_name = source[-1]
    for outer in frames[at + 1:]:
        filename = outer.get("filename")
        if not isinstance(filename, str) or _is_generated(filename):
            continue
        if filename == top_file and outer.get("name") == top_name:
            break  # the frame dynamo took over: the map is this function's
        if not library_file(filename):
            return []  # the user's frame outside is another function: a stale map
    else:
        return []
    out: list[dict[str, Any]] = []
    for path, number, name in source:
        resumed = _RESUMED.match(name)  # the rest of a function after a graph break
        values: dict[str, Any] = {
            "name": resumed.group(1) if resumed else name, "filename": path, "line": number}
        if "code" in gen:
            values["code"] = linecache.getline(path, number).strip()[:_MAX_CODE_CHARS]
        frame = {k: values[k] for k in gen if k in values}  # the keys in the dump's order
        frame["compiled"] = True
        out.append(frame)
    return out


def with_compiled_source(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``frames`` (frame dicts, innermost first), with the frames of the user's source
    put before each frame of inductor's output code that ran it (see module doc).

    The user's frames come from the line map inductor keeps per output module; they are
    used only when the function they start from (the one ``torch.compile`` compiled, or
    its part after a graph break) is the frame dynamo took over outside the generated
    one, and when the source lines they quote are still the file's: a compile cache hit
    can hand a graph compiled from another function or older source. A stack without
    generated code is returned as it is."""
    known = _GENERATED
    for frame in frames:  # (a plain loop: this runs for every record of every dump)
        filename = frame.get("filename")
        hit = known.get(filename)
        if hit or (hit is None and _is_generated(filename)):
            break
    else:
        return frames
    out: list[dict[str, Any]] = []
    for i, frame in enumerate(frames):
        if _is_generated(frame.get("filename")):
            out.extend(_compiled_from(frames, i))
        out.append(frame)
    return out
