"""Every sentence the analyzer writes, on every real dump folder we keep: PyTorch's native
gloo dumps, ours, and the NCCL corpus (full, active-only and NVRx forms), read for
template leaks and grammar; then the same dumps with fields taken away (stacks, hosts,
``pg_status``, timing), read for what the sentences say when a field is absent.

What "a sentence" is: the first screen (:class:`commscope.analyze.answer.Answer`: its
headline, root cause, stuck, next and notes lines) and every finding's message.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commscope.analyze import analyze
from commscope.analyze.present.report import format_report
from commscope.analyze.read.load import read_dump_file
from commscope.analyze.synth import write_dump

DATA = Path(__file__).resolve().parents[1] / "data"


def _dump_folders() -> list[Path]:
    out = []
    for p in sorted(DATA.rglob("*")):
        if p.is_dir() and "comm" not in p.relative_to(DATA).parts[:1] and any(
                f.is_file() and ("rank" in f.name or f.name.startswith("_dump"))
                for f in p.iterdir()):
            out.append(p)
    return out


FOLDERS = _dump_folders()

LEAKS = {
    "a Python None or nan": re.compile(r"\bNone\b|\bnan\b"),
    "a p2p op with no direction": re.compile(r"to/from"),
    "an empty activity": re.compile(r"no collective recorded"),
    "'at' before no place": re.compile(r"\bat no stack"),
    "a count of one in the plural": re.compile(
        r"(?<![=\d])\b1 (ranks|groups|records|collectives|ops|files|places|causes|notes)\b"),
    "one rank, a plural verb": re.compile(
        r"(?<![,\d-] )(?<!-)\b[Rr]ank \d+ (wait|are|have|belong|were|keep|hold)\b"),
    "several ranks, a singular verb": re.compile(
        r"\b[Rr]anks \d+(?:(?:, |-)\d+)+ (waits|is|has|belongs|was|keeps|holds)\b"),
    "a sequence number that is none": re.compile(r"#-1\b|#0\b"),
    "an article before a number": re.compile(r"\ba (collective|call) #\d"),
    "a doubled word": re.compile(r"\b(the|of|in|a|and|to|is|it) \1\b"),
    "an empty list of ranks or a count of none": re.compile(
        r"\branks none\b|(?<![\d.,])\b0 (ranks|groups|records|collectives|ops)\b"),
}


def _sentences(a) -> list[str]:
    ans = a.answer
    return [ans.headline, *ans.root, *ans.stuck, *ans.next, *ans.notes,
            *(f.message for f in a.findings)]


def test_the_folders_cover_every_kind_of_dump():
    kinds = set()
    for folder in FOLDERS:
        a = analyze(folder)
        for d in a.load.dumps.values():
            kinds.add((d.source, d.kind.backend if d.kind else "", bool(d.kind and
                                                                         d.kind.active_only)))
    assert ("pytorch", "gloo", False) in kinds  # PyTorch's native gloo dumps
    assert ("commscope", "gloo", False) in kinds  # ours
    assert ("pytorch", "nccl", False) in kinds and ("pytorch", "nccl", True) in kinds
    assert len(FOLDERS) > 200


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(DATA)))
def test_no_template_leaks_and_the_answer_on_the_first_screen(folder):
    a = analyze(folder)
    for text in _sentences(a):
        for what, pattern in LEAKS.items():
            m = pattern.search(text)
            assert m is None, f"{what}: ...{text[max(0, m.start() - 60):m.end() + 40]}..."
    for f in a.findings:
        assert f.message[:1].isupper() and f.message.rstrip().endswith((".", ")")), f.message
    ans = a.answer
    assert ans.headline.startswith(a.verdict.upper() + ":"), ans.headline
    first = [*ans.root, *ans.stuck, *ans.next, *ans.notes]
    assert len(first) == len(set(first)), first  # every line told once
    assert len(ans.root) <= 4 and len(ans.stuck) <= 10 and len(ans.next) <= 3
    # the first screen of the text report holds the answer: verdict, root cause, next
    head = format_report(a).splitlines()[:20]
    assert any(line.startswith("verdict: ") for line in head)
    blamed = sorted({r for f in a.findings if f.blocking for r in f.culprit_ranks})
    if blamed:
        shown = "\n".join(head)
        assert re.search(rf"\brank[s]? (\d+(, |-))*{blamed[0]}\b", shown), shown


_STRIP = {
    "no stacks": lambda d: [e.pop("frames", None) for e in d.get("entries", [])],
    "no hosts or pids": lambda d: [d.pop(k, None) for k in ("hostname", "pid", "commscope_hosts",
                                                            "commscope_place")],
    "no pg_status": lambda d: d.pop("pg_status", None),
    "no timing": lambda d: [e.update(time_discovered_started_ns=None,
                                     time_discovered_completed_ns=None)
                            or e.pop("duration_ms", None) for e in d.get("entries", [])],
}
STRIPPED = ["missing_rank", "crashed_rank", "p2p_unmatched", "scenarios/mesh2d_stall_one_rank/ours",
            "scenarios/crash_raise/ours", "nccl_scenarios/gpu_error_ep/full",
            "nccl_scenarios/gil_hold/full"]


@pytest.mark.parametrize("what", sorted(_STRIP))
@pytest.mark.parametrize("name", STRIPPED)
def test_what_the_sentences_say_when_a_field_is_absent(tmp_path, name, what):
    src = DATA / name
    before = analyze(src)
    for f in sorted(p for p in src.iterdir() if p.is_file() and "rank" in p.name):
        data = read_dump_file(str(f))
        _STRIP[what](data)
        rank = re.search(r"(\d+)", f.name.split(".")[0].rsplit("_", 1)[-1]).group(1)
        write_dump(data, str(tmp_path / f"rank_{rank}"))
    after = analyze(tmp_path)
    assert after.verdict == before.verdict, (what, after.answer.headline)
    for text in _sentences(after):
        for leak, pattern in LEAKS.items():
            assert pattern.search(text) is None, (what, leak, text)
    if what == "no stacks":  # the records' stacks are gone: the sentences say so
        told = " ".join(_sentences(after))
        assert "no stack recorded" in told, told
