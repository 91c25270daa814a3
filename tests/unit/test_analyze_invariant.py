"""The diagnosis invariant, property-tested over generated histories.

Each example plays a random program on 2-6 ranks with :class:`SyntheticJob`: collectives
of the default group and of a subgroup, some issued by only part of their members or
left stuck, send/recv pairs posted on both sides or on one only; some ranks leave no
dump. Whatever the history:

* if any rank has an unfinished op at dump time, or a rank left no dump, the verdict
  is never ``healthy`` (a collective all members issued alike and a later one of its
  group finished on that rank is finished: gloo runs a group's calls in turn);
* the text report, the JSON, the Perfetto trace and the HTML report state the same
  verdict, and the groups table never shows a rank waiting under a healthy verdict;
* no finding names a rank both as a culprit and as waiting, and every rank it names
  is one of the job's; no finding blames a rank an earlier finding names as its victim.
"""

from __future__ import annotations

import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commscope.analyze import analyze, format_report
from commscope.analyze.present.export import html_report, perfetto_trace
from commscope.analyze.synth import SyntheticJob


@st.composite
def histories(draw):
    world = draw(st.integers(2, 6))
    sub = draw(st.lists(st.integers(0, world - 1), min_size=2, max_size=world, unique=True))
    steps = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["coll", "coll", "sub", "p2p"]))
        if kind == "p2p":
            src = draw(st.integers(0, world - 1))
            dst = draw(st.integers(0, world - 1).filter(lambda d, s=src: d != s))
            steps.append(("p2p", src, dst, draw(st.sampled_from(["both", "both", "send", "recv"]))))
        else:
            members = list(range(world)) if kind == "coll" else sorted(sub)
            issuing = draw(st.one_of(st.just(members), st.lists(
                st.sampled_from(members), min_size=1, max_size=len(members), unique=True)))
            steps.append((kind, sorted(issuing), draw(st.booleans()) and draw(st.booleans()),
                          draw(st.sampled_from(["all_reduce", "broadcast", "all_gather"]))))
    dumped = draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True))
    return world, sorted(sub), steps, sorted(dumped)


def _play(world, sub, steps):
    job = SyntheticJob(world, backend="gloo")
    g = job.group("1", "sub", sub)
    for step in steps:
        if step[0] == "p2p":
            _, src, dst, post = step
            job.p2p(src, dst, post=post)
        else:
            kind, issuing, stuck, op = step
            job.collective(op, group="0" if kind == "coll" else g, ranks=issuing, stuck=stuck)
    return job


def _unfinished(dumps: dict[int, dict], members: dict[str, list[int]]) -> bool:
    """Whether a rank has a record not marked retired that gloo may not have finished.
    A collective every member dumped and issued alike (same op and sizes), followed on
    that rank by a later record of its group, alike too, that is retired, finished: a group's
    collectives finish in turn, and gloo cannot stay inside one all its members posted
    alike (only the mark lags: PyTorch retires a gloo call just after it returns)."""
    def key(e: dict) -> tuple:
        return (e["profiling_name"], str(e["input_sizes"]), str(e["output_sizes"]))

    def alike(e: dict) -> bool:
        group, seq = e["process_group"][0], e["collective_seq_id"]
        held = [next((x for x in dumps[q]["entries"] if x["process_group"][0] == group
                      and x["collective_seq_id"] == seq and not x["is_p2p"]), None)
                if q in dumps else None for q in members.get(group, [])]
        return not e["is_p2p"] and all(x is not None and key(x) == key(e) for x in held)

    for d in dumps.values():
        es = d["entries"]
        for i, e in enumerate(es):
            if e["retired"]:
                continue
            group = e["process_group"][0]
            later = any(x["retired"] and x["process_group"][0] == group and alike(x)
                        for x in es[i + 1:])
            if not (alike(e) and later):
                return True
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_unfinished_work_is_never_healthy_and_every_view_agrees(history):
    world, sub, steps, dumped = history
    job = _play(world, sub, steps)
    with tempfile.TemporaryDirectory() as tmp:
        job.write(tmp, ranks=dumped)
        dumps = {r: job.dump(r) for r in dumped}
        unfinished = _unfinished(dumps, {"0": list(range(world)), "1": sub})
        a = analyze(tmp)
        story = [(f.kind, f.culprit_ranks, f.waiting_ranks, f.message) for f in a.findings]
        if unfinished or len(dumped) < world:
            assert a.verdict != "healthy", (steps, dumped, story)
        text = format_report(a, tmp)
        assert f"verdict: {a.verdict.upper()}" in text
        assert json.loads(json.dumps(a.to_json()))["verdict"] == a.verdict
        assert perfetto_trace(a)["otherData"]["verdict"] == a.verdict
        page = html_report(a)
        assert f"commscope analysis: {a.verdict}" in page
        if a.verdict == "healthy":
            table = text.split("groups:", 1)[-1]
            assert " wait" not in table and "never came" not in table, text
        victims: set[int] = set()
        for f in a.findings:
            assert not set(f.culprit_ranks) & set(f.waiting_ranks), story
            assert set(f.culprit_ranks) | set(f.waiting_ranks) <= set(range(world)), story
            # one root cause, one finding: no later finding blames an earlier one's victim
            if f.kind != "healthy":
                assert not set(f.culprit_ranks) & victims, story
            victims |= set(f.victims)
        assert os.path.isdir(tmp)
