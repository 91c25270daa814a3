"""Plain data the analyzer passes between its steps: loaded ranks, signatures, findings.

Loading turns every rank's dump into a :class:`RankDump` whose collectives live in
compact per-group columns (:class:`Track`, ``array`` objects, not one dict per entry), so
thousands of ranks fit in memory. What a collective *is* (op, sizes, dtypes) is stored
once in a :class:`SigTable` and referred to by an integer everywhere else.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from commscope.hosttable import decode_table

__all__ = [
    "RETIRED",
    "STARTED",
    "COMPLETED",
    "FAILED",
    "TIMED_TAIL",
    "GAP",
    "Sig",
    "SigTable",
    "Track",
    "P2POp",
    "RankDump",
    "PrintRows",
    "PrintWhat",
    "Unreadable",
    "LoadResult",
    "FatalLog",
    "Creation",
    "Group",
    "Finding",
    "RankPlace",
    "HostMap",
    "DumpKind",
    "DEVICE_BACKENDS",
]

RETIRED = 1
"""Status bit: the recorder retired the work (finished, with or without an error)."""
STARTED = 2
"""Status bit: the work was seen started (``state`` "started" or "completed")."""
COMPLETED = 4
"""Status bit: the work was seen completed (``state`` "completed")."""
FAILED = 8
"""Status bit (commscope dumps): the work ended with an error (a dead peer, a timeout).
It is not a done bit: the rank was blocked in it until it failed."""
GAP = -1
"""Signature id of a sequence number a rank skipped inside its recorded range."""

DEVICE_BACKENDS = frozenset({"nccl", "xccl", "hccl", "rccl", "mccl"})
"""Backends whose calls return once the op is queued on a device: a rank's unfinished
records are a queue of device work, not the place its thread waits (gloo's calls
block the thread that made them)."""


@dataclass(frozen=True, slots=True)
class DumpKind:
    """What one dump is, as far as its content tells (nothing in a dump says it)."""

    backend: str
    """``nccl``, ``gloo``... from the records' names and the library version; ``""``
    when nothing tells."""
    device: bool
    """Calls return at once and run on a device queue (NCCL and the like: one of
    :data:`DEVICE_BACKENDS`, or a backend the dump itself names as one)."""
    active_only: bool | None
    """Only unfinished entries were kept (``onlyActive``, ``TORCH_INCLUDE_ONLY_ACTIVE=1``,
    an NVRx-style collector); ``None``: no evidence either way."""
    timing: bool | None
    """The device's start events were recorded (``TORCH_NCCL_ENABLE_TIMING``): a
    started entry is running, a scheduled one still queued; ``None``: unknown."""
    stacks: bool | None
    """The entries carry Python stacks; ``None``: not looked at."""

    def text(self) -> str:
        """``nccl, active entries only, timing off, no stacks``."""
        parts = [self.backend or "backend unknown"]
        if self.device or self.active_only:
            parts.append({True: "active entries only", False: "every entry",
                          None: "full or active-only unknown"}[self.active_only])
        if self.device:
            parts.append({True: "timing on", False: "timing off",
                          None: "timing unknown"}[self.timing])
        if self.stacks is not None:
            parts.append("stacks" if self.stacks else "no stacks")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Sig:
    """What one collective call was: op, sizes and dtypes, decoded once per distinct call."""

    profiling_name: str
    """As recorded, e.g. ``gloo:all_reduce`` or ``nccl:send 0->1``."""
    op: str
    """Canonical name from :mod:`commscope.collectives`, else the raw op word."""
    input_sizes: tuple[tuple[int, ...], ...] | None
    """Shapes of the inputs; ``None`` when the record's sizes were unreadable."""
    output_sizes: tuple[tuple[int, ...], ...] | None
    input_dtypes: tuple[str, ...] | None
    output_dtypes: tuple[str, ...] | None
    members: tuple[int, ...] = ()
    """For a coalesced group of records sharing one sequence number: their sig ids."""
    problem: str | None = None
    """Why part of the record could not be read (``None`` when all is well)."""
    root: int | None = None
    """The global rank a rooted op (broadcast, reduce, gather, scatter) named as its
    root, where the record says (ours, since issue 32)."""
    reduce_op: str | None = None
    """The reduction (``SUM``, ``MAX`` ...) of a reducing op, where the record says."""

    def sizes_text(self, every_arg: bool = False) -> str:
        """``[[4]] Float`` style text for messages, with the root where recorded and the
        reduce op when it is not ``SUM`` (``every_arg``: ``SUM`` too)."""
        if self.input_sizes is None:
            return "unreadable sizes"
        ins = [list(s) for s in self.input_sizes]
        outs = [list(s) for s in self.output_sizes or ()]
        dts = ", ".join(dict.fromkeys(self.input_dtypes or self.output_dtypes or ()))
        text = f"{ins}" if not outs or outs == ins else f"{ins} -> {outs}"
        extra = "".join((f", root {self.root}" if self.root is not None else "",
                         f", {self.reduce_op}" if self.reduce_op is not None
                         and (every_arg or self.reduce_op != "SUM") else ""))
        return f"{text} {dts}".strip() + extra


