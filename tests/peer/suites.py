"""PyTorch's own test files that commscope must pass, and how each is swapped.

A peer suite is one of PyTorch's test files, read where it lies (never copied into the
project: ``/work/shared/peer/README.md``), with exactly one import line swapped so that
the class under test is commscope's. The copy is written under ``build/peer/``, which
git ignores, each time the suite runs.

Where the files are looked for: ``$COMMSCOPE_PEER_DIR``, then ``shared/peer`` beside
the repository's files, then ``../shared/peer``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "peer"

__all__ = ["BUILD", "REPO", "SUITES", "Suite", "SwapError", "peer_dirs"]


class SwapError(RuntimeError):
    """The import to swap is not in the peer file (it changed upstream): running it
    would test torch's own class, so the suite fails instead of passing silently."""


@dataclass(frozen=True)
class Suite:
    """One of PyTorch's test files, run with commscope's class in place of torch's."""

    name: str
    file: str
    """The file's name in the peer folder."""
    upstream: str
    """Where the file lives in PyTorch's repository."""
    swap_from: str
    """The import line of torch's class, exactly as the file has it."""
    swap_to: str
    """What replaces it (torch's other names stay imported from torch)."""
    ours: tuple[str, ...]
    """Names the swapped file must get from commscope."""
    spawn_sample: tuple[str, ...] = ()
    """``-k`` expressions run with torch's own process start (spawn) in the CI selection,
    to show the fork start of the rest changes no verdict."""
    out_of_scope: dict[str, str] = field(default_factory=dict)
    """Test id -> why it is not run against commscope (docs/mesh.md lists them)."""

    def locate(self) -> Path | None:
        """The peer file, or ``None`` where none of :func:`peer_dirs` has it."""
        for folder in peer_dirs():
            path = folder / self.file
            if path.is_file():
                return path
        return None

    def missing_reason(self) -> str:
        """Why the suite cannot run here (the file is absent), saying where to put it."""
        where = ", ".join(str(p) for p in peer_dirs())
        return (
            f"PyTorch's {self.upstream} is not here (looked for {self.file} in {where}); "
            f"put it in one of those folders, or set COMMSCOPE_PEER_DIR to its folder"
        )

    def swapped(self, source: str, against: str = "commscope") -> str:
        """The file's text with torch's import swapped for commscope's (``against=
        "torch"``: unchanged, for the baseline). Raises :class:`SwapError` unless the
        import is there exactly once."""
        lines = source.splitlines(keepends=True)
        hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == self.swap_from]
        if len(hits) != 1:
            raise SwapError(
                f"{self.file}: expected the line {self.swap_from!r} once, found it "
                f"{len(hits)} times; the file changed upstream: update tests/peer/suites.py"
            )
        if against == "torch":
            return source
        lines[hits[0]] = self.swap_to + "\n"
        return "".join(lines)


def peer_dirs() -> list[Path]:
    """Where peer files are looked for, first match wins."""
    dirs = []
    env = os.environ.get("COMMSCOPE_PEER_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [REPO / "shared" / "peer", REPO.parent / "shared" / "peer"]
    return dirs


DEVICE_MESH = Suite(
    name="device_mesh",
    file="test_device_mesh.py",
    upstream="test/distributed/test_device_mesh.py",
    swap_from=(
        "from torch.distributed.device_mesh import _mesh_resources, DeviceMesh, "
        "init_device_mesh"
    ),
    swap_to=(
        "from torch.distributed.device_mesh import _mesh_resources\n"
        "from commscope.mesh import DeviceMesh, init_device_mesh"
    ),
    ours=("DeviceMesh", "init_device_mesh"),
    spawn_sample=("DeviceMeshTest and test_device_mesh_2d",),
)

COMM_MODE = Suite(
    name="comm_mode",
    file="test_comm_mode.py",
    upstream="test/distributed/tensor/debug/test_comm_mode.py",
    swap_from="from torch.distributed.tensor.debug import CommDebugMode",
    swap_to="from commscope.comm import CommDebugMode",
    ours=("CommDebugMode",),
)

SUITES: dict[str, Suite] = {s.name: s for s in (DEVICE_MESH, COMM_MODE)}
