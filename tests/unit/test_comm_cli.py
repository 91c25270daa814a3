"""``commscope view``: writes the offline viewer page, or a blank one, and refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commscope.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "comm"


def _embedded(html: str):
    start = html.index('<script type="application/json" id="comm-data">') + len(
        '<script type="application/json" id="comm-data">'
    )
    return json.loads(html[start : html.index("</script>", start)])


def test_view_writes_a_page_next_to_the_dump(tmp_path, capsys):
    dump = tmp_path / "run.json"
    dump.write_text((DATA / "pytorch_mlp_fwd_bwd_noise1.json").read_text())
    assert main(["view", str(dump)]) == 0
    page = tmp_path / "run.html"
    assert capsys.readouterr().out.strip() == str(page)
    html = page.read_text()
    assert _embedded(html) == json.loads(dump.read_text())
    assert "<title>commscope comm trace: run.json</title>" in html
    assert "src=" not in html and "href=" not in html  # no external resources


def test_view_output_option_and_blank_page(tmp_path, monkeypatch):
    out = tmp_path / "x" / "page.html"
    out.parent.mkdir()
    assert main(["view", str(DATA / "pytorch_mlp_fwd_bwd_noise0.json"), "-o", str(out)]) == 0
    assert _embedded(out.read_text())["fqn"] == "Global"
    monkeypatch.chdir(tmp_path)
    assert main(["view"]) == 0
    assert _embedded((tmp_path / "commscope_viewer.html").read_text()) is None
    assert main(["view", "--blank", "-o", "b.html"]) == 0
    assert _embedded((tmp_path / "b.html").read_text()) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["view", "missing.json"], "no such file: missing.json"),
        (["view", "bad.json"], "cannot read bad.json as JSON"),
        (["view", "other.json"], "not a CommDebugMode JSON dump"),
        (["view", "other.json", "--blank"], "give a dump or --blank, not both"),
    ],
)
def test_view_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "other.json").write_text('{"entries": []}')
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_view_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["view", "--help"])
    assert exc.value.code == 0
    assert "commscope view comm_mode_log.json -o comm.html --open" in capsys.readouterr().out
