"""The peer runner's own logic: the swap, the search for files, reading a run's result."""

from __future__ import annotations

import pytest

from tests.peer import runner, suites
from tests.peer.suites import SUITES, Suite, SwapError

SUITE = Suite(name="demo", file="test_demo_peer.py", upstream="test/demo.py",
              swap_from="from torch.thing import Thing",
              swap_to="from commscope.thing import Thing", ours=("Thing",))


def test_the_swap_replaces_exactly_that_line():
    text = "import torch\nfrom torch.thing import Thing\nx = Thing()\n"
    assert SUITE.swapped(text) == "import torch\nfrom commscope.thing import Thing\nx = Thing()\n"
    assert SUITE.swapped(text, against="torch") == text
    with pytest.raises(SwapError, match="found it 0 times"):
        SUITE.swapped("from torch.thing import Thing, Other\n")
    with pytest.raises(SwapError, match="found it 2 times"):
        SUITE.swapped(text + text)


def test_each_suites_swap_names_what_commscope_exports():
    import commscope.comm
    import commscope.mesh

    for suite in SUITES.values():
        assert "commscope" in suite.swap_to and "torch" in suite.swap_from
        package = commscope.mesh if "commscope.mesh" in suite.swap_to else commscope.comm
        for name in suite.ours:
            assert name in package.__all__


def test_an_absent_file_is_reported_with_where_to_put_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCOPE_PEER_DIR", str(tmp_path))
    assert suites.peer_dirs()[0] == tmp_path
    assert SUITE.locate() is None
    [outcome] = runner.run_suite(SUITE, dest=tmp_path / "build")
    assert outcome.not_run is not None and not outcome.ok
    assert "test/demo.py is not here" in outcome.not_run
    assert str(tmp_path) in outcome.not_run and "COMMSCOPE_PEER_DIR" in outcome.not_run
    (tmp_path / SUITE.file).write_text("from torch.thing import Thing\n")
    assert SUITE.locate() == tmp_path / SUITE.file
    copy = runner.prepare(SUITE, dest=tmp_path / "build")
    assert copy is not None and copy.read_text() == "from commscope.thing import Thing\n"
    assert (copy.parent / "pytest.ini").exists()


def test_a_result_is_read_from_pytests_junit_file(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="m.A" name="test_ok"/>'
        '<testcase classname="m.A" name="test_bad"><failure message="x"/></testcase>'
        '<testcase classname="m.B" name="test_gpu"><skipped message="needs 4 GPUs"/></testcase>'
        '</testsuite></testsuites>'
    )
    outcome = runner.Outcome("demo", "commscope", "fork", "whole file")
    runner._read_junit(xml, outcome)
    assert outcome.passed == ["m.A::test_ok"] and outcome.failed == ["m.A::test_bad"]
    assert outcome.skipped == {"m.B::test_gpu": "needs 4 GPUs"}
    assert not outcome.ok and "1 failed" in outcome.line()


def test_a_file_for_another_torch_is_said_so():
    output = "ERROR collecting test_x.py\nE   ImportError: cannot import name 'Hw' from 'x'\n"
    assert runner._not_importable(output) == "ImportError: cannot import name 'Hw' from 'x'"
    assert runner._not_importable("1 passed") is None
