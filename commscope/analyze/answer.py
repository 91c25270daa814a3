"""The answer on the first screen: a headline, the root cause, the stuck places, what next.

Every report (text, HTML, ``--json``'s ``answer``) opens with the same few lines, made
here once from the findings (:func:`make_answer`):

1. **headline**: the verdict and, when something is wrong, who and what in a few words
   (``HANG: rank 6's device stopped``, ``CRASH: rank 3 raised ValueError``);
2. **root cause**: one line per root-cause finding (at most three): its ranks, their
   host where the job spans several, the user's line, and what they did;
3. **stuck**: one line per stuck place (:func:`commscope.analyze.summary.stuck_lines`:
   every line told once, alike waits folded, at most ten);
4. **next**: what to look at or do, by the kind of root cause (at most three);
5. **notes**: the findings that blame nobody, folded into one line per kind (``14
   groups: ranks 0-15 kept only their newest records``).

The findings below them say the same at length, with their evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from commscope.analyze.model import Finding, HostMap, LoadResult
from commscope.analyze.summary import call_text, culprit_line, group_name, who_text
from commscope.analyze.text import plural, ranks_phrase

__all__ = ["Answer", "make_answer", "is_note", "NOTE_KINDS", "MAX_ROOTS"]

MAX_ROOTS = 3
"""Root-cause lines shown; more are counted."""

NOTE_KINDS = ("truncated_history", "thread_died", "unreadable_dump", "dumps_elsewhere")
"""Kinds that are notes when they do not block: they blame nobody for a stop."""


def is_note(f: Finding) -> bool:
    """A finding the first screen folds into a note: it blames nobody for a stop (its
    kind is in :data:`NOTE_KINDS`, or it is a stall the dump caught finishing)."""
    if f.blocking:
        return False
    return f.kind in NOTE_KINDS or (f.kind == "stalled_collective"
                                    and bool(f.details.get("caught")))


@dataclass
class Answer:
    """What the first screen says (see module doc)."""

    headline: str
    root: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``answer`` object of the analysis JSON."""
        return {"headline": self.headline, "root_cause": list(self.root),
                "stuck": list(self.stuck), "next": list(self.next), "notes": list(self.notes)}


def _short(f: Finding, load: LoadResult) -> str:
    """The root cause in a few words, for the headline."""
    who = ranks_phrase(f.culprit_ranks) if f.culprit_ranks else "the job"
    whose = f"{who}'s" if f.culprit_ranks else "a"
    side = f.details.get("side") if isinstance(f.details, dict) else None
    kind = f.kind
    if kind == "device_stopped":
        return f"{whose} device stopped" if len(f.culprit_ranks) == 1 else \
            f"the devices of {who} stopped"
    if kind == "crashed_rank":
        exc = [load.dumps[r].exception for r in f.culprit_ranks
               if r in load.dumps and load.dumps[r].exception is not None]
        if exc:
            return f"{who} raised {exc[0][0]}"
        gone = [r for r in f.culprit_ranks if r not in load.dumps]
        return f"{who} died" + (" (no dump)" if gone else "")
    if kind == "missing_rank":
        if side == "thread":
            return f"{whose} thread stopped issuing ({call_text(f)} never issued)"
        return f"{who} never joined {call_text(f)}"
    if kind == "p2p_unmatched":
        partner = {"send": "recv", "recv": "send"}.get(f.op or "", "send/recv")
        return f"{who} never posted the matching {partner} in {group_name(f.group)}"
    if kind == "p2p_deadlock":
        return f"{who} deadlock in send/recv"
    if kind == "cross_group_deadlock":
        return f"{who} issue collectives of {group_name(f.group)} and others in another order"
    if kind.endswith("_mismatch"):
        what = kind.removesuffix("_mismatch").replace("_", " ")
        return f"{who} disagree{'s' if len(f.culprit_ranks) == 1 else ''} about the " \
               f"{what} of {call_text(f)}"
    if kind == "stalled_collective":
        return f"every member is inside {call_text(f)} and none finished it"
    if kind == "dumps_elsewhere":
        return "ranks of other hosts have their dumps there, not here"
    return kind.replace("_", " ")


