"""Hosts in the diagnosis: ranks whose dumps lie on another host, a whole host gone, and
hosts to leave out.

A job spans hosts, and each host keeps its own ranks' dumps on its own disk. A folder
copied from one host therefore lacks the other hosts' dumps: those ranks did not crash,
their files are elsewhere. The dumps carry the job's host table
(:class:`commscope.analyze.model.HostMap`), so the analyzer knows where they ran.

Algorithm (:func:`elsewhere_ranks`, :func:`elsewhere_findings`):

1. A rank with no dump here is *elsewhere* when the host table places it on a host that
   no dump here came from, and nothing here says it died: no fatal log of it, no
   unreadable file of it. It is never called crashed for that.
2. Unless a peer's death shows here: when the work of a rank here failed (its newest
   records of a group, or of send/recv: a peer closed the connection, as when its
   process or its host dies) and the ranks without a dump here all ran on one other
   host, that host's ranks are not elsewhere but gone, and the crash findings name
   the host (``hostB: ranks 2-3 gone at 12:03:10, no dump``). With several hosts
   absent, the failed work does not say which one died: each stays elsewhere, and its
   finding says that one of them may have died. Nor when the dumps here say otherwise:
   a death here explains the failed work (a rank here raised an exception of its own,
   or died in native code: gloo aborted it, its fatal log is here; the other host's
   ranks went down with the job and dumped on their way, on their own host), or a dump
   here was asked for by a rank of that host (it was alive after the failure). Their
   ranks stay elsewhere.
3. One ``dumps_elsewhere`` finding per host still elsewhere: which ranks ran there,
   where their dumps went (``host:folder`` from the table), who here waits for them and
   in what (the wait-for graph), and how to give the analyzer the rest (copy the files,
   or pass several folders or archives). It blocks when a rank here waits for them: the
   job is stuck, and the cause is in the dumps that are not here. When nothing here
   explains the wait (no rank here that others wait for waits for nobody), the culprit
   is among that host's ranks: they are its culprits, and the finding says that a host
   holding no dump of them froze or died before they could write one.
"""

from __future__ import annotations

from typing import Any

from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import WaitGraph, reaching
from commscope.analyze.model import FAILED, Finding, HostMap
from commscope.analyze.text import plural, rank_list, ranks_phrase

__all__ = ["elsewhere_ranks", "elsewhere_findings", "host_rows", "hosts_to_exclude",
           "failed_ranks", "whole_hosts", "host_phrase", "hosts_phrase"]


def failed_ranks(ctx: Context) -> list[int]:
    """Ranks here whose recent work failed (the last four records of a group, or of
    send/recv): a peer closed the connection, as when its process or its host dies."""
    return sorted(r for r, d in ctx.load.dumps.items()
                  if any(t.status[i] & FAILED for t in d.tracks.values()
                         for i in range(max(0, len(t) - 4), len(t)))
                  or any(op.status & FAILED for op in d.p2p[-4:]))


def elsewhere_ranks(ctx: Context, deaths_here: list[int] | tuple[int, ...] = ()
                    ) -> dict[str, list[int]]:
    """Steps 1-2: host → its ranks whose dumps are on that host, not here (a host whose
    ranks' death shows here is left out: its ranks count as gone). ``deaths_here``: ranks
    whose own death shows here (an exception of their own, a fatal log): they explain the
    failed work, so no other host is taken for dead."""
    unreadable = {u.rank for u in ctx.load.unreadable if u.rank is not None}
    missing = [r for r in ctx.expected if r not in ctx.load.dumps and r not in unreadable
               and r not in ctx.load.fatal]
    away = ctx.hosts.elsewhere(missing)
    if len(away) == 1 and failed_ranks(ctx) and not deaths_here:
        lost = next(iter(away.values()))
        if set(lost) == set(missing) and not _asked_by(ctx, lost):
            return {}  # every rank without a dump ran there, and nothing says it lived
    return away


def _asked_by(ctx: Context, ranks: list[int]) -> bool:
    """A dump here was asked for by one of ``ranks`` (``request from rank N``): that rank
    was alive after the failure."""
    asked = {reason.rsplit(" ", 1)[-1] for d in ctx.load.dumps.values()
             if (reason := d.dump_reason or "").startswith("request from rank ")}
    return any(str(r) in asked for r in ranks)


def whole_hosts(hosts: HostMap, ranks: list[int]) -> dict[str, list[int]]:
    """Host → its ranks, when ``ranks`` are every rank of one or more hosts of a job
    that spans more than one host (as far as the dumps tell); ``{}`` otherwise."""
    table = hosts.hosts()
    if len(table) < 2 or not ranks:
        return {}
    out: dict[str, list[int]] = {}
    for r in sorted(set(ranks)):
        host = hosts.host(r)
        if host is None:
            return {}
        out.setdefault(host, []).append(r)
    if any(table[host] != mine for host, mine in out.items()):
        return {}
    return out


