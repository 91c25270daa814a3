"""The recorder refuses, loudly, to run on a torch it cannot record (issue 18, part 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.distributed.distributed_c10d as c10d

import commscope.flight as flight
from commscope.flight.splice import install
from commscope.flight.splice.selfcheck import STRICT_ENV, RecorderUnsupported, check_torch
from tests.harness import run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_this_torch_passes():
    check_torch()


def test_every_miss_is_named_with_the_torch_version():
    def helper(group_size, group_rank, store):  # builds no ProcessGroup by that name
        return None

    fake = SimpleNamespace(_new_process_group_helper=helper, ProcessGroup=object)
    with pytest.raises(RecorderUnsupported) as err:
        check_torch(fake)
    text = str(err.value)
    assert f"torch {torch.__version__}" in text
    assert "global_ranks_in_group, backend" in text
    assert "through the name ProcessGroup" in text
    assert "batch_isend_irecv" in text and "ProcessGroup methods allreduce" in text
    assert "recording was not started" in text


def test_enable_raises_and_records_nothing_when_the_splice_point_changed(monkeypatch):
    def helper(group_size, group_rank, global_ranks_in_group, backend, store, **kw):
        return None

    monkeypatch.setattr(c10d, "_new_process_group_helper", helper)
    flight.disable()
    with pytest.raises(RecorderUnsupported, match="cannot record on torch"):
        flight.enable(watchdog=False)
    assert not flight.is_enabled()
    assert not install.installed()


def _missed_splice(rank, world_size, strict):
    import torch.distributed as dist

    if strict:
        os.environ[STRICT_ENV] = "1"
    flight.enable(watchdog=False, handle_signals=False)
    install._ProcessGroupFactory = install._REAL_PG  # torch builds plain groups again
    store = dist.FileStore(os.environ["COMMSCOPE_TEST_STORE"], world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    return "initialized"


def test_a_group_the_recorder_misses_stops_the_job_in_strict_mode(tmp_path):
    [result] = run_ranks(_missed_splice, 1, tmp_path, True, init=False, check=False)
    assert result.error and "RecorderUnsupported" in result.error
    assert "without the recording class" in result.error and "NOT recorded" in result.error


def test_without_strict_mode_the_job_goes_on_with_an_error_logged(tmp_path):
    [result] = run_ranks(_missed_splice, 1, tmp_path, False, init=False, check=False)
    assert result.value == "initialized" and result.error is None


def test_commscope_run_refuses_to_start(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import torch.distributed.distributed_c10d as c10d
        def _new_process_group_helper(group_size, group_rank, global_ranks_in_group,
                                      backend, store, **kw):
            raise AssertionError("never reached")
        c10d._new_process_group_helper = _new_process_group_helper
    """))
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "commscope.flight.bootstrap", str(script)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "the script ran" not in proc.stdout
    assert "commscope run: commscope flight cannot record on torch" in proc.stderr


def test_comm_tracing_on_a_torch_without_its_hooks_says_what_is_missing():
    code = ("import torch; del torch._C._current_graph_task_id\n"
            "try:\n    from commscope.comm import CommDebugMode\n"
            "except ImportError as e:\n    print(type(e).__name__, e)\n")
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120).stdout
    assert out.startswith("CommUnsupported commscope.comm cannot trace on torch"), out
    assert "torch._C._current_graph_task_id is missing" in out


# ---------------------------------------------------------------- the dynamic probe
# A torch can keep every name the code check looks for and still route a collective
# past the recording group or past the dispatch mode. These tests make such a torch
# with a sitecustomize and check that a throw-away job catches it.

BYPASS_RECORDER = """
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

def all_reduce(tensor, op=c10d.ReduceOp.SUM, group=None, async_op=False):
    # a torch that calls the backend directly, past the group object
    group = group or c10d._get_default_group()
    opts = c10d.AllreduceOptions()
    opts.reduceOp = op
    work = group._get_backend(tensor.device).allreduce([tensor], opts)
    if async_op:
        return work
    work.wait()

c10d.all_reduce = dist.all_reduce = all_reduce
"""

