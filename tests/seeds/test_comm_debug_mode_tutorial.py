"""The CommDebugMode tutorial (seeds/000) works with commscope, changing only the import.

The page's three calls on its MLPModule and on a small TP Transformer, on 4 real gloo
ranks; the level-0 table is the page's expected output; the JSON dump opens in our
viewer; a blank viewer page takes any dump dropped or picked onto it, as the page's
embedded viewer does.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from commscope import compat
from tests.needs import needs_torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "tutorial_comm_debug_mode.py"

# The tutorial page's "Expected Output", as printed there.
EXPECTED_LEVEL0 = """\
Global
  FORWARD PASS
    *c10d_functional.all_reduce: 1
    MLPModule
      FORWARD PASS
        *c10d_functional.all_reduce: 1
        MLPModule.net1
        MLPModule.relu
        MLPModule.net2
          FORWARD PASS
            *c10d_functional.all_reduce: 1
"""


def _run_tutorial(rank, world, root):
    import contextlib
    import io

    workdir = Path(root) / f"rank{rank}"
    workdir.mkdir()
    os.chdir(workdir)  # each rank writes the page's file names into its own folder
    os.environ["NO_COLOR"] = "1"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(SCRIPT), run_name="__main__")
    return out.getvalue()


@pytest.fixture(scope="module")
def tutorial_output(tmp_path_factory):
    from tests.harness import run_ranks

    needs_torch("dtensor_tp_transformer_on_cpu")  # the page's Transformer
    root = tmp_path_factory.mktemp("comm_tutorial")
    printed = run_ranks(_run_tutorial, 4, root, str(root), timeout=120)
    return root, printed


@pytest.mark.dist
def test_level_0_table_is_the_pages_expected_output(tutorial_output):
    _, printed = tutorial_output
    for text in printed:
        assert text == EXPECTED_LEVEL0 + "\n"  # print() adds the final newline


@pytest.mark.dist
def test_log_file_and_json_dump_use_the_pages_names(tutorial_output):
    root, _ = tutorial_output
    for rank in range(4):
        log = (root / f"rank{rank}" / "transformer_operation_log.txt").read_text()
        assert "\x1b[" not in log  # colours stripped in the file, as PyTorch does
        assert log.startswith("Global\n")
        assert "*module type: class 'torch.testing._internal.distributed._tensor." in log
        assert "Transformer.layers.0.attention" in log
        assert "*c10d_functional.all_reduce: 6" in log  # 2 layers: attention + ffn, and output
        dump = json.loads((root / f"rank{rank}" / "comm_mode_log.json").read_text())
        assert dump["fqn"] == "Global"
        # torch's DTensor before 2.12 all-gathers 7 times in this forward, not once
        gathers = 1 if compat.has("dtensor_counts_of_2_12") else 7
        assert dump["collectives_forward"] == [
            ["c10d_functional.all_reduce", 6],
            ["c10d_functional.all_gather_into_tensor", gathers],
        ]
        assert [c["fqn"] for c in dump["children"]] == ["Transformer"]


def _open(page, html: Path) -> None:
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-loaded=true]", timeout=10_000)


@pytest.mark.browser
def test_the_dump_opens_in_our_viewer(tutorial_output, page, tmp_path):
    root, _ = tutorial_output
    dump = root / "rank0" / "comm_mode_log.json"
    html = tmp_path / "comm_mode_log.html"
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", "view", str(dump), "-o", str(html)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    _open(page, html)
    page.fill("#search", "layers.0.attention")  # the search box reveals the module
    node = page.locator('li.node[data-fqn="Transformer.layers.0.attention"]')
    assert node.is_visible()
    assert not page.locator('li.node[data-fqn="Transformer.layers.1"]').is_visible()
    body = node.locator(":scope > .body")
    if not body.is_visible():
        node.locator(":scope > .head .node-toggle").click()
    assert body.is_visible()
    row = body.locator(
        'table.collectives[data-phase=forward] tr[data-key="c10d_functional.all_reduce"]'
    )
    assert row.locator("td.count").inner_text() == "1"  # attention.wo's rowwise all_reduce
    assert page.errors == []


@pytest.mark.browser
def test_a_blank_viewer_takes_a_dropped_or_picked_dump(tutorial_output, page, tmp_path):
    root, _ = tutorial_output
    blank = tmp_path / "viewer.html"
    proc = subprocess.run(
        [sys.executable, "-m", "commscope", "view", "--blank", "-o", str(blank)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    page.goto(blank.as_uri())
    assert page.locator("#tree li").count() == 0
    page.set_input_files("#file-input", str(root / "rank0" / "comm_mode_log.json"))
    page.wait_for_selector("body[data-loaded=true]")
    assert page.locator('li.node[data-fqn="Transformer.layers.0.attention"]').count() == 1
    dropped = (root / "rank1" / "comm_mode_log.json").read_text()
    page.evaluate(
        """(text) => {
            const dt = new DataTransfer();
            dt.items.add(new File([text], "rank1.json", {type: "application/json"}));
            document.getElementById("drop-zone").dispatchEvent(
                new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
        }""",
        dropped,
    )
    page.wait_for_function("document.getElementById('meta').textContent.includes('rank1.json')")
    assert page.errors == []
