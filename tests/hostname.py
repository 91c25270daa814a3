"""Ranks with hostnames of their own: a forked rank enters a UTS namespace and renames
its host, so one machine's gloo ranks genuinely run under different hostnames (root
only; tests skip, saying why, elsewhere). The simulated hosts of ``tests/hosts/`` go
further (own ``/tmp``, own pid namespace); this is the cheap per-rank version."""

from __future__ import annotations

import ctypes
import functools
import os
import socket

__all__ = ["LO", "why_no_hostnames", "become"]

_CLONE_NEWUTS = 0x04000000
LO = {"GLOO_SOCKET_IFNAME": "lo"}
"""Loopback gloo: the renamed hosts do not resolve."""


@functools.cache
def why_no_hostnames() -> str:
    """Why ranks cannot get hostnames of their own here ("" when they can)."""
    if os.geteuid() != 0:
        return "a hostname per rank needs root (a UTS namespace per rank)"
    pid = os.fork()
    if pid == 0:
        ok = ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWUTS) == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return "" if os.waitstatus_to_exitcode(status) == 0 else "unshare(CLONE_NEWUTS) refused"


def become(host: str) -> None:
    """This process runs on ``host`` from now on (a UTS namespace of its own)."""
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWUTS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUTS)")
    socket.sethostname(host)