_UNDECIDED = {
    "stalled_collective": "ops were in flight and no record explains a wait (caught running, "
                          "or a stuck network)",
    "unreadable_dump": "a dump could not be read (notes)",
    "truncated_history": "the rings wrapped past where the ranks parted (notes)",
    "dumps_elsewhere": "the dumps of some ranks are on other hosts (notes)",
}
"""Why an ``incomplete`` verdict cannot decide, by the kind of its first finding."""

_VERDICT = {"healthy": "HEALTHY", "hang": "HANG", "crash": "CRASH", "desync": "DESYNC",
            "incomplete": "INCOMPLETE"}


def _headline(verdict: str, roots: list[Finding], findings: list[Finding],
              load: LoadResult) -> str:
    head = _VERDICT.get(verdict, verdict.upper())
    if verdict == "healthy":
        slow = sorted({r for f in findings if f.kind == "straggler" for r in f.culprit_ranks})
        caught = any("caught_running" in f.details or f.details.get("caught")
                     for f in findings)
        text = "nothing is stuck"
        if caught:
            text += " (the dumps caught ops in flight)"
        if slow:
            text += f"; {ranks_phrase(slow)} {'is' if len(slow) == 1 else 'are'} slow " \
                    "(stragglers, below)"
        elif not any(f.kind.endswith("_mismatch") for f in findings):
            text += "; the ranks agree on every call recorded"
        return f"{head}: {text}"
    if verdict == "incomplete" and not roots:
        first = next((f for f in findings if f.kind != "straggler"), None)
        kind = first.kind if first is not None else ""
        why = _UNDECIDED.get(kind, kind.replace("_", " ") or "nothing to read")
        if first is not None and first.details.get("no_records"):
            why = "they hold no record (notes)"
        return f"{head}: the dumps cannot decide: {why}"
    if not roots:
        return f"{head}: see the findings below"
    parts = [_short(f, load) for f in roots[:2]]
    more = f" (and {plural(len(roots) - 2, 'other cause')})" if len(roots) > 2 else ""
    return f"{head}: {'; '.join(parts)}{more}"


def _next(f: Finding, load: LoadResult, hosts: HostMap) -> list[str]:
    """What to look at or do for one root cause."""
    ranks = sorted(f.culprit_ranks)
    who = ranks_phrase(ranks) if ranks else "the ranks named"
    side = f.details.get("side") if isinstance(f.details, dict) else None
    kind = f.kind
    several = len(hosts.hosts()) > 1
    host = ", ".join(dict.fromkeys(h for h in (hosts.host(r) for r in ranks) if h))
    restart = f"restart without {host} (--json: exclude_hosts)" if several and host else ""
    one = len(ranks) == 1
    if kind == "device_stopped":
        out = [(f"check {who}'s GPU: its log" if one else f"check the GPUs of {who}: their logs")
               + " for a CUDA error, `nvidia-smi -q` and the kernel log (`dmesg`) for Xid "
               "errors"]
        return out + ([restart] if restart else [])
    if kind == "crashed_rank":
        out = [(f"read {who}'s log for why it stopped" if one else
                f"read the logs of {who} for why they stopped")
               + " (an exception, an OOM kill, a signal)"]
        return out + ([restart] if restart else [])
    if kind in ("missing_rank", "p2p_unmatched"):
        stacks = any(load.dumps.get(r) is not None and load.dumps[r].main_place is not None
                     for r in ranks)
        if side == "thread" and not stacks:
            pids = [load.dumps[r].pid for r in ranks if r in load.dumps and load.dumps[r].pid]
            pid = f" --pid {pids[0]}" if pids else " --pid <its pid>"
            whose = f"{who}'s Python is" if one else f"the Python threads of {who} are"
            return [f"see where {whose}: `py-spy dump{pid}` on "
                    f"{'its' if one else 'each'} machine shows a thread holding the GIL or a "
                    "call that never returns",
                    "if it skipped the call instead, find the branch that leaves it out"]
        if " at " not in culprit_line(f, load, hosts):  # the dumps do not say where
            return [f"find where {who} stopped: {'its' if one else 'their'} log, or "
                    f"`py-spy dump --pid <pid>` on {'its' if one else 'each'} machine; "
                    f"{'it' if one else 'they'} skipped the call or never got to it"]
        lines = f"{who}'s line" if one else f"the lines of {who}"
        return [f"look at {lines} above: {'it' if one else 'they'} skipped the call, or "
                f"wait{'s' if one else ''} there for something that never comes"]
    if kind == "p2p_deadlock":
        return ["post both sides of each exchange in one batch_isend_irecv, or reorder the "
                "sends and recvs so one side receives first"]
    if kind == "cross_group_deadlock":
        return ["issue the groups' collectives in the same order on every rank"]
    if kind.endswith("_mismatch"):
        return [f"make every rank pass the same arguments to {call_text(f)} "
                "(the finding below shows each side)"]
    if kind == "stalled_collective":
        return ["dump again in a minute (`commscope dump`): the same ops unfinished means a "
                "stuck transport; look at the network and NCCL (NCCL_DEBUG=INFO)"]
    if kind == "dumps_elsewhere":
        return ["analyze every host's dump folder together (several folders or archives: "
                "docs/hosts.md)"]
    return []


