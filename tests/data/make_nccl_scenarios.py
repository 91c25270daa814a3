"""Regenerate ``tests/data/nccl_scenarios/<name>/``: the analyzer's NCCL corpus, every
folder the dumps of one REAL multi-process job on the NCCL-semantics bed
(``tests/ncclbed``).

Usage (from the repository root)::

    .venv/bin/python tests/data/make_nccl_scenarios.py                 # every scenario
    .venv/bin/python tests/data/make_nccl_scenarios.py gil_hold gpu_error_ep
    .venv/bin/python tests/data/make_nccl_scenarios.py --list

Each job is a mixture-of-experts model shaped like Megatron-Core's
(:mod:`tests.ncclbed.megatron`: tensor, context, pipeline, data and expert parallel
groups with Megatron's descriptions) on 16 ranks (a few on 64), every rank a host and a
device process (:mod:`tests.ncclbed`). Faults are injected at named points of a step,
modelled on real GPU failures: a device that stops with a sticky error, a Python thread
that holds the GIL, a hung main thread, a skipped collective, a skipped pipeline recv, a
rank that dies, a slow rank. Every device dumps when the job's dump signal rises (a
watchdog timeout, a rank's failure reported by the fault-tolerance wrapper, or an
explicit request), in three forms (:data:`tests.ncclbed.device.VARIANTS`): PyTorch's
full pickle with stacks (``full/``), its active-only pickle (``active/``) and an
NVRx-style collector's active-only JSON without stacks (``nvrx/``). The files are
stored gzip-compressed under their own names plus ``.gz`` (the analyzer reads gzip by
its bytes; uncompressed, the corpus is four times the size).

Each scenario states what the analyzer must find (:class:`Expect`, from the fault the
job injected, never from the analyzer's output), written to ``scenario.json`` and
asserted by ``tests/unit/test_analyze_nccl_scenarios.py`` on every form.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tests.ncclbed import backend  # noqa: E402
from tests.ncclbed.device import VARIANTS  # noqa: E402
from tests.ncclbed.job import run_job  # noqa: E402
from tests.ncclbed.megatron import Hooks, Layout, train  # noqa: E402

DATA = Path(__file__).resolve().parent / "nccl_scenarios"
L16 = Layout(16)
L64 = Layout(64, tp=2, cp=2, pp=4, ep=4)
FAULT_STEP = 2


@dataclass
class Expect:
    """What the analysis of a scenario's dumps must say (on every form)."""

    verdict: str
    kind: str | None = None
    """Kind of the first finding."""
    culprits: list[int] = field(default_factory=list)
    """Culprit ranks of the first finding."""
    blamed: list[int] | None = None
    """Every rank a blocking finding blames (default: ``culprits``)."""
    also: list[tuple[str, list[int]]] = field(default_factory=list)
    """Other findings (kind, culprits) that must be there."""
    says: list[str] = field(default_factory=list)
    """Text the first finding's message must contain."""
    never_says: list[str] = field(default_factory=list)
    """Text no finding's message may contain."""


@dataclass
class Scenario:
    """One real job on the bed with the fault(s) it injects."""

    name: str
    layout: Layout
    run: Callable[[int, int], None]
    expect: Expect
    timing: bool = False
    timeout_s: float = 5.0
    dump_on_error: bool = True
    """A rank's error raises the dump signal (a collector's trigger); off: only a
    watchdog's timeout does, after every injected fault happened."""
    forms: tuple[str, ...] = VARIANTS
    """The dump forms kept and asserted (a straggler shows only in finished records:
    not in the active-only forms)."""


# --------------------------------------------------------------------------- helpers


def at(rank: int | set[int], point: str, action: Callable[[], bool | None],
       step: int = FAULT_STEP) -> Callable[..., bool]:
    """A hook that runs ``action`` once, on ``rank`` at ``point`` of step ``step``;
    its result (true: skip what follows) is the hook's."""
    ranks = {rank} if isinstance(rank, int) else rank
    fired: set[tuple[int, int]] = set()

    def hook(p: str, r: int, s: int, _detail: object) -> bool:
        if p != point or r not in ranks or s != step or (r, s) in fired:
            return False
        fired.add((r, s))
        return bool(action())
    return hook