class SigTable:
    """Interning table of signatures: one id per distinct (name, sizes, dtypes) record."""

    def __init__(self) -> None:
        self.keys: dict[Any, int] = {}
        self.sigs: list[Sig] = []
        self.match_keys: list[int] = []
        """Per sig id, the id of what must agree across ranks (``signature.match_key``)."""
        self.match_ids: dict[Any, int] = {}
        self.match_values: list[Any] = []
        self.columns: dict[Any, Any] = {}
        """Converted signature/match-key columns shared between ranks (loading only)."""

    def __len__(self) -> int:
        return len(self.sigs)

    def match_id(self, value: Any) -> int:
        """Intern one match-key value; return its id."""
        found = self.match_ids.get(value)
        if found is None:
            found = self.match_ids[value] = len(self.match_values)
            self.match_values.append(value)
        return found

    def add(self, key: Any, sig: Sig, match_key: int) -> int:
        """Intern ``key`` → ``sig``; return its id (the existing one if known)."""
        found = self.keys.get(key)
        if found is not None:
            return found
        sid = len(self.sigs)
        self.keys[key] = sid
        self.sigs.append(sig)
        self.match_keys.append(match_key)
        return sid


TIMED_TAIL = 256
"""How many of a track's newest collectives keep their device times (the straggler
figures read no more: :data:`commscope.analyze.align.arrivals.WINDOW`)."""


@dataclass(slots=True)
class Track:
    """One rank's collectives in one group, dense by sequence number.

    Index ``i`` holds ``collective_seq_id == lo + i``. Columns are ``array`` objects;
    ``sig[i] == GAP`` when the rank has no record of that sequence number inside its
    range. Completion times are kept per dump, and only when loading for a timeline
    (:attr:`RankDump.ends`).
    """

    lo: int
    sig: array
    """Signature ids (``array('l')``)."""
    status: array
    """Bits ``RETIRED | STARTED | COMPLETED`` (``array('b')``)."""
    created: array
    """``time_created_ns`` (``array('q')``)."""
    index: array | range
    """Position of the (first) record in the rank's ``entries`` list (``array('l')``, or
    a ``range`` when the track is the whole file in order)."""
    mk: array | None = None
    """Match-key ids, filled in after loading (``array('l')``)."""
    duration: array | None = None
    """On a device backend with timing: how long the device spent in each of the newest
    :data:`TIMED_TAIL` collectives (ns, from ``duration_ms``; 0 when not recorded;
    ``array('q')``; position ``i`` of the track is ``i - (len(track) - len(duration))``
    here), else ``None``."""
    done: array | None = None
    """With :attr:`duration`: when each of them was seen completed
    (``time_discovered_completed_ns``, 0 when not; ``array('q')``)."""

    @property
    def hi(self) -> int:
        """Last sequence number held (``lo - 1`` when empty)."""
        return self.lo + len(self.sig) - 1

    def __len__(self) -> int:
        return len(self.sig)