def _note_line(kind: str, notes: list[Finding]) -> str:
    """One line for every note of one kind."""
    if kind == "truncated_history":
        ranks = sorted({r for f in notes for r in f.details.get("ranks", f.culprit_ranks)})
        groups = len({f.group.key for f in notes if f.group is not None})
        if not groups and not ranks:  # no record at all: the finding says why itself
            return notes[0].message
        undecided = any(f.details.get("undecided") for f in notes)
        what = ("hold no record of groups they belong to" if undecided else
                "kept only their newest records (their rings wrapped)")
        return (f"{plural(groups, 'group')}: {ranks_phrase(ranks)} {what}; older "
                "collectives were compared among the other ranks only")
    if kind == "thread_died":
        return "; ".join(f.message for f in notes[:2])
    if len(notes) == 1:
        return notes[0].message
    return f"{plural(len(notes), kind.replace('_', ' ') + ' note')}: " + notes[0].message


_MERGED_KINDS = ("device_stopped", "crashed_rank", "missing_rank", "p2p_unmatched")
"""Root causes told together in the headline and what next when several findings of
one kind (and side) blame different ranks: ``the devices of ranks 2, 13 stopped``."""


def _merged(roots: list[Finding]) -> list[Finding]:
    """``roots`` with the findings of one kind of :data:`_MERGED_KINDS` (and one side,
    one exception or none) joined into the first of them, culprits together."""
    out: list[Finding] = []
    at: dict[tuple[Any, ...], int] = {}
    for f in roots:
        side = f.details.get("side") if isinstance(f.details, dict) else None
        key = (f.kind, side, f.kind == "crashed_rank")
        if f.kind not in _MERGED_KINDS or key not in at:
            if f.kind in _MERGED_KINDS:
                at[key] = len(out)
            out.append(f)
            continue
        first = out[at[key]]
        out[at[key]] = replace(first, culprit_ranks=sorted(set(first.culprit_ranks)
                                                           | set(f.culprit_ranks)))
    return out


def make_answer(verdict: str, findings: list[Finding], load: LoadResult, hosts: HostMap,
                stuck: list[str]) -> Answer:
    """The first screen of one analysis (see module doc)."""
    roots = [f for f in findings if f.blocking and (f.culprit_ranks or f.kind in
                                                    ("stalled_collective",))]
    if not roots and verdict in ("desync", "crash"):
        roots = [f for f in findings if f.culprit_ranks and f.kind not in NOTE_KINDS][:1]
    lines = []
    for f in roots[:MAX_ROOTS]:
        line = culprit_line(f, load, hosts) or \
            f"{who_text(sorted(f.waiting_ranks), hosts)} — {_short(f, load)}"
        if line not in lines:
            lines.append(line)
    if len(roots) > MAX_ROOTS:
        more = plural(len(roots) - MAX_ROOTS, "more root cause")
        lines.append(f"... and {more} (findings below)")
    merged = _merged(roots)
    steps: list[str] = []
    for f in merged[:2] or [f for f in findings if not is_note(f)][:1]:
        for step in _next(f, load, hosts):
            if step not in steps:
                steps.append(step)
    notes: dict[str, list[Finding]] = {}
    for f in findings:
        if is_note(f):
            notes.setdefault(f.kind, []).append(f)
    note_lines = [_note_line(kind, fs) for kind, fs in notes.items()]
    return Answer(headline=_headline(verdict, merged, findings, load), root=lines,
                  stuck=[line for line in stuck if line not in lines], next=steps[:3],
                  notes=note_lines)