def skip() -> bool:
    """Skip what follows the point (a collective or a send/recv never issued)."""
    return True


def bad_kernel() -> None:
    """A kernel with a device-side assert: the device's context breaks when it runs."""
    backend.bad_kernel("device-side assert triggered")


def hold_gil() -> None:
    """A side thread enters a long C call that never releases the GIL."""
    backend.hold_gil()
    time.sleep(0.05)  # the main thread stops at its next bytecode


def hang_here() -> None:
    """The main thread blocks for good (a stuck data loader, a deadlock)."""
    time.sleep(3600)


def die() -> None:
    """The rank's process dies (a segfault): its device goes with it, no dump."""
    os.kill(backend.device_pid(), signal.SIGKILL)
    os._exit(139)


def end_with_dumps(rank: int) -> None:
    """A job that ended well: every rank reaches the end, then the collector dumps."""
    dist.barrier()
    if rank == 0:
        backend.request_dumps("end of job")
    time.sleep(30)


def job(layout: Layout, *hooks: Callable[..., bool], steps: int = 4, compute_ms: float = 1.0,
        p2p_on_default: bool = False, end: bool = False) -> Callable[[int, int], None]:
    """A scenario's rank function: ``steps`` steps of the MoE job with ``hooks``."""

    def run(rank: int, world: int) -> None:
        train(layout, rank, steps, hooks=Hooks(list(hooks)), compute_ms=compute_ms,
              p2p_on_default=p2p_on_default)
        if end:
            end_with_dumps(rank)
    return run


def healthy_running(rank: int, world: int) -> None:
    """A healthy job dumped while it runs: compute is long, so every device queue runs
    a few collectives behind its host when rank 0 asks for the dumps mid-step."""
    def ask(p: str, r: int, s: int, _d: object) -> bool:
        if r == 0 and s == FAULT_STEP and p == "bwd:ep_dispatch":
            backend.request_dumps("dump requested while the job runs")
        return False
    train(L16, rank, 4, hooks=Hooks([ask]), compute_ms=20.0)
    time.sleep(30)


def slow_rank(rank: int, world: int) -> None:
    """Rank 5's data loader is slow: it enters every forward pass 40 ms after the
    others; the job is healthy and ends."""
    def slow(p: str, r: int, s: int, _d: object) -> bool:
        if r == 5 and p == "fwd:tp_all_gather":
            time.sleep(0.04)
        return False
    train(L16, rank, 6, hooks=Hooks([slow]))
    end_with_dumps(rank)