@dataclass(slots=True)
class P2POp:
    """One send or recv record."""

    group: str
    p2p_seq: int
    op: str
    """``send`` or ``recv``."""
    peer: int | None
    """Global rank of the other side when known (ours records it; native names hold
    group-local ranks, resolved once membership is known)."""
    local_src: int | None
    local_dst: int | None
    sig: int
    status: int
    created: int
    index: int
    ordinal: int | None = None
    """Its place among the rank's ops of the same channel (group, op, peer), counted from
    the job's start: progress records carry it (they hold a few records only)."""
    batch: bool = False
    """One op of a coalesced batch (``batch_isend_irecv`` on NCCL): its own entry has no
    events and never completes; its status is the batch's (``RankDump.batches``)."""
    settled: bool = True
    """Its state is known. False for an active-only dump's lone send/recv entry that may
    be a finished batch of one (whose closing entry was dropped, while its own entry,
    which never finishes, stayed) or an op of its own still unfinished."""


@dataclass(slots=True)
class RankDump:
    """Everything the analyzer keeps of one rank's dump."""

    rank: int
    path: str
    source: str
    """``"commscope"`` or ``"pytorch"``."""
    version: str
    world_size: int | None = None
    hostname: str | None = None
    pid: int | None = None
    dump_reason: str | None = None
    dump_time_ns: int | None = None
    n_entries: int = 0
    first_record_id: int | None = None
    first_created_ns: int | None = None
    """``time_created_ns`` of the oldest record kept."""
    last_created_ns: int | None = None
    """``time_created_ns`` of the newest record."""
    wrapped: bool = False
    """The ring dropped older records (first ``record_id`` > 0)."""
    group_desc: dict[str, str] = field(default_factory=dict)
    group_pg_id: dict[str, int] = field(default_factory=dict)
    config: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Trustworthy ``pg_config`` memberships (group name → global ranks)."""
    world_hint: tuple[int, ...] | None = None
    """gloo's ``{'': {'ranks': '[0, …]'}}``: the default group's ranks, when not empty."""
    pg_status: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    tracks: dict[str, Track] = field(default_factory=dict)
    p2p: list[P2POp] = field(default_factory=list)
    p2p_totals: dict[tuple[str, str, int], int] | None = None
    """(group, ``send``/``recv``, peer) -> how many such ops the rank issued since the job
    started, when its record says (progress records); ``None`` for dumps, whose records
    are the history."""
    pending: list[tuple[str, int, int]] = field(default_factory=list)
    """Unfinished collectives in record order: (group, seq, entry index); p2p use seq -1."""
    last: tuple[str, int, int] | None = None
    """The newest record: (group, seq or -1 for p2p, entry index)."""
    backend: str = ""
    exception: tuple[str, str, tuple[str, str, int, str] | None] | None = None
    """(type, message, where raised) of the exception the dump was written for (ours)."""
    threads: bool = False
    """The dump carries every thread's stack at dump time (ours)."""
    main_place: tuple[str, str, int, str] | None = None
    """Where the main thread was at dump time: (function, file, line, source line); below
    a signal handler it was running, where the handler interrupted the program."""
    main_blocked: bool = False
    """The main thread waits on a lock, a queue, a join or a future (not in a collective)."""
    blocked_threads: list[tuple[str, tuple[str, str, int, str] | None]] = field(
        default_factory=list)
    """Other threads blocked the same way at dump time: (name, where)."""
    handler: tuple[str, tuple[str, str, int, str] | None] | None = None
    """The main thread was inside a signal handler at dump time: (signal, where)."""
    problems: list[str] = field(default_factory=list)
    """What was wrong in parts of the file that was otherwise used."""
    sig_keys: list[Any] | None = None
    """Local signature keys before the dump's sig ids are mapped to the shared table."""
    local_sigs: list[Sig] | None = None
    job: tuple[str, int | None, int | None, int | None] | None = None
    """Ours: ``(id, restart, started_ns, world_size)`` of the job attempt it belongs to."""
    creations: list[Creation] = field(default_factory=list)
    """Ours: the groups this rank created or was creating (``commscope_group_creations``)."""
    handler_ops: list[tuple[str, str, int, int]] = field(default_factory=list)
    """Ours: records issued from a signal handler (``signal, group, seq, entry index``),
    which are not where the rank's program stopped; kept out of the tracks."""
    ends: array | None = None
    """When each record of the file ended (ns, 0: not recorded), by position in the file;
    kept only when loading for a timeline (``end_times=True``)."""
    splits: dict[tuple[str, int], tuple[tuple[int, ...] | None, tuple[int, ...] | None]] = field(
        default_factory=dict)
    """Ours: (group, seq) -> (input, output) split sizes of each all_to_all record that has
    them (``all_to_all_single`` with explicit splits)."""
    place: RankPlace | None = None
    """Ours: where this rank ran (``commscope_place``: host, pid, node and local rank,
    dump folder); older dumps: built from ``hostname`` and ``pid``."""
    host_table: dict[str, Any] | None = None
    """Ours: the job's host table as the dump holds it (``commscope_hosts``, decoded by
    :class:`HostMap`; kept from one dump per host only, since all ranks carry the same)."""
    thread_deaths: list[tuple[str, str, str, tuple[str, str, int, str] | None]] = field(
        default_factory=list)
    """Ours: threads of the rank that died of an uncaught exception while the process
    went on (``commscope_thread_deaths``): (thread, type, message, where raised)."""
    clock_offset_ns: int | None = None
    """Ours: this rank's clock minus rank 0's, as the rank measured it
    (``commscope_clock``); every time above is already moved onto rank 0's clock."""
    clock_uncertainty_ns: int | None = None
    """How far that measurement may be off (half its round trip)."""
    prints: dict[str, PrintRows] = field(default_factory=dict)
    """Ours: group name -> the newest folds of the rank's running fingerprint of that
    group (``commscope_fingerprints``, :mod:`commscope.flight.record.agree.fingerprint`)."""
    print_table: list[PrintWhat] = field(default_factory=list)
    """What the folds of :attr:`prints` hold, by the index each fold names."""
    print_bits: int = 64
    """How many low bits of each fingerprint the dump keeps (a progress record: 32)."""
    kind: DumpKind | None = None
    """What the dump is: backend, full or active-only, timing (:mod:`.read.kind`)."""
    batches: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(group, p2p seq) -> (status, entry index) of each coalesced batch's closing entry
    (``nccl:coalesced``), which owns the batch's events."""
    lib_version: str | None = None
    """The communication library's version (``comm_lib_version``/``nccl_version``)."""
    ids_contiguous: bool = True
    """The records' ``record_id``s follow each other (a full dump); gaps mean entries
    were filtered out (an active-only dump)."""
    started_seen: bool = False
    """Some record carries a discovered start time (timing on, for device backends)."""
    done_seen: bool = False
    """Some record finished (completed or retired)."""
    active_hint: bool | None = None
    """What the records' ids say of an active-only dump (:func:`.read.kind.looks_active_only`)."""


