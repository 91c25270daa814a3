"""Where each rank runs: the job's placement of ranks on hosts, as one small table.

A :class:`HostTable` gives every rank ``0..n-1`` a host. A live mesh makes it from the
ranks' real hostnames (``gather.py`` collects them once per job), which is right for any
launcher and any placement: uneven hosts (three ranks on one, one on another),
round-robin placement (some ``mpirun`` and Slurm distributions), or torchrun's
consecutive one. Offline planning, and a live mesh that cannot gather (torch's fake
process group), use arithmetic instead (:meth:`HostTable.consecutive`: rank ``r`` on
host ``r // ranks_per_host``, torchrun's placement with equal hosts).

Topology (which axes stay inside a host) and the picture ask this table; nothing else
computes ``rank // ranks_per_host``. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from commscope.mesh.errors import MeshError
from commscope.mesh.layout import format_ranks

__all__ = ["HostTable"]

_SHORT_NAME = 20
"""Host names up to this long are shown in the picture's cells as they are."""
_NAMED_HOSTS = 16
"""With more hosts than this, cells say ``h0``, ``h1``, ... and a legend names them."""
_LEGEND_LINES = 8
"""Hosts the legend names before it says how many more there are."""
_SUMMARY_HOSTS = 4
"""Hosts the one-line summary names."""


def _ranks(n: int | None) -> str:
    return f"{n} rank{'' if n == 1 else 's'}"