def slow_host(rank: int, world: int) -> None:
    """Rank 5's host is slow (a CPU-bound Python loop): it issues every collective and
    send/recv 30 ms after reaching it, so its GPU comes to each one last; the job is
    healthy and ends. Timing on: each collective's duration tells it."""
    def slow(p: str, r: int, s: int, _d: object) -> bool:
        if r == 5 and (p.startswith("fwd:") or p.startswith("bwd:")):
            time.sleep(0.03)
        return False
    train(L16, rank, 6, hooks=Hooks([slow]))
    end_with_dumps(rank)


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, layout: Layout, run: Callable[[int, int], None], expect: Expect,
             **kw: object) -> None:
    """Register one scenario."""
    SCENARIOS[name] = Scenario(name, layout, run, expect, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the corpus

scenario("healthy_end", L16, job(L16, end=True), Expect("healthy"))
scenario("healthy_running", L16, healthy_running,
         Expect("incomplete", "stalled_collective", says=["caught running"]))
scenario("slow_rank", L16, slow_rank, Expect("healthy"))
scenario("slow_host_timing", L16, slow_host,
         Expect("healthy", "straggler", [], blamed=[], also=[("straggler", [5])]),
         timing=True, forms=("full",))
scenario("gpu_error_ep", L16, job(L16, at(6, "fwd:ep_dispatch", bad_kernel)),
         Expect("hang", "device_stopped", [6]))
scenario("gpu_error_last_stage", L16, job(L16, at(13, "bwd:tp_all_gather", bad_kernel)),
         Expect("hang", "device_stopped", [13]))
scenario("gpu_error_timing", L16, job(L16, at(2, "fwd:cp_all_gather", bad_kernel)),
         Expect("hang", "device_stopped", [2]), timing=True)
scenario("gil_hold", L16, job(L16, at(10, "fwd:ep_combine", hold_gil)),
         Expect("hang", "missing_rank", [10]))
scenario("gil_hold_timing", L16, job(L16, at(3, "bwd:cp_all_gather", hold_gil)),
         Expect("hang", "missing_rank", [3]), timing=True)
scenario("hung_python", L16, job(L16, at(9, "optimizer", hang_here)),
         Expect("hang", "missing_rank", [9]))
scenario("skip_ep_dispatch", L16, job(L16, at(6, "fwd:ep_dispatch", skip)),
         Expect("hang", "missing_rank", [6]))
scenario("skip_pipeline_recv", L16, job(L16, at(12, "p2p:recv_forward:recv", skip)),
         Expect("hang", "p2p_unmatched", [12]))
scenario("two_gpu_errors", L16,
         job(L16, at(2, "fwd:ep_dispatch", bad_kernel), at(13, "fwd:ep_dispatch", bad_kernel)),
         Expect("hang", "device_stopped", [2], blamed=[2, 13],
                also=[("device_stopped", [13])]), dump_on_error=False)
scenario("gpu_error_and_gil", L16,
         job(L16, at(5, "fwd:ep_combine", bad_kernel), at(14, "bwd:tp_all_gather", hold_gil)),
         Expect("hang", None, [], blamed=[5, 14],
                also=[("device_stopped", [5]), ("missing_rank", [14])]), dump_on_error=False)
scenario("gil_hold_p2p_default", L16,
         job(L16, at(9, "fwd:cp_all_gather", hold_gil), p2p_on_default=True),
         Expect("hang", "missing_rank", [9]))
scenario("rank_dies", L16, job(L16, at(7, "bwd:ep_dispatch", die)),
         Expect("crash", "crashed_rank", [7]))
scenario("gpu_error_64", L64, job(L64, at(37, "fwd:ep_combine", bad_kernel), steps=3),
         Expect("hang", "device_stopped", [37]))
scenario("gil_hold_64", L64, job(L64, at(22, "bwd:tp_reduce_scatter", hold_gil), steps=3),
         Expect("hang", "missing_rank", [22]))


# --------------------------------------------------------------------------- running


def generate(name: str, out: Path | None = None) -> Path:
    """Run scenario ``name`` and write its folder (dumps and ``scenario.json``)."""
    sc = SCENARIOS[name]
    out = DATA / name if out is None else Path(out)
    if out.exists():
        shutil.rmtree(out)
    result = run_job(sc.run, sc.layout.world, out, timeout_s=sc.timeout_s, timing=sc.timing,
                     dump_on_error=sc.dump_on_error)
    for form in VARIANTS:
        if form not in sc.forms:
            shutil.rmtree(out / form, ignore_errors=True)
    for path in sorted(out.rglob("*")):
        if path.is_file():  # stored compressed (the analyzer reads gzip by its bytes)
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes(), 9))
            path.unlink()
    meta = {
        "name": sc.name,
        "world_size": sc.layout.world,
        "layout": asdict(sc.layout),
        "story": " ".join(filter(None, (f.__doc__ or "" for f in (sc.run,)))).strip() or None,
        "timing": sc.timing,
        "dump_signal": result.signal,
        "ended": {str(r): e for r, e in sorted(result.ended.items())},
        "dumped": result.dumped,
        "forms": list(sc.forms),
        "expect": asdict(sc.expect),
        "made_by": "tests/data/make_nccl_scenarios.py",
        "torch": torch.__version__,
    }
    (out / "scenario.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def main(argv: list[str]) -> int:
    """Generate the scenarios named in ``argv`` (all by default)."""
    if argv[:1] == ["--list"]:
        for sc in SCENARIOS.values():
            print(f"{sc.name:24} {sc.layout.world:3} ranks  {sc.expect.verdict:8} "
                  f"{sc.expect.kind} {sc.expect.culprits}")
        return 0
    names = argv or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    for name in names:
        start = time.monotonic()
        out = generate(name)
        meta = json.loads((out / "scenario.json").read_text())
        print(f"{name}: dumped {len(meta['dumped'])}/{meta['world_size']} ranks, signal "
              f"{meta['dump_signal']!r}, in {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
