"""The table of torch differences (``commscope.compat``) agrees with the installed torch.

Run on every release of the matrix (``tests/matrix.py``), this is what keeps the
``since`` column of the table, and so docs/compat.md and every skip reason, true.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from commscope import compat

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("key", sorted(compat.DIFFERENCES))
def test_each_difference_is_found_exactly_where_the_table_says(key):
    d = compat.DIFFERENCES[key]
    assert compat.has(key) == d.expected_on(compat.torch_release()), (
        f"torch {compat.torch_version()}: {key} is documented for {d.releases} but "
        f"{'found' if compat.has(key) else 'not found'}")


def test_py_work_holder_release_matches_the_binary():
    lib = Path(torch.__file__).parent / "lib" / "libtorch_python.so"
    if not lib.exists():
        pytest.skip(f"no {lib.name} to look into")
    assert (b"PyWorkHolder" in lib.read_bytes()) == compat.has("py_work_holder")


def test_fake_backend_name_release_matches_its_behaviour(fake_pg):
    with fake_pg(0, 2):
        import torch.distributed as dist

        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        try:
            answered = backend.name() == "fake"
        except RuntimeError:
            answered = False
        assert answered == compat.has("fake_backend_name")
        assert compat.backend_name(backend, "fake") == "fake"


def test_require_names_the_installed_and_the_needed_release(monkeypatch):
    d = compat.Difference("from_the_future", "99.0", "a thing of torch 99",
                          "what commscope does without it", lambda: False)
    monkeypatch.setitem(compat.DIFFERENCES, d.key, d)
    compat.has.cache_clear()
    try:
        with pytest.raises(compat.TorchTooOld) as err:
            compat.require("from_the_future", "commscope.thing()")
        text = str(err.value)
        assert "commscope.thing() needs torch 99.0 or newer (a thing of torch 99)" in text
        assert f"this is torch {torch.__version__}" in text
        assert isinstance(err.value, RuntimeError)
    finally:
        compat.has.cache_clear()


def test_an_unknown_key_is_a_clear_error():
    with pytest.raises(KeyError, match="no torch difference called 'nope'"):
        compat.has("nope")


def test_regressions_read_as_ranges():
    d = compat.DIFFERENCES["dtensor_tp_transformer_on_cpu"]
    assert d.releases == "2.6+, except 2.8-2.11"
    assert [d.expected_on((2, m)) for m in (7, 8, 11, 12)] == [True, False, False, True]


def test_importing_compat_imports_no_torch():
    code = ("import sys; sys.modules['torch'] = None; from commscope import compat; "
            "print(compat.release('2.13.0+cpu'), len(compat.DIFFERENCES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True)
    assert out.stdout.split()[0] == "(2," and int(out.stdout.split()[-1]) > 10


def test_docs_list_every_difference():
    text = (REPO / "docs" / "compat.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, re.M))
    assert set(rows) == set(compat.DIFFERENCES), "docs/compat.md's table of differences"
    for key, releases in rows.items():
        assert releases.strip() == compat.DIFFERENCES[key].releases, key


def test_a_torch_older_than_the_floor_is_refused_by_name(monkeypatch):
    monkeypatch.delenv(compat.ALLOW_OLD_ENV, raising=False)
    with pytest.raises(compat.TorchTooOld) as err:
        compat._check_floor("2.5.1+cpu", "the flight recorder")
    text = str(err.value)
    assert "torch 2.5.1+cpu" in text and f"torch {compat.FLOOR} or newer" in text
    assert compat.ALLOW_OLD_ENV in text and "analyze" in text
    compat._check_floor(f"{compat.FLOOR}.0", "the flight recorder")  # the floor itself runs


def test_allowing_an_old_torch_warns_instead(monkeypatch, caplog):
    monkeypatch.setenv(compat.ALLOW_OLD_ENV, "1")
    with caplog.at_level("WARNING", logger="commscope.compat"):
        compat._check_floor("2.4.1", "the flight recorder")
    assert "2.4.1 is older than" in caplog.text


def test_a_torch_newer_than_measured_warns_once(caplog):
    compat.warn_if_newer.cache_clear()
    with caplog.at_level("WARNING", logger="commscope.compat"):
        assert compat.warn_if_newer("2.99.0") is True
        assert compat.warn_if_newer("2.99.0") is True  # cached: logged once
        assert compat.warn_if_newer(f"{compat.NEWEST_MEASURED}.1") is False
    assert caplog.text.count("2.99.0 is newer than") == 1
    assert f"{compat.FLOOR} to {compat.NEWEST_MEASURED}" in caplog.text


def test_the_newest_measured_release_is_the_matrix_newest():
    from tests.matrix import FLOOR, NEWEST

    assert compat.release(NEWEST) == compat.release(compat.NEWEST_MEASURED)
    assert compat.release(FLOOR) == compat.release(compat.FLOOR)
