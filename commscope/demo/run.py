"""The parent side of ``commscope demo``: launch the ranks, print each step as it
happens, wait for the dumps, analyze them, list the files (steps: see
:mod:`commscope.demo`). Exit code 0 when the diagnosis names the injected fault."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from commscope.console import Console
from commscope.demo.faults import (
    EXPECTED,
    FAULT_RANK,
    FAULT_STEP,
    FAULT_WORDS,
    FAULTS,
    STEPS,
)
from commscope.demo.launch import LocalJob
from commscope.demo.story import enable_recorder, story

__all__ = ["run_demo"]

_WATCH_INTERVAL_S = 0.5


class _Watcher:
    """``commscope watch`` inside the demo: reads the ranks' progress records from the
    job's store and prints a line whenever the live verdict changes."""

    def __init__(self, store_path: str, con: Console, interval_s: float) -> None:
        import torch.distributed as dist

        from commscope.watch.command import SnapshotMaker
        from commscope.watch.source import Address, StoreSource

        self.con = con
        self.interval_s = interval_s
        self._source = StoreSource(Address("local", 0, ""), store=dist.FileStore(store_path, -1))
        self._make = SnapshotMaker(self._source, interval_s=interval_s)
        self._next = 0.0
        self._shown = ""
        self.stuck_at: float | None = None
        self.headline = ""

    def poll(self, fault_at: float | None) -> None:
        from commscope.watch.source import WatchError

        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        try:
            if self._source.world_size is None:
                self._source.connect()
            snap = self._make()
        except WatchError:
            return  # not publishing yet
        line = f"{snap['state'].upper()}: {snap['headline']}"
        # a wait before the fault (a rank slow to start on a busy machine) is shown as
        # it is, but the stall the story injects is the one timed
        if snap["state"] == "stuck" and self.stuck_at is None and fault_at is not None:
            self.stuck_at, self.headline = now, snap["headline"]
            after = f" ({now - fault_at:.1f} s after the fault)" if fault_at else ""
            line += after
        if snap["state"] != self._shown:
            self._shown = snap["state"]
            self.con.end_progress()
            self.con.line(f"  [commscope watch] {line}")


def _wait_for_job(
    job: LocalJob, con: Console, traces: Path, world: int, timeout_s: float, budget_s: float,
    watcher: _Watcher | None = None,
) -> dict[str, Any]:
    """Print rank messages as they come; once the job hangs, wait for every rank's dump."""
    state: dict[str, Any] = {"results": {}, "errors": {}, "died": {}, "fault_at": None}
    waiting_since = None
    shown_wait = -1
    deadline = time.monotonic() + budget_s
    # The faulty rank may say so before rank 0 has reported the step before the fault
    # (they are different processes): its line waits for that step, so the story
    # prints in order however the ranks are scheduled.
    held: list[str] = []
    last_step = -1

    def show_held() -> None:
        for text in held:
            con.line(text)
        held.clear()

    for msg in job.messages(timeout=budget_s):
        if watcher is not None and state.get("mesh"):
            watcher.poll(state["fault_at"])
        if msg.kind == "mesh":
            state.setdefault("mesh", {})[msg.rank] = msg.payload
            if len(state["mesh"]) == world:
                _show_mesh(con, state["mesh"])
        elif msg.kind == "comm":
            _show_comm(con, msg.payload)
            state["comm_files"] = msg.payload["files"]
        elif msg.kind == "step" and msg.rank == 0:
            step, loss = msg.payload
            last_step = step
            con.line(f"  step {step}: mean loss {loss:.4f}")
            if step >= FAULT_STEP - 1:
                show_held()
        elif msg.kind == "fault":
            state["fault_at"] = time.monotonic()
            held.append(f"  rank {msg.rank} injects the fault at step {FAULT_STEP}: "
                        f"{FAULT_WORDS[msg.payload]}")
            if last_step >= FAULT_STEP - 1:
                show_held()
        elif msg.kind == "result":
            state["results"][msg.rank] = msg.payload
        elif msg.kind == "error":
            state["errors"][msg.rank] = msg.payload
        elif msg.kind == "died":
            state["died"][msg.rank] = msg.payload
            text = f"  rank {msg.rank} died (exit code {msg.payload})"
            if held:  # after the line saying it injects the fault
                held.append(text)
            else:
                con.line(text)
        if state["fault_at"] is None or (held and time.monotonic() < deadline):
            continue
        dumps = sorted(
            int(p.name.split("_")[-1])
            for p in traces.glob("rank_*")
            if p.name.split("_")[-1].isdigit()
        )
        settled = [r for r in range(world) if r in dumps or r in state["died"]]
        if len(settled) == world:
            time.sleep(0.3)  # let a rank that is mid-rename finish
            break
        show_held()
        if waiting_since is None:
            waiting_since = time.monotonic()
            con.line(
                f"\n== step 4: waiting for the flight recorder (watchdog timeout {timeout_s:g} s)"
            )
        waited = int(time.monotonic() - waiting_since)
        if waited != shown_wait:
            shown_wait = waited
            con.progress(
                f"  {waited} s: dumps from ranks {dumps or 'none yet'}; "
                f"{len(job.alive())} ranks running"
            )
        if time.monotonic() > deadline:
            break
    show_held()  # rank 0 never reported that step (it died): say it anyway
    con.end_progress()
    return state


