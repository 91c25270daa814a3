"""Where a running job is: its store's address and token, from ``--store`` or the watch
file ``commscope run`` writes, and whether anything still listens there.

Nothing here imports torch: a watch file left by a job that has ended is told apart in
a few milliseconds (one refused connection), with none of torch's client retries and
their log lines.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

__all__ = ["WatchError", "Address", "parse_address", "read_watch_file", "resolve_address",
           "reachable_host", "check_listening", "DEFAULT_WATCH_FILE"]

DEFAULT_WATCH_FILE = os.path.join("commscope_traces", "watch.json")


class WatchError(Exception):
    """Watching cannot go on; the message says why in one sentence."""


@dataclass(frozen=True)
class Address:
    """Where a job's store is and which token opens its records."""

    host: str
    port: int
    token: str = ""
    world_size: int | None = None
    dump_prefix: str | None = None
    source: str = ""
    """Where the address came from (``--store`` or the watch file's path)."""

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str, token: str = "") -> Address:
    """``HOST:PORT`` → :class:`Address`; raises :class:`WatchError` for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WatchError(f"--store must be HOST:PORT (e.g. 127.0.0.1:29500), got {text!r}")
    return Address(host=host.strip("[]"), port=int(port), token=token, source="--store")


def read_watch_file(path: str) -> Address:
    """The address, token and world size a job's rank 0 wrote (see module doc)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise WatchError(
            f"no watch file at {path} yet: a job started with `commscope run` writes it once "
            "its ranks are up, so a job still starting (imports, rendezvous) has none; try "
            "again in a few seconds, or give --store HOST:PORT") from None
    except (OSError, ValueError) as exc:
        raise WatchError(f"cannot read the watch file {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("store"), str):
        raise WatchError(f"{path} is not a commscope watch file (no 'store' address)")
    addr = parse_address(data["store"], str(data.get("token") or ""))
    world = data.get("world_size")
    prefix = data.get("dump_prefix")
    return Address(host=addr.host, port=addr.port, token=addr.token,
                   world_size=world if type(world) is int and world > 0 else None,
                   dump_prefix=prefix if isinstance(prefix, str) else None, source=path)


def reachable_host(host: str, port: int, probe_s: float = 1.0) -> str | None:
    """The first numeric address of ``host`` that accepts a connection on ``port``
    (``localhost`` may name ::1 first while the store listens on 127.0.0.1 only; the
    store client would then spend its whole timeout on the wrong one); ``None`` when
    nothing accepts (no job listens there), ``host`` itself when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return host
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(probe_s)
                sock.connect(addr)
            return str(addr[0])
        except OSError:
            continue
    return None


def resolve_address(store: str | None, token: str | None, watch_file: str | None) -> Address:
    """``--store``/``--token`` when given, else the watch file (default
    ``commscope_traces/watch.json``)."""
    if store:
        return parse_address(store, token or "")
    addr = read_watch_file(watch_file or DEFAULT_WATCH_FILE)
    if token is not None:
        addr = Address(addr.host, addr.port, token, addr.world_size, addr.dump_prefix,
                       addr.source)
    return addr


def check_listening(address: Address) -> None:
    """Raise :class:`WatchError` when nothing accepts a connection at the job's address:
    the job has ended (or, for ``--store``, has not started)."""
    if reachable_host(address.host, address.port) is not None:
        return
    if address.source and address.source != "--store":
        raise WatchError(f"the job at {address} has ended: nothing listens there any more "
                         f"({address.source} was written {_when(address.source)}; a new "
                         "`commscope run` job writes a new one)")
    raise WatchError(f"nothing listens at {address}: the job has ended, or has not started yet")


def _when(path: str) -> str:
    try:
        written = os.stat(path).st_mtime
    except OSError:
        return "at an unknown time"
    ago = max(0.0, time.time() - written)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(written))
    if ago < 120:
        return f"{stamp}, {ago:.0f} s ago"
    if ago < 7200:
        return f"{stamp}, {ago / 60:.0f} min ago"
    return f"{stamp}, {ago / 3600:.1f} h ago"
