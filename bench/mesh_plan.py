"""Planning time of a 1 000 000-rank 3-axis mesh: no processes (goal < 1 s).

Times, median of 5: building the layout and answering "what are rank r's groups"
(pure integer math), and the whole `commscope mesh` plan (which also checks every
group of every axis against host boundaries with numpy).

    python bench/mesh_plan.py
"""

from __future__ import annotations

import statistics
import time

from commscope.mesh.layout import MeshLayout
from commscope.mesh.plan import plan_mesh

CASES = [
    ((2, 62500, 8), ("dp", "fsdp", "tp")),
    ((15625, 8, 8), ("dp", "cp", "tp")),
    ((125000, 8), ("dp", "tp")),
]


def _median(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"{'shape':<18} {'world':>9}  {'rank groups ms':>14}  {'full plan ms':>12}")
    for shape, names in CASES:
        rank = 777_777

        def groups(shape=shape, names=names, rank=rank):
            lay = MeshLayout.create(shape, names)
            return lay.groups_of(rank)

        def plan(shape=shape, names=names, rank=rank):
            return plan_mesh(shape, names, rank=rank, ranks_per_host=8)

        g, p = _median(groups), _median(plan)
        world = 1
        for s in shape:
            world *= s
        print(f"{shape!s:<18} {world:>9}  {g * 1e3:>14.2f}  {p * 1e3:>12.1f}")
        assert p < 1.0, f"planning took {p:.2f} s"


if __name__ == "__main__":
    main()