@dataclass(frozen=True, slots=True)
class PrintWhat:
    """What one fingerprint fold holds: the op and what every rank must pass alike."""

    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    root: int | None
    reduce_op: str | None

    def text(self) -> str:
        """``all_reduce float32[4, 8]`` (``, root 2``, ``, SUM`` where recorded)."""
        shapes = ", ".join(f"{d}[{', '.join(map(str, s))}]"
                           for d, s in zip(self.dtypes, self.sizes)) if self.sizes else \
            "/".join(self.dtypes)
        extra = "".join([f", root {self.root}" if self.root is not None else "",
                         f", {self.reduce_op}" if self.reduce_op else ""])
        return f"{self.op} {shapes}{extra}".strip()


@dataclass(slots=True)
class PrintRows:
    """One group's newest fingerprint folds on one rank, oldest first."""

    seqs: list[int]
    cums: list[int]
    what: list[int]
    """Index into :attr:`RankDump.print_table` (-1: not said)."""
    arrived_ns: list[int]
    """When the rank issued each (ns, on rank 0's clock where the dump says its offset)."""


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank ran: its host, its process and the folder its dump went to."""

    host: str
    pid: int | None = None
    dump_dir: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None


class HostMap:
    """Which host every rank of the job ran on, from every dump at hand: each dump's own
    place and the host tables they carry (a rank whose dump is elsewhere is still placed
    by its peers' tables). The one place every stage asks "where did rank r run"."""

    def __init__(self, dumps: dict[int, RankDump]) -> None:
        self.places: dict[int, RankPlace] = {}
        """Rank → where it ran (only ranks some dump tells about)."""
        for rank in sorted(dumps):  # the first table that reads places everyone, once
            table = dumps[rank].host_table
            decoded = decode_table(table) if table is not None else None
            if decoded:
                self.places = {
                    r: RankPlace(host=host[:255], pid=pid, dump_dir=where[:4096] or None,
                                 node_rank=node)
                    for r, (host, where, pid, node) in decoded.items()}
                break
        for rank, d in dumps.items():
            if d.place is not None:
                self.places[rank] = d.place  # a rank's own word wins
        self.present_hosts: set[str] = {d.place.host for d in dumps.values()
                                        if d.place is not None}
        """Hosts at least one dump here came from."""

    def host(self, rank: int) -> str | None:
        """The host rank ``rank`` ran on, when known."""
        place = self.places.get(rank)
        return place.host if place is not None else None

    def label(self, rank: int) -> str:
        """``hostB, pid 4242`` (what is known of it), or ``""``."""
        place = self.places.get(rank)
        if place is None:
            return ""
        return place.host + (f", pid {place.pid}" if place.pid is not None else "")

    def hosts(self) -> dict[str, list[int]]:
        """Host → its ranks (sorted), hosts in order of their first rank."""
        out: dict[str, list[int]] = {}
        for rank in sorted(self.places):
            out.setdefault(self.places[rank].host, []).append(rank)
        return out

    def elsewhere(self, missing: list[int]) -> dict[str, list[int]]:
        """Of ``missing`` ranks (no dump here), those that ran on a host none of this
        folder's dumps came from, by host: their files are on that host, not lost."""
        out: dict[str, list[int]] = {}
        for rank in missing:
            host = self.host(rank)
            if host is not None and host not in self.present_hosts:
                out.setdefault(host, []).append(rank)
        return out

    def dump_dir(self, ranks: list[int]) -> str | None:
        """The dump folder these ranks reported (the first one known)."""
        for rank in ranks:
            place = self.places.get(rank)
            if place is not None and place.dump_dir:
                return place.dump_dir
        return None

    def __bool__(self) -> bool:
        return bool(self.places)


@dataclass(frozen=True, slots=True)
class Creation:
    """One process-group creation a rank took part in (our dumps only)."""

    seq: int
    """The rank's creation count (1 for its first group)."""
    name: str
    desc: str
    ranks: tuple[int, ...]
    done: bool
    """It returned (a creation that raised counts as done: the rank went on)."""
    started_ns: int
    place: tuple[str, str, int, str] | None
    """The user's line that asked for the group: (function, file, line, source)."""

    @property
    def identity(self) -> tuple[str, str, tuple[int, ...]]:
        """What the members of one creation agree on: name, description, members."""
        return (self.name, self.desc, self.ranks)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A file that was skipped or only partly used, and why."""

    file: str
    error: str
    rank: int | None = None
    """The rank the file was (or would have been) for, when known."""


@dataclass(frozen=True, slots=True)
class FatalLog:
    """What a rank's ``.fatal`` file (Python's faulthandler, armed by the recorder) says
    about how it died without a dump."""

    rank: int
    path: str
    error: str
    """``Fatal Python error: Aborted``, ``Segmentation fault``, ..."""
    frames: tuple[tuple[str, str, int], ...]
    """The main thread's frames, innermost first: (function, file, line)."""


