"""The HTML report at 16 and 512 ranks, looked at in Chromium: the answer on the first
screen, the tables compact, the wait-for graph's labels whole and clear of the boxes.

Each test keeps a screenshot of the first screen and of the whole page under
``$COMMSCOPE_SHOTS`` (default: the test's tmp folder) for a person to look at.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from commscope.analyze import analyze, write_html
from commscope.analyze.synth import megatron_job

pytestmark = pytest.mark.browser

DATA = Path(__file__).resolve().parents[1] / "data"
SCREEN = {"width": 1280, "height": 800}


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("COMMSCOPE_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open(page: Any, result: Any, out: Path) -> None:
    write_html(result, out)
    page.set_viewport_size(SCREEN)
    page.goto(out.as_uri())
    page.wait_for_selector("#findings")
    assert page.errors == []


def _on_first_screen(page: Any, selector: str) -> bool:
    box = page.query_selector(selector).bounding_box()
    return box is not None and box["y"] + box["height"] <= SCREEN["height"]


_OVERLAPS = """() => {
  const svg = document.querySelector('#waitgraph svg');
  const view = svg.viewBox.baseVal;
  const boxes = [...svg.querySelectorAll('g.node rect')].map(r => r.getBBox());
  const bad = [];
  for (const t of svg.querySelectorAll('g.edge text')) {
    const b = t.getBBox();
    if (b.x < view.x || b.y < view.y || b.x + b.width > view.x + view.width ||
        b.y + b.height > view.y + view.height) { bad.push('outside: ' + t.textContent); }
    for (const r of boxes) {
      if (b.x < r.x + r.width && r.x < b.x + b.width && b.y < r.y + r.height &&
          r.y < b.y + b.height) { bad.push('on a box: ' + t.textContent); }
    }
  }
  return bad;
}"""


def _check_page(page: Any, result: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"{name}_first_screen.png"))
    page.screenshot(path=str(shots / f"{name}_page.png"), full_page=True)
    culprit = result.findings[0].culprit_ranks[0]
    # the banner names the root cause, and the root-cause lines are on the first screen
    assert f"rank {culprit}" in page.text_content("#headline")
    assert _on_first_screen(page, "#root-cause")
    assert _on_first_screen(page, "#next")
    # nothing wider than the window
    assert page.evaluate("document.documentElement.scrollWidth") <= SCREEN["width"]
    # every label of the wait-for graph inside the drawing and off the boxes
    assert page.evaluate(_OVERLAPS) == []


def test_sixteen_ranks_of_a_real_nccl_job(page, tmp_path):
    result = analyze(DATA / "nccl_scenarios" / "gpu_error_and_gil" / "active")
    _open(page, result, tmp_path / "r16.html")
    _check_page(page, result, _shots(tmp_path), "report_16")
    assert len(page.query_selector_all("#root-cause li")) == 2  # a device and a thread


@pytest.mark.parametrize("fault", ["device", "thread"])
def test_five_hundred_twelve_ranks_stay_compact(page, tmp_path, fault):
    job, bad = megatron_job(512, fault)
    job.write(tmp_path / "dumps")
    result = analyze(tmp_path / "dumps")
    assert result.findings[0].culprit_ranks == [bad]
    _open(page, result, tmp_path / "r512.html")
    _check_page(page, result, _shots(tmp_path), f"report_512_{fault}")
    # 225 groups (64 tp, 32 dp, 128 pp, the world): the quiet ones folded by description
    assert len(result.groups) == 225
    assert len(page.query_selector_all("#groups tr")) <= 12
    assert len(page.query_selector_all("#stuck li")) <= 10
    assert page.evaluate("document.documentElement.scrollHeight") < 6 * SCREEN["height"]
