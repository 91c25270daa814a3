"""A collective-count dict that answers to every spelling of a collective.

PyTorch's ``CommDebugMode.get_comm_counts()`` is a ``defaultdict(int)`` keyed by op
packets. Ours is one too (same keys, same ``str()`` forms, same iteration), but a lookup
also accepts:

* the native functional packet (``torch.ops._c10d_functional.all_reduce``), which PyTorch
  folds onto the legacy key when counting but then answers 0 for;
* a printed name: ``"c10d_functional.all_reduce"``, ``"c10d.allreduce_"``;
* a canonical name from :mod:`commscope.collectives` (``"all_reduce"``), which sums every
  key of that collective, functional and eager alike.

A missing key answers 0 **without** being inserted (PyTorch's defaultdict inserts it), so
looking things up never changes ``len()`` or the printed tables.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from commscope import collectives
from commscope.comm.capture.registry import resolve_key

__all__ = ["CommCounts"]


class CommCounts(defaultdict):
    """``defaultdict(int)`` of op packet -> count, with alias-aware lookups (see module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(int, *args, **kwargs)

    def _alias_total(self, key: Any) -> int | None:
        """The count for ``key`` given by another spelling, or ``None`` if it names nothing."""
        resolved = resolve_key(key)
        if resolved is not None:
            return None if resolved is key else dict.get(self, resolved, 0)
        if isinstance(key, str):
            name = collectives.canonical_name(key)
            if name is not None:
                return sum(
                    v for k, v in self.items() if collectives.canonical_name(str(k)) == name
                )
        return None

    def __missing__(self, key: Any) -> int:
        found = self._alias_total(key)
        return 0 if found is None else found

    def get(self, key: Any, default: Any = None) -> Any:
        """Like ``dict.get``, with the alias-aware lookup of ``counts[key]``."""
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        found = self._alias_total(key)
        return default if found is None else found

    def by_collective(self) -> dict[str, int]:
        """Counts summed by canonical collective name, in first-seen order."""
        out: dict[str, int] = {}
        for key, value in self.items():
            name = collectives.canonical_name(str(key)) or str(key)
            out[name] = out.get(name, 0) + value
        return out

    def __repr__(self) -> str:
        return f"CommCounts({ {str(k): v for k, v in self.items()} })"

    def copy(self) -> CommCounts:
        """A shallow copy (same class, same keys)."""
        return CommCounts(self)

    __copy__ = copy

    def __reduce__(self) -> Any:
        return (CommCounts, (), None, None, iter(self.items()))