def _show_mesh(con: Console, by_rank: dict[int, Any]) -> None:
    from commscope.mesh.plan import format_ranks

    con.line(by_rank[0]["picture"])
    rows = []
    for rank in sorted(by_rank):
        res = by_rank[rank]
        rows.append(
            [
                str(rank),
                str(tuple(res["coordinate"])),
                *(format_ranks(g) for g in res["groups"].values()),
            ]
        )
    names = list(by_rank[0]["groups"])
    con.table(["rank", "(" + ", ".join(names) + ")", *(f"{n} group" for n in names)], rows)


def _show_comm(con: Console, payload: dict[str, Any]) -> None:
    con.line(
        "\n== step 2: CommDebugMode around the TP MLP's forward and backward (rank 0, noise 0)\n"
    )
    con.line(payload["table"].rstrip())
    con.line("\nby collective and mesh axis (time estimated at 100 GB/s bus bandwidth):")
    con.line(payload["summary"].rstrip())
    con.line(
        f"\n== step 3: {STEPS} training steps with the flight recorder on "
        "(gradients all_reduced over dp, loss over the world)\n"
    )


def run_demo(
    ranks: int = 4,
    fault: str = "missing",
    out: str | os.PathLike[str] = "commscope_demo",
    timeout_s: float = 5.0,
    stream: Any = None,
    watch: bool = False,
) -> int:
    """Run the demo; return 0 when the analysis names the injected fault, else 1.

    ``watch``: the ranks publish progress every 0.5 s and the demo prints the live
    ``commscope watch`` verdict as the job runs and stalls."""
    from commscope.analyze import analyze, format_report, write_html, write_json, write_perfetto

    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    if ranks < 4 or ranks % 2:
        raise ValueError(f"--ranks must be an even number >= 4, got {ranks}")
    con = Console(stream or sys.stdout)
    out_dir = Path(out).resolve()
    traces = out_dir / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    traces.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    con.line(
        f"commscope demo: {ranks} local CPU ranks (gloo), fault: {fault} "
        f"(rank {FAULT_RANK}: {FAULT_WORDS[fault]})"
    )
    con.line(f"output folder: {out_dir}\n")
    con.line(
        f"== step 1: init_device_mesh('cpu', (2, {ranks // 2}), mesh_dim_names=('dp', 'tp'))\n"
    )
    with LocalJob(
        story,
        ranks,
        out_dir,
        fault,
        str(out_dir),
        setup=enable_recorder(str(traces), timeout_s, _WATCH_INTERVAL_S if watch else None),
        pg_timeout_s=60.0,
    ) as job:
        watcher = _Watcher(job.store_path, con, _WATCH_INTERVAL_S) if watch else None
        state = _wait_for_job(job, con, traces, ranks, timeout_s, budget_s=90.0,
                              watcher=watcher)
        if watcher is not None and watcher.stuck_at is not None and state["fault_at"]:
            con.line(f"  [commscope watch] named the stall "
                     f"{watcher.stuck_at - state['fault_at']:.1f} s after the fault, before "
                     f"the recorder's {timeout_s:g} s timeout fired")
        if fault in ("missing", "order") or job.alive():
            con.line("  every rank has dumped: stopping the job")
    if not state.get("mesh") or len(state["mesh"]) < ranks:
        con.line("the job failed before the fault was injected:")
        for rank, text in sorted(state["errors"].items()):
            con.line(f"--- rank {rank}:\n{text}")
        return 1

    con.line("\n== step 5: commscope analyze " + str(traces) + "\n")
    # Local ranks share a few cores, so they arrive tens of ms apart by nature: only a
    # lag of half a second would be a straggler worth naming here.
    analysis = analyze(traces, straggler_ms=500.0)
    con.line(format_report(analysis, source=str(traces)).rstrip())
    files = {
        "analysis_json": out_dir / "analysis.json",
        "timeline": out_dir / "timeline.json",
        "report": out_dir / "report.html",
    }
    write_json(analysis, files["analysis_json"])
    write_perfetto(analysis, files["timeline"])
    write_html(analysis, files["report"], title=f"commscope demo: fault {fault}")

    root = analysis.root_cause
    named = root.kind in EXPECTED[fault] and (fault == "none" or FAULT_RANK in root.culprit_ranks)
    con.line("\n== step 6: files written\n")
    con.table(
        ["file", "open with"],
        [
            [_rel(Path(p), out_dir), "commscope view / any JSON viewer"]
            if p.endswith(".json")
            else [_rel(Path(p), out_dir), "a browser (offline, self-contained)"]
            for p in state.get("comm_files", [])
        ]
        + [
            [_rel(traces, out_dir) + "/rank_*", "commscope analyze (or PyTorch's fr_trace)"],
            [_rel(files["analysis_json"], out_dir), "jq, scripts (format commscope.analysis/2)"],
            [_rel(files["timeline"], out_dir), "https://ui.perfetto.dev or chrome://tracing"],
            [_rel(files["report"], out_dir), "a browser (offline, self-contained)"],
        ],
    )
    elapsed = time.monotonic() - started
    if named:
        con.line(
            f"\nthe analysis names the injected fault: {root.kind}"
            + (f", rank {FAULT_RANK}" if fault != "none" else "")
            + f" ({elapsed:.1f} s)"
        )
        return 0
    con.line(
        f"\nthe analysis did NOT name the injected fault ({fault}): root cause "
        f"{root.kind} ranks {root.culprit_ranks} ({elapsed:.1f} s)"
    )
    return 1


def _rel(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base.parent))
    except ValueError:
        return str(path)
