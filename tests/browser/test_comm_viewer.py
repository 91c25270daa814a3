"""The offline comm viewer in headless Chromium: it loads, expands, filters, reads files."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

DATA = Path(__file__).resolve().parents[1] / "data" / "comm"
ALL_REDUCE_FWD = (
    'table.collectives[data-phase=forward] tr[data-key="c10d_functional.all_reduce"]'
)


@pytest.fixture(scope="module")
def mlp_dump():
    pytest.importorskip("expecttest")
    warnings.simplefilter("ignore")
    from torch.distributed.device_mesh import init_device_mesh

    from commscope.comm import CommDebugMode, trace_to_json
    from commscope.comm.examples import mlp_input, tp_mlp
    from tests.harness import fake_world

    with fake_world(0, 4):
        mesh = init_device_mesh("cpu", (4,))
        model = tp_mlp(mesh)
        inp = mlp_input()
        with CommDebugMode(bandwidth_gbps=100) as cm:
            model(inp).sum().backward()
        return trace_to_json(cm.trace(), noise_level=1)


def _open(page, path: Path) -> None:
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-loaded=true]", timeout=10_000)


def _node(page, fqn: str):
    return page.locator(f'li.node[data-fqn="{fqn}"]')


def test_embedded_dump_expands_to_the_right_counts(page, tmp_path, mlp_dump):
    from commscope.comm import write_viewer

    html = tmp_path / "comm.html"
    write_viewer(html, mlp_dump)
    text = html.read_text()
    assert "http://" not in text and "https://" not in text  # nothing from the network
    _open(page, html)
    net2 = _node(page, "MLPModule.net2")
    body = net2.locator(":scope > .body")
    assert not body.is_visible()
    net2.locator(":scope > .head .node-toggle").click()
    assert body.is_visible()
    row = body.locator(ALL_REDUCE_FWD)
    assert row.locator("td.count").inner_text() == "1"
    assert row.locator("td.bytes").inner_text() == "320 B"
    assert row.locator("td.axis").inner_text() == "dim_0"
    assert row.locator("td.est").inner_text() == "4.8 ns"
    sharding = body.locator('table.parameters tr[data-param="weight"] td.sharding')
    assert sharding.inner_text() == "(Shard(dim=1),)"
    # noise 1 keeps the DTensor ops: net2's forward addmm.
    ops = body.locator("details.ops[data-phase=forward]")
    ops.locator("summary").click()
    assert "aten.addmm.default" in ops.inner_text()
    # The bandwidth box recomputes estimates.
    page.fill("#bandwidth", "1")
    assert row.locator("td.est").inner_text() == "0.48 us"
    # Root summary: one all_reduce on dim_0.
    summary_row = page.locator("#summary table.summary tr[data-collective=all_reduce]")
    assert summary_row.locator("td.count").inner_text() == "1"
    assert page.errors == []


def test_search_filters_modules(page, tmp_path, mlp_dump):
    from commscope.comm import write_viewer

    html = tmp_path / "comm.html"
    write_viewer(html, mlp_dump)
    _open(page, html)
    page.fill("#search", "net2")
    assert _node(page, "MLPModule.net2").is_visible()
    assert _node(page, "MLPModule").is_visible()
    assert not _node(page, "MLPModule.net1").is_visible()
    assert not _node(page, "MLPModule.relu").is_visible()
    page.fill("#search", "")
    assert _node(page, "MLPModule.net1").is_visible()
    assert page.errors == []


def test_blank_page_picks_and_drops_files(page, tmp_path, mlp_dump):
    from commscope.comm import write_viewer

    html = tmp_path / "blank.html"
    write_viewer(html, None)
    page.goto(html.as_uri())
    assert page.locator("#tree li").count() == 0
    # Pick PyTorch's own dump with the file picker.
    page.set_input_files("#file-input", str(DATA / "pytorch_mlp_fwd_bwd_noise1.json"))
    page.wait_for_selector("body[data-loaded=true]")
    net2 = _node(page, "MLPModule.net2")
    net2.locator(":scope > .head .node-toggle").click()
    row = net2.locator(ALL_REDUCE_FWD)
    assert row.locator("td.count").inner_text() == "1"
    assert "PyTorch" in page.inner_text("#meta")
    # Drop ours on the page.
    page.evaluate(
        """(text) => {
            const dt = new DataTransfer();
            dt.items.add(new File([text], "ours.json", {type: "application/json"}));
            document.getElementById("drop-zone").dispatchEvent(
                new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""",
        json.dumps(mlp_dump),
    )
    page.wait_for_function("document.getElementById('meta').textContent.includes('ours.json')")
    assert "rank 0 of 4" in page.inner_text("#meta")
    # A file that is not a dump gives a message, not an exception.
    page.evaluate(
        """() => {
            const dt = new DataTransfer();
            dt.items.add(new File(["{not json"], "bad.json"));
            document.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, cancelable: true}));
        }"""
    )
    page.wait_for_selector("#error:not([hidden])")
    assert "bad.json" in page.inner_text("#error")
    assert page.errors == []


def test_hostile_names_are_text(page, tmp_path):
    from commscope.comm import write_viewer

    evil = 'M.blocks.a-b</script><img src=x onerror="window.pwned=1">'
    dump = {
        "fqn": "Global",
        "module_type": "",
        "parameters": [],
        "children": [
            {
                "fqn": evil,
                "module_type": "",
                "parameters": [],
                "children": [],
                "collectives_forward": [["c10d.allreduce_", 2]],
                "collectives_backward": [],
                "operations_forward": [],
                "operations_backward": [],
                "operations_checkpointing": [],
            }
        ],
        "collectives_forward": [["c10d.allreduce_", 2]],
        "collectives_backward": [],
        "operations_forward": [],
        "operations_backward": [],
        "operations_checkpointing": [],
    }
    html = tmp_path / "evil.html"
    write_viewer(html, dump)
    _open(page, html)
    assert page.locator("li.node .node-name").nth(1).inner_text() == evil
    assert page.evaluate("window.pwned === undefined")
    assert page.errors == []


def test_screenshot_is_not_empty(page, tmp_path, mlp_dump):
    from commscope.comm import write_viewer

    blank = tmp_path / "white.html"
    blank.write_text("<!doctype html><title>w</title><body style='background:#fff'></body>")
    page.goto(blank.as_uri())
    white = page.screenshot()
    html = tmp_path / "comm.html"
    write_viewer(html, mlp_dump)
    _open(page, html)
    shot = page.screenshot(path=str(tmp_path / "comm.png"), full_page=True)
    assert len(shot) > 10_000 and shot != white
    assert page.errors == []