def host_phrase(host: str, ranks: list[int]) -> str:
    """``hostB: ranks 2-3`` (a run of ranks as ``a-b``), ``hostB: rank 3``."""
    values = sorted(set(ranks))
    if len(values) > 1 and values[-1] - values[0] == len(values) - 1:
        return f"{host}: ranks {values[0]}-{values[-1]}"
    return f"{host}: {ranks_phrase(values)}"


def hosts_phrase(by_host: dict[str, list[int]]) -> str:
    """``hostB: ranks 2-3`` for one host, ``hostB: ranks 2-3 and hostC: ranks 4-5`` for
    two, the rest counted beyond four."""
    parts = [host_phrase(h, r) for h, r in by_host.items()]
    if len(parts) > 4:
        parts = [*parts[:3], f"{len(parts) - 3} more hosts"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def elsewhere_findings(ctx: Context, graph: WaitGraph,
                       away: dict[str, list[int]]) -> list[Finding]:
    """Step 3: one ``dumps_elsewhere`` per host of ``away``."""
    findings = []
    failed = failed_ranks(ctx)
    # ranks here that others wait for and that wait for nobody: the cause is here
    waiters = {w.waiter for w in graph.edges()}
    roots_here = {w.target for w in graph.edges()
                  if w.target in ctx.load.dumps and w.target not in waiters}
    for host, ranks in away.items():
        waiting = sorted(reaching(set(ranks), graph))
        direct = [w for w in graph.edges() if w.target in ranks and w.waiter in ctx.load.dumps]
        folder = ctx.hosts.dump_dir(ranks)
        where = f"{host}:{folder}/" if folder else f"on {host}"
        text = (f"{ranks_phrase(ranks).capitalize()} ran on {host}, and no dump of {host} is "
                f"here: {'their' if len(ranks) > 1 else 'its'} dumps are in {where} (copy "
                "them here, or pass both folders or archives to `commscope analyze`)")
        culprits: list[int] = []
        if direct:
            first = direct[0]
            what = (f"{ctx.op_at(first.waiter, first.group, first.seq)} of "
                    f"{ctx.group_ref(first.group)}" if first.seq is not None
                    else f"{first.op} of {ctx.group_ref(first.group)}")
            verb = "waits" if len(waiting) == 1 else "wait"
            text += (f". {ranks_phrase(waiting).capitalize()} {verb} for them (first in "
                     f"{what}); which of {rank_list(ranks)} stopped first, and why, is in "
                     f"{host}'s dumps")
            if not roots_here:
                culprits = sorted({w.target for w in direct})
                text += (f"; if {host} holds none, {ranks_phrase(culprits)} froze or died "
                         "before writing one")
        if failed:
            text += (f". The work of {ranks_phrase(failed)} failed, as when a peer dies: a "
                     f"rank of {host} may have died")
        findings.append(Finding(
            kind="dumps_elsewhere", group=None, collective_seq_id=None, op=None,
            culprit_ranks=culprits, waiting_ranks=waiting, blocking=bool(direct),
            message=text + ".",
            details={"host": host, "ranks": ranks, "dump_dir": folder,
                     "summary": f"{host}: {plural(len(ranks), 'rank')} ({rank_list(ranks)}), "
                                "dumps not here"},
        ))
    return findings


def host_rows(hosts: HostMap, loaded: set[int],
              findings: list[Finding]) -> list[dict[str, Any]]:
    """The ``hosts`` of the analysis JSON: per host (in order of its first rank) its
    ranks, their pids, its dump folder, which ranks' dumps are here, and which of its
    ranks the findings name as crashed or as culprits."""
    crashed = {r for f in findings if f.kind == "crashed_rank" for r in f.culprit_ranks}
    culprits = {r for f in findings if f.blocking for r in f.culprit_ranks}
    rows = []
    for host, ranks in hosts.hosts().items():
        places = [hosts.places[r] for r in ranks]
        rows.append({
            "host": host,
            "ranks": ranks,
            "pids": {str(r): p.pid for r, p in zip(ranks, places) if p.pid is not None},
            "dump_dir": hosts.dump_dir(ranks),
            "dumps_here": [r for r in ranks if r in loaded],
            "crashed_ranks": [r for r in ranks if r in crashed],
            "culprit_ranks": [r for r in ranks if r in culprits],
        })
    return rows


def hosts_to_exclude(hosts: HostMap, findings: list[Finding]) -> list[str]:
    """Hosts a restart should leave out: those with a rank the findings call crashed
    (a dead process, a stale dump, a rank gone silent). A rank that is alive but wrong
    (it skipped a collective, passed another size) is a bug in the program, not the
    machine's fault: its host is not listed."""
    out: list[str] = []
    for f in findings:
        if f.kind != "crashed_rank":
            continue
        for r in f.culprit_ranks:
            host = hosts.host(r)
            if host is not None and host not in out:
                out.append(host)
    return out