@dataclass(slots=True)
class LoadResult:
    """What loading a folder of dumps gave."""

    dumps: dict[int, RankDump]
    unreadable: list[Unreadable]
    sigs: SigTable
    ignored: list[str] = field(default_factory=list)
    """Files that do not look like rank dumps at all (no rank number in the name)."""
    fatal: dict[int, FatalLog] = field(default_factory=dict)
    """Rank → its non-empty fatal log (a rank that died in C)."""
    root: str = ""
    other_jobs: list[Unreadable] = field(default_factory=list)
    """Files of other jobs (an earlier attempt, a reused folder), set aside with why."""


@dataclass(frozen=True, slots=True)
class Group:
    """One process group as the analyzer understands it."""

    key: str
    name: str
    desc: str
    ranks: tuple[int, ...]
    membership: str
    """Where ``ranks`` came from: ``pg_config``, ``world`` or ``entries``."""
    short: str = ""
    """For a hash-named group (``new_group(..., use_local_synchronization=True)`` names
    groups by a 40-hex-digit sha1): the shortest prefix, 8 digits or more, that no other
    group of the job shares; ``""`` for other names."""

    @property
    def display(self) -> str:
        """The name to show people: ``short`` for hash names, else ``name``."""
        return self.short or self.name

    def label(self) -> str:
        """``group 0 (default_pg, ranks 0-3)``; ``group mesh_dp (ranks 1, 3; d876ba23)``."""
        from commscope.analyze.text import rank_list

        ranks = rank_list(self.ranks)
        if self.short:
            if self.desc and self.desc != "undefined":
                return f"group {self.desc} (ranks {ranks}; {self.short})"
            return f"group {self.short} (ranks {ranks})"
        desc = f"{self.desc}, " if self.desc and self.desc != self.name else ""
        return f"group {self.name} ({desc}ranks {ranks})"

    def ref(self) -> str:
        """A short mention: ``group 0``; ``group mesh_dp (d876ba23)``."""
        if self.short and self.desc and self.desc != "undefined":
            return f"group {self.desc} ({self.short})"
        return f"group {self.display}"

    def to_json(self) -> dict[str, Any]:
        """The ``group`` object of the analysis JSON (the full name)."""
        return {"name": self.name, "desc": self.desc, "ranks": list(self.ranks)}


@dataclass(slots=True)
class Finding:
    """One thing the analyzer concluded, worded for people and typed for programs."""

    kind: str
    group: Group | None
    collective_seq_id: int | None
    op: str | None
    culprit_ranks: list[int]
    waiting_ranks: list[int]
    message: str
    blocking: bool = False
    """Part of why the job stopped (as opposed to a bug it survived, or a remark)."""
    victims: list[int] = field(default_factory=list)
    """Ranks this cause killed (gloo aborts a receiver of a mismatched message): gone
    because of it, never a cause of their own."""
    details: dict[str, Any] = field(default_factory=dict)
    """Extra facts for the text/HTML reports (not part of the JSON shape)."""

    def to_json(self) -> dict[str, Any]:
        """One entry of ``findings`` in the analysis JSON."""
        return {
            "kind": self.kind,
            "group": self.group.to_json() if self.group else None,
            "collective_seq_id": self.collective_seq_id,
            "op": self.op,
            "culprit_ranks": sorted(self.culprit_ranks),
            "waiting_ranks": sorted(self.waiting_ranks),
            "victims": sorted(self.victims),
            "message": self.message,
        }