HIDE_FROM_DISPATCH = """
import torch
import torch.distributed._functional_collectives as funcol

_all_reduce = funcol.all_reduce

def all_reduce(*args, **kwargs):
    # a torch whose functional collectives run below Python dispatch modes
    with torch._C._DisableTorchDispatch():
        return _all_reduce(*args, **kwargs)

funcol.all_reduce = all_reduce
"""


def _python(tmp_path, site: str | None, code: str, *args: str) -> subprocess.CompletedProcess:
    paths = [REPO]
    if site is not None:
        (tmp_path / "site").mkdir(exist_ok=True)
        (tmp_path / "site" / "sitecustomize.py").write_text(site)
        paths.insert(0, str(tmp_path / "site"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1",
           "COMMSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("COMMSCOPE_SELFCHECK", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=env, timeout=240)


def test_the_probe_passes_on_this_torch():
    from commscope.probe import probe

    result = probe(use_cache=False)
    assert result.error is None
    assert result.flight_ok and result.comm_ok, result
    assert result.torch_version == torch.__version__


ENABLE = ("import commscope.flight as f\n"
          "try:\n    f.enable(watchdog=False, handle_signals=False)\n"
          "except Exception as e:\n    print(type(e).__name__, e)\nelse:\n"
          "    print('enabled', f.is_enabled())\n")


def test_a_passing_verdict_is_cached_and_read_back(tmp_path):
    first = _python(tmp_path, None, ENABLE)
    assert first.stdout.strip() == "enabled True", first.stderr
    [cached] = list((tmp_path / "cache").glob("selfcheck-*.json"))
    code = "from commscope.probe import probe; print(probe().cached)"
    assert _python(tmp_path, None, code).stdout.strip() == "True"
    cached.unlink()
    assert _python(tmp_path, None, code).stdout.strip() == "False"


def test_enable_refuses_a_torch_that_routes_collectives_past_the_recorder(tmp_path):
    out = _python(tmp_path, BYPASS_RECORDER, ENABLE)
    text = out.stdout.strip()
    assert text.startswith("RecorderUnsupported commscope flight cannot record on torch "
                           f"{torch.__version__}: a throw-away one-rank job recorded "
                           "nothing for dist.all_reduce;"), (text, out.stderr)
    assert "dist.broadcast" not in text  # only what is really missing is named
    assert "recording was not started" in text and "docs/compat.md" in text
    assert not list((tmp_path / "cache").glob("selfcheck-*.json"))  # failures not cached


def test_commscope_run_refuses_a_torch_that_records_nothing(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('the script ran')\n")
    code = "from commscope.flight.bootstrap import main; main()"
    out = _python(tmp_path, BYPASS_RECORDER, code, str(script))
    assert out.returncode == 3, out.stderr
    assert "the script ran" not in out.stdout
    assert "commscope run: commscope flight cannot record on torch" in out.stderr


def test_comm_debug_mode_refuses_a_torch_whose_collectives_it_cannot_see(tmp_path):
    code = ("from commscope.comm import CommDebugMode\n"
            "try:\n    CommDebugMode().__enter__()\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = _python(tmp_path, HIDE_FROM_DISPATCH, code)
    text = out.stdout.strip()
    assert text.startswith(f"CommUnsupported commscope.comm cannot trace on torch "
                           f"{torch.__version__}: a throw-away one-rank job's CommDebugMode "
                           "missed functional all_reduce."), (text, out.stderr)
    # the recorder is not affected by what hides collectives from dispatch modes
    assert _python(tmp_path, HIDE_FROM_DISPATCH, ENABLE).stdout.strip() == "enabled True"


def test_a_cache_folder_that_cannot_be_written_only_costs_a_probe(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    code = ("import os; os.environ['COMMSCOPE_CACHE_DIR'] = " + repr(str(blocker / "cache"))
            + "\n" + ENABLE)
    out = _python(tmp_path, None, code)
    assert out.stdout.strip() == "enabled True", out.stderr
