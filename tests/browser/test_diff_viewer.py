"""The offline diff page in headless Chromium: deltas, highlight classes, controls.

The traces are the real captures of tests/unit/test_comm_diff.py (TP MLPModule under two
plans, MLPStacked with 1 and 2 layers, PyTorch's own dump of plan B) on a 4-rank fake
process group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    pytest.importorskip("expecttest")
    from commscope.comm import diff, write_diff_viewer
    from tests.unit.test_comm_diff import capture

    out = tmp_path_factory.mktemp("diffpages")
    dumps = capture(4, out)
    made = {}
    for name, a, b in [
        ("ab", "A", "B"),
        ("ba", "B", "A"),
        ("stacked", "stacked1", "stacked2"),
        ("torch", "A", "B_torch"),
    ]:
        d = diff(dumps[a], dumps[b])
        made[name] = (write_diff_viewer(out / f"{name}.html", d), d)
    return made


def _open(page, path: str) -> None:
    page.goto(Path(path).as_uri())
    page.wait_for_selector("body[data-loaded=true]", timeout=10_000)


def _row(page, module: str, phase: str, collective: str):
    return page.locator(
        f'#rows tr[data-module="{module}"][data-phase="{phase}"][data-collective="{collective}"]'
    )


def _classes(locator) -> set[str]:
    return set((locator.get_attribute("class") or "").split())


def test_increases_are_highlighted_and_unchanged_rows_hidden(page, pages):
    from commscope.comm.present.compare_report import summary_line

    path, d = pages["ab"]
    text = Path(path).read_text()
    assert "http://" not in text and "https://" not in text  # nothing from the network
    _open(page, path)
    assert page.locator("#summary-line").inner_text() == "A \u2192 B: " + summary_line(d)
    for module, phase in (("MLPModule.net1", "forward"), ("MLPModule.net2", "backward")):
        row = _row(page, module, phase, "all_gather")
        assert row.is_visible()
        assert {"increase", "added"} <= _classes(row)
        assert row.locator("td.calls-a").inner_text() == "0"
        assert row.locator("td.calls-b").inner_text() == "1"
        assert row.locator("td.bytes-b").inner_text() == "512 B"
        for cell, value in (("calls", "+1"), ("bytes", "+512 B"), ("est", "+3.8 ns")):
            delta = row.locator(f"td.{cell}-delta")
            assert delta.inner_text() == value
            assert "up" in _classes(delta)
        assert row.locator(".tag.added").inner_text() == "new"
    # The unchanged all_reduce is hidden until asked for.
    same = _row(page, "MLPModule.net2", "forward", "all_reduce")
    assert "same" in _classes(same) and not same.is_visible()
    page.check("#show-unchanged")
    assert same.is_visible()
    assert same.locator("td.bytes-delta").inner_text() == "0 B"
    assert "zero" in _classes(same.locator("td.bytes-delta"))
    # Totals, net changes and modules side by side.
    total = page.locator("#totals tr[data-measure=bytes] td.delta")
    assert total.inner_text() == "+1.0 KB" and "up" in _classes(total)
    net = page.locator('#net tr[data-collective=all_gather][data-axis="tp"]')
    assert "increase" in _classes(net) and net.locator("td.calls-delta").inner_text() == "+2"
    net1 = page.locator('#modules tr[data-fqn="MLPModule.net1"]')
    assert "increase" in _classes(net1)
    assert net1.locator("td.bytes-a").inner_text() == "0 B"
    assert net1.locator("td.bytes-b").inner_text() == "512 B"
    net2 = page.locator('#modules tr[data-fqn="MLPModule.net2"]')
    assert net2.locator("td.bytes-a").inner_text() == "320 B"
    assert net2.locator("td.bytes-b").inner_text() == "832 B"
    # The bandwidth box rescales every estimate.
    page.fill("#bandwidth", "1")
    row = _row(page, "MLPModule.net1", "forward", "all_gather")
    assert row.locator("td.est-delta").inner_text() == "+0.38 us"
    assert page.locator("#totals tr[data-measure=est] td.delta").inner_text() == "+0.77 us"
    assert page.errors == []


def test_decreases_are_highlighted(page, pages):
    _open(page, pages["ba"][0])
    row = _row(page, "MLPModule.net1", "forward", "all_gather")
    assert {"decrease", "removed"} <= _classes(row)
    for cell, value in (("calls", "-1"), ("bytes", "-512 B"), ("est", "-3.8 ns")):
        delta = row.locator(f"td.{cell}-delta")
        assert delta.inner_text() == value and "down" in _classes(delta)
    assert row.locator(".tag.removed").inner_text() == "gone"
    total = page.locator("#totals tr[data-measure=bytes] td.delta")
    assert total.inner_text() == "-1.0 KB" and "down" in _classes(total)
    assert page.errors == []


def test_modules_in_one_trace_only(page, pages):
    _open(page, pages["stacked"][0])
    assert page.locator("#only-in-b li").all_inner_texts() == [
        "MLPStacked.layers.1",
        "MLPStacked.layers.1.net1",
        "MLPStacked.layers.1.relu",
        "MLPStacked.layers.1.net2",
    ]
    assert page.locator("#only-in-a").count() == 0
    relu = page.locator('#modules tr[data-fqn="MLPStacked.layers.1.relu"]')
    assert {"only-b", "same"} <= _classes(relu) and relu.is_visible()  # shown: only in B
    net2 = page.locator('#modules tr[data-fqn="MLPStacked.layers.1.net2"]')
    assert {"only-b", "increase"} <= _classes(net2)
    assert net2.locator(".tag.only").inner_text() == "only in B"
    assert net2.locator("td.bytes-a").inner_text() == "\u2013"  # no such module in A
    assert "absent" in _classes(net2.locator("td.bytes-a"))
    assert net2.locator("td.bytes-b").inner_text() == "320 B"
    # Unchanged modules of both traces are hidden; the filter box narrows the rest.
    assert not page.locator('#modules tr[data-fqn="MLPStacked"]').is_visible()
    page.fill("#search", "layers.1.net1")
    assert page.locator("#rows tr.row:not(.hidden)").count() == 1
    assert not net2.is_visible()
    assert page.errors == []


def test_pytorch_side_shows_unknown_bytes(page, pages):
    _open(page, pages["torch"][0])
    assert "PyTorch dump: counts only" in page.locator("#meta").inner_text()
    row = _row(page, "MLPModule.net1", "forward", "all_gather")
    assert row.locator("td.axis").inner_text() == "?"
    assert row.locator("td.calls-delta").inner_text() == "+1"
    assert row.locator("td.bytes-b").inner_text() == "?"
    bytes_delta = row.locator("td.bytes-delta")
    assert bytes_delta.inner_text() == "?" and "unknown" in _classes(bytes_delta)
    assert "increase" in _classes(row)  # decided by calls when bytes are unknown
    assert page.errors == []
