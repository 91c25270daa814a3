"""Hosts in the diagnosis: ranks whose dumps lie on another host, and hosts to leave out.

A job spans hosts, and each host keeps its own ranks' dumps on its own disk. A folder
copied from one host therefore lacks the other hosts' dumps: those ranks did not crash,
their files are elsewhere. The dumps carry the job's host table
(:class:`commscope.analyze.model.HostMap`), so the analyzer knows where they ran.

Algorithm (:func:`elsewhere_ranks`, :func:`elsewhere_findings`):

1. A rank with no dump here is *elsewhere* when the host table places it on a host that
   no dump here came from, and nothing here says it died: no fatal log of it, no
   unreadable file of it. It is never called crashed for that.
2. One ``dumps_elsewhere`` finding per such host: which ranks ran there, where their
   dumps went (``host:folder`` from the table), who here waits for them and in what
   (the wait-for graph), and how to give the analyzer the rest (copy the files, or pass
   several folders or archives). It blocks when a rank here waits for them: the job is
   stuck, and the cause is in the dumps that are not here. A present rank whose work
   failed (a dead peer) is mentioned: one of the absent ranks may have died.
"""

from __future__ import annotations

from typing import Any

from commscope.analyze.diagnose.context import Context
from commscope.analyze.diagnose.waits import WaitGraph, reaching
from commscope.analyze.model import FAILED, Finding, HostMap
from commscope.analyze.text import plural, rank_list, ranks_phrase

__all__ = ["elsewhere_ranks", "elsewhere_findings", "host_rows", "hosts_to_exclude"]


def elsewhere_ranks(ctx: Context) -> dict[str, list[int]]:
    """Step 1: host → its ranks whose dumps are on that host, not here."""
    unreadable = {u.rank for u in ctx.load.unreadable if u.rank is not None}
    missing = [r for r in ctx.expected if r not in ctx.load.dumps and r not in unreadable
               and r not in ctx.load.fatal]
    return ctx.hosts.elsewhere(missing)


def elsewhere_findings(ctx: Context, graph: WaitGraph,
                       away: dict[str, list[int]]) -> list[Finding]:
    """Step 2: one ``dumps_elsewhere`` per host of ``away``."""
    findings = []
    failed = sorted(r for r, d in ctx.load.dumps.items()
                    if any(t.status[i] & FAILED for t in d.tracks.values()
                           for i in range(max(0, len(t) - 4), len(t))))
    for host, ranks in away.items():
        waiting = sorted(reaching(set(ranks), graph))
        direct = [w for w in graph.edges() if w.target in ranks and w.waiter in ctx.load.dumps]
        folder = ctx.hosts.dump_dir(ranks)
        where = f"{host}:{folder}/" if folder else f"on {host}"
        text = (f"{ranks_phrase(ranks).capitalize()} ran on {host}, and no dump of {host} is "
                f"here: {'their' if len(ranks) > 1 else 'its'} dumps are in {where} (copy "
                "them here, or pass both folders or archives to `commscope analyze`)")
        if direct:
            first = direct[0]
            what = (f"{ctx.op_at(first.waiter, first.group, first.seq)} of "
                    f"{ctx.group_ref(first.group)}" if first.seq is not None
                    else f"{first.op} of {ctx.group_ref(first.group)}")
            verb = "waits" if len(waiting) == 1 else "wait"
            text += (f". {ranks_phrase(waiting).capitalize()} {verb} for them (first in "
                     f"{what}); which of {rank_list(ranks)} stopped first, and why, is in "
                     f"{host}'s dumps")
        if failed:
            text += (f". The work of {ranks_phrase(failed)} failed, as when a peer dies: a "
                     f"rank of {host} may have died")
        findings.append(Finding(
            kind="dumps_elsewhere", group=None, collective_seq_id=None, op=None,
            culprit_ranks=[], waiting_ranks=waiting, blocking=bool(direct),
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
