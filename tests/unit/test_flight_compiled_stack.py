"""The user's line under torch.compile (issue 32, item 6), without compiling anything.

A collective issued from a compiled function runs from inductor's output module
(``<cache>/<2 chars>/c<hash>.py``) or an FX graph (``<eval_with_key>.N``): those frames
are never the user's line, and at dump time the recorder puts before an inductor frame
the user's frames it was compiled from (inductor's line map, faked here), only when the
map matches the function dynamo took over and the source it quotes. The real thing, on
gloo with inductor: the scenarios ``compiled_step_stall`` and
``compiled_graph_break_missing`` (``tests/data/make_scenarios.py``).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from commscope.analyze.read.places import user_frame, user_place
from commscope.flight.record import stack as stack_mod
from commscope.flight.record.stack import generated_file, library_file, with_compiled_source

torch = pytest.importorskip("torch")
TORCH = os.path.dirname(os.path.abspath(torch.__file__))
SOURCE = """def step(x):
    y = x * 2
    dist.all_reduce(y)
    return y + 1


def main():
    for _ in range(3):
        step(x)
"""


@pytest.fixture
def program(tmp_path, monkeypatch):
    """(the user's file, inductor's output module, set_trace(text)): the line map of
    line 110 of the output module says ``text`` (a formatted stack trace)."""
    user = tmp_path / "train.py"
    user.write_text(SOURCE)
    out = tmp_path / "ab" / ("c" + "k" * 51 + ".py")
    cache = types.SimpleNamespace(linemaps={})
    monkeypatch.setattr(stack_mod, "_ROOTS", None)  # torch's folder, now that it is imported
    monkeypatch.setitem(sys.modules, "torch._inductor.codecache",
                        types.SimpleNamespace(PyCodeCache=cache))

    def set_trace(text: str) -> None:
        cache.linemaps[str(out)] = [(100, 108, 112), ("", text, "")]

    return user, out, set_trace


def _trace(path: Path, line: int, name: str, code: str) -> str:
    """A node's stack trace as inductor's line map keeps it (outermost frame first)."""
    return (f'  File "{path}", line {line}, in {name}\n    {code}\n    ^^^^^^^^^^^^^^^^^^\n'
            # (no source line shown: torch's own lines differ between versions)
            f'  File "{TORCH}/distributed/_functional_collectives.py", line 179, in all_reduce\n')


def _stack(user: Path, out: Path, outer: str = "step", outer_line: int = 1) -> list[dict]:
    """A record's frames, innermost first, as a compiled step leaves them."""
    return [
        {"name": "__call__", "filename": f"{TORCH}/_ops.py", "line": 875},
        {"name": "call", "filename": str(out), "line": 110},
        {"name": "__call__", "filename": f"{TORCH}/_inductor/output_code.py", "line": 763},
        {"name": "_fn", "filename": f"{TORCH}/_dynamo/eval_frame.py", "line": 1446},
        {"name": outer, "filename": str(user), "line": outer_line},  # dynamo's, first line
        {"name": "main", "filename": str(user), "line": 9},
    ]


def test_generated_code_is_never_the_users_line():
    for name in ("<eval_with_key>.3", "/tmp/torchinductor_ann/ab/c" + "k" * 51 + ".py",
                 "/scratch/inductor-cache/zz/c" + "0" * 51 + ".py"):
        assert generated_file(name) and library_file(name)
        frames = [{"name": "call", "filename": name, "line": 7},
                  {"name": "step", "filename": "/home/ann/train.py", "line": 1}]
        assert user_frame(frames) == ("step", "/home/ann/train.py", 1)
    for name in ("/home/ann/train.py", "/home/ann/c" + "k" * 51 + ".py", "<string>"):
        assert not generated_file(name)


def test_the_compiled_line_comes_before_the_generated_frame(program):
    user, out, set_trace = program
    set_trace(_trace(user, 3, "step", "dist.all_reduce(y)"))
    frames = with_compiled_source(_stack(user, out))
    assert [f["name"] for f in frames[:4]] == ["__call__", "all_reduce", "step", "call"]
    assert frames[2] == {"name": "step", "filename": str(user), "line": 3, "compiled": True}
    assert user_frame(frames) == ("step", str(user), 3)


def test_thread_frames_get_the_source_line_too(program):
    user, out, set_trace = program
    set_trace(_trace(user, 3, "step", "dist.all_reduce(y)"))
    frames = [dict(f, code="x") for f in _stack(user, out)]
    got = with_compiled_source(frames)
    assert user_place(got) == ("step", str(user), 3, "dist.all_reduce(y)")
    assert list(got[2]) == ["name", "filename", "line", "code", "compiled"]


def test_after_a_graph_break_the_function_keeps_its_name(program):
    user, out, set_trace = program
    resumed = "torch_dynamo_resume_in_step_at_2"
    set_trace(_trace(user, 3, resumed, "dist.all_reduce(y)"))
    frames = with_compiled_source(_stack(user, out, outer=resumed, outer_line=2))
    assert user_frame(frames) == ("step", str(user), 3)


@pytest.mark.parametrize("why", ["another function", "older source"])
def test_a_map_of_other_source_is_not_used(program, why):
    # the compile cache hands the output of the same graph compiled from other source
    user, out, set_trace = program
    if why == "another function":
        set_trace(_trace(user, 3, "other_step", "dist.all_reduce(y)"))
    else:
        set_trace(_trace(user, 3, "step", "dist.all_reduce(grads)"))
    stack = _stack(user, out)
    assert with_compiled_source(stack) == stack
    assert user_frame(stack) == ("step", str(user), 1)  # the compiled function, first line


def test_a_stack_without_generated_code_is_left_alone():
    frames = [{"name": "step", "filename": "/home/ann/train.py", "line": 3}]
    assert with_compiled_source(frames) is frames


def test_no_line_map_leaves_the_compiled_function(program):
    user, out, _ = program
    stack = _stack(user, out)
    assert with_compiled_source(stack) == stack
    assert user_frame(stack) == ("step", str(user), 1)


def test_the_walk_past_torch_keeps_the_generated_frames(monkeypatch):
    # a collective deep under a compiled graph: the record keeps the generated frame
    # beyond max_frames (the dump works the user's line out of it), and the user's frames
    monkeypatch.setattr(stack_mod, "_ROOTS", None)
    gen_file = "/tmp/torchinductor_ann/ab/c" + "k" * 51 + ".py"
    lib_file = os.path.join(TORCH, "_fake_wrappers.py")
    scope: dict = {"sys": sys, "stack_mod": stack_mod}
    exec(compile("def deep(n, then):\n    return deep(n - 1, then) if n else then()\n",
                 lib_file, "exec"), scope)
    exec(compile("def call(then):\n    return deep(5, then)\n", gen_file, "exec"), scope)

    def step():  # the user's compiled function, as dynamo leaves it on the stack
        return scope["deep"](2, lambda: scope["call"](
            lambda: stack_mod.capture_to_user(sys._getframe(1), 3)))

    raw = step()
    files = [raw[i].co_filename for i in range(0, len(raw), 2)]
    assert files == [lib_file] * 3 + [gen_file, __file__, __file__]  # the lambda, step
    trimmed = stack_mod.trim_to_user(raw, 2)  # what a progress record keeps
    assert [trimmed[i].co_filename for i in range(0, len(trimmed), 2)] == (
        [lib_file] * 2 + [gen_file, __file__, __file__])