@dataclass(frozen=True, eq=False)
class HostTable:
    """Rank -> host for the ranks ``0..n-1`` of a job (see the module docstring).

    Hosts are numbered in the order of their lowest rank: host 0 holds rank 0, and the
    first ``k`` ranks only ever sit on hosts ``0..j`` for some ``j``.
    """

    names: tuple[str, ...]
    """Host names (``h0``, ``h1``, ... for an arithmetic table), by host index."""
    host_index: np.ndarray
    """The host index of every rank, by rank (integers, one per rank)."""
    gathered: bool
    """True: real hostnames gathered from the ranks; False: arithmetic."""

    @classmethod
    def from_hostnames(cls, hostnames: Sequence[str]) -> HostTable:
        """The table of the ranks whose hostnames are ``hostnames`` (by rank)."""
        if not hostnames:
            raise MeshError("a host table needs at least one rank's hostname")
        index: dict[str, int] = {}
        hosts = np.empty(len(hostnames), dtype=np.int64)
        for rank, name in enumerate(hostnames):
            hosts[rank] = index.setdefault(str(name), len(index))
        return cls(tuple(index), hosts, True)

    @classmethod
    def consecutive(cls, world_size: int, ranks_per_host: int) -> HostTable:
        """Arithmetic: rank ``r`` on host ``r // ranks_per_host`` (torchrun's placement
        with equal hosts; the last host holds fewer where the division is not exact)."""
        if ranks_per_host < 1:
            raise MeshError(f"ranks per host must be >= 1, got {ranks_per_host}")
        if world_size < 1:
            raise MeshError(f"a host table needs at least one rank, got {world_size}")
        hosts = np.arange(world_size, dtype=np.int64) // ranks_per_host
        return cls(tuple(f"h{i}" for i in range(int(hosts[-1]) + 1)), hosts, False)

    # ------------------------------------------------------------------ queries

    @property
    def world_size(self) -> int:
        """Ranks in the table."""
        return int(self.host_index.shape[0])

    @property
    def num_hosts(self) -> int:
        """Hosts in the table."""
        return len(self.names)

    def host(self, rank: int) -> int:
        """The host index of ``rank``."""
        return int(self.host_index[rank])

    @cached_property
    def counts(self) -> np.ndarray:
        """Ranks on each host, by host index."""
        return np.bincount(self.host_index, minlength=self.num_hosts)

    @property
    def ranks_per_host(self) -> int | None:
        """The number of ranks on every host, or ``None`` when hosts differ."""
        lo, hi = int(self.counts.min()), int(self.counts.max())
        return lo if lo == hi else None

    @cached_property
    def is_consecutive(self) -> bool:
        """True when every host holds one run of consecutive ranks (torchrun's way)."""
        return bool(np.all(np.diff(self.host_index) >= 0))

    def ranks_on(self, host: int) -> list[int]:
        """The ranks on host ``host``, in order."""
        return np.flatnonzero(self.host_index == host).tolist()

    def first(self, n: int) -> HostTable:
        """The table of ranks ``0..n-1`` only (a mesh smaller than the job)."""
        if n == self.world_size:
            return self
        if not 1 <= n <= self.world_size:
            raise MeshError(
                f"the host table holds ranks 0..{self.world_size - 1}; ranks 0..{n - 1} "
                "were asked for"
            )
        sub = self.host_index[:n]
        return HostTable(self.names[: int(sub.max()) + 1], sub, self.gathered)

    def among(self, ranks: Sequence[int] | np.ndarray) -> HostTable:
        """The hosts of some ranks only (a slice's sub-mesh), numbered anew; for words
        about those ranks (their rank numbers are not kept)."""
        picked = self.host_index[np.asarray(ranks, dtype=np.int64).ravel()]
        _, first, inverse = np.unique(picked, return_index=True, return_inverse=True)
        order = np.argsort(first)  # hosts in the order of their lowest given rank
        renumber = np.empty_like(order)
        renumber[order] = np.arange(order.size)
        kept = np.unique(picked)[order]
        return HostTable(
            tuple(self.names[int(h)] for h in kept), renumber[inverse], self.gathered
        )

    # ------------------------------------------------------------------ words

    @cached_property
    def _labels(self) -> tuple[tuple[str, ...], bool]:
        """(the label of every host, whether a legend must name the hosts)."""
        if not self.gathered:
            return self.names, False
        short = tuple(n.split(".", 1)[0] or n for n in self.names)
        if len(set(short)) != len(short):
            short = self.names
        if len(short) <= _NAMED_HOSTS and all(len(s) <= _SHORT_NAME for s in short):
            return short, False
        return tuple(f"h{i}" for i in range(self.num_hosts)), True

    @property
    def labels(self) -> tuple[str, ...]:
        """How the picture names each host: its name (the part before the first dot
        where that stays unique) when the names are short and few, else ``h0``, ``h1``,
        ... (then :meth:`legend` names them)."""
        return self._labels[0]

    def label(self, host: int) -> str:
        """The picture's name of host ``host``."""
        return self.labels[host]

    def legend(self) -> list[str]:
        """``h0 = node-0017.cluster: ranks [0..7]`` lines where the labels are not the
        names (empty otherwise); the first few hosts, then how many more."""
        if not self._labels[1]:
            return []
        shown = min(self.num_hosts, _LEGEND_LINES)
        lines = [
            f"{self.labels[h]} = {self.names[h]}: ranks {format_ranks(self.ranks_on(h))}"
            for h in range(shown)
        ]
        if self.num_hosts > shown:
            lines.append(f"... and {self.num_hosts - shown} more hosts")
        return lines

    def summary(self) -> str:
        """``1 host (devbox)``, ``2 hosts of 2 ranks (hostA, hostB)``, ``2 hosts (hostA: 3
        ranks, hostB: 1)``, ``2048 hosts of 8 ranks``; arithmetic tables name no host."""
        h = self.num_hosts
        per = self.ranks_per_host
        named = self.gathered
        if h == 1:
            return f"1 host ({self.labels[0]})" if named else f"1 host of {_ranks(per)}"
        if per is not None:
            names = f" ({', '.join(self.labels)})" if named and h <= _SUMMARY_HOSTS else ""
            return f"{h} hosts of {_ranks(per)}{names}"
        counts = self.counts.tolist()
        parts = [
            f"{self.labels[i]}: {_ranks(c) if i == 0 else c}"
            for i, c in enumerate(counts[:_SUMMARY_HOSTS])
        ]
        if h <= _SUMMARY_HOSTS:
            return f"{h} hosts ({', '.join(parts)})"
        return (
            f"{h} hosts of {min(counts)} to {max(counts)} ranks ({', '.join(parts)}, ...)"
        )
