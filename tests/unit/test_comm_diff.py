"""``commscope.comm.diff`` and ``commscope diff``: two real traces, exact deltas.

The traces are CommDebugMode captures (forward + backward) of PyTorch's test
``MLPModule`` (10 -> 16 -> 10, batch 8 x 10, float32) on a 1-D ``tp`` mesh of a fake
process group, under two plans:

* plan A, the tutorial's: ``net1`` colwise, ``net2`` rowwise. One all_reduce of net2's
  output in forward (8 x 10 x 4 = 320 B); no backward collective (the batch needs no
  gradient, and the colwise/rowwise pair keeps net1's output sharded).
* plan B: ``net1`` colwise with a ``Replicate`` output, ``net2`` rowwise with a
  ``Replicate`` input. net1 all-gathers its output in forward (8 x 16 x 4 = 512 B), net2
  still all-reduces (320 B), and in backward net2 turns the gradient of its input, sharded
  on the last dim, back into the replicated layout net1 produced: one more all_gather of
  512 B. So B - A = +1 all_gather in net1 forward, +1 in net2 backward, +1024 B.

And ``MLPStacked`` (MLPModule layers) with 1 and 2 layers, each layer colwise/rowwise.
The second layer adds its forward all_reduce and, since its input now comes from layer 0
and needs a gradient, the all_reduce of that gradient in its net1's backward.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

pytest.importorskip("expecttest")

from commscope.cli import main
from commscope.comm import CommTrace, DiffInputError, TraceDiff, diff, diff_to_json, format_diff
from commscope.comm.present.compare_report import summary_line
from commscope.comm.present.compare_types import UNKNOWN_AXIS
from tests.needs import torch_has

warnings.filterwarnings("ignore", category=UserWarning)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DATA = Path(__file__).resolve().parents[1] / "data" / "comm"
AG_BYTES = 8 * 16 * 4  # net1's gathered output
AR_BYTES = 8 * 10 * 4  # net2's output


def _plan(name: str, n_layers: int = 1) -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if name == "A":
        return {"net1": ColwiseParallel(), "net2": RowwiseParallel()}
    if name == "B":
        return {
            "net1": ColwiseParallel(output_layouts=Replicate()),
            "net2": RowwiseParallel(input_layouts=Replicate()),
        }
    plan = {}
    for i in range(n_layers):
        plan[f"layers.{i}.net1"] = ColwiseParallel()
        plan[f"layers.{i}.net2"] = RowwiseParallel()
    return plan


def _model(name: str):
    from torch.testing._internal.distributed._tensor.common_dtensor import MLPModule, MLPStacked

    if name.startswith("stacked"):
        return MLPStacked("cpu", n_layers=int(name[-1])), _plan("stacked", int(name[-1]))
    return MLPModule("cpu"), _plan(name)


def _step(name: str, mesh, mode_cls):
    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    model, plan = _model(name)
    model = parallelize_module(model, mesh, plan)
    inp = torch.rand(8, 10)
    with mode_cls() as cm:
        model(inp).sum().backward()
    return cm


def capture(world: int, out: Path) -> dict:
    """Dumps of plan A, plan B, 1 and 2 stacked layers (ours), and plan B by PyTorch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from commscope.comm import CommDebugMode
    from tests.harness import fake_world

    paths: dict = {}
    with fake_world(0, world):
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        for name in ("A", "B", "stacked1", "stacked2"):
            cm = _step(name, mesh, CommDebugMode)
            paths[name] = out / f"{name}.json"
            cm.generate_json_dump(str(paths[name]), noise_level=1)
            paths[f"{name}_mode"] = cm
        torch_cm = _step("B", mesh, TorchCommDebugMode)
        paths["B_torch"] = out / "B_torch.json"
        torch_cm.generate_json_dump(str(paths["B_torch"]), noise_level=0)
    return paths


@pytest.fixture(scope="module")
def by_world(tmp_path_factory):
    """The captures on a 4-rank and on a 2-rank ``tp`` mesh."""
    out = {}
    for world in (4, 2):
        out[world] = capture(world, tmp_path_factory.mktemp(f"diff{world}"))
        out[world]["world"] = world
    return out


@pytest.fixture(params=[4, 2], ids=["tp4", "tp2"])
def dumps(request, by_world):
    return by_world[request.param]


def _ag_us(world: int) -> float:
    """One all_gather of net1's output at 100 GB/s: bytes * (n-1)/n / busbw."""
    return AG_BYTES * (world - 1) / world / 100e9 * 1e6


def d_est(dumps, all_gathers: int) -> float:
    """Estimated time of the all_reduce plus ``all_gathers`` all_gathers, at 100 GB/s."""
    n = dumps["world"]
    return AR_BYTES * 2 * (n - 1) / n / 100e9 * 1e6 + all_gathers * _ag_us(n)


def _key(row):
    return (row.module, row.phase, row.collective, row.axis)


# ------------------------------------------------------------------ the library


def test_plan_change_adds_two_all_gathers(dumps):
    d = diff(dumps["A"], dumps["B"])
    assert [_key(r) for r in d.changed] == [
        ("MLPModule.net1", "forward", "all_gather", "tp"),
        ("MLPModule.net2", "backward", "all_gather", "tp"),
    ]  # equal time change: module-tree order
    for row in d.changed:
        assert (row.calls_before, row.calls_after, row.calls_delta) == (0, 1, 1)
        assert (row.bytes_before, row.bytes_after, row.bytes_delta) == (0, AG_BYTES, AG_BYTES)
        assert row.est_us_delta == pytest.approx(_ag_us(dumps["world"]))
        assert row.direction == 1
    assert d.unchanged_count == 1
    (same,) = [r for r in d.rows if r not in d.changed]
    assert _key(same) == ("MLPModule.net2", "forward", "all_reduce", "tp")
    assert (same.calls_before, same.calls_after, same.bytes_after) == (1, 1, AR_BYTES)
    t = d.totals
    assert (t.calls_before, t.calls_after) == (1, 3)
    assert (t.bytes_before, t.bytes_after, t.bytes_delta) == (320, 1344, 1024)
    assert t.est_us_delta == pytest.approx(2 * _ag_us(dumps["world"]))
    assert [(n.collective, n.axis, n.calls_delta, n.bytes_delta) for n in d.net] == [
        ("all_gather", "tp", 2, 1024),
        ("all_reduce", "tp", 0, 0),
    ]
    assert d.only_in_a == d.only_in_b == []
    # Estimated time: 1 all_reduce, 320 B x 2(n-1)/n, before; plus 2 all_gathers, 512 B x
    # (n-1)/n each, after: 480 -> 1248 bus bytes for n = 4, 320 -> 832 for n = 2; +160%.
    assert d.growth().measure == "est_us" and d.growth().percent == pytest.approx(160.0)
    est = {4: "+7.7 ns", 2: "+5.1 ns"}[dumps["world"]]
    assert summary_line(d) == (
        f"+2 all_gather on tp, +1.0 KB (+320.0%), est. {est} (+160.0%) at 100 GB/s"
    )


def test_reverse_is_the_negative(dumps):
    forward, back = diff(dumps["A"], dumps["B"]), diff(dumps["B"], dumps["A"])
    assert [_key(r) for r in back.changed] == [_key(r) for r in forward.changed]
    for f, b in zip(forward.changed, back.changed):
        assert (b.calls_delta, b.bytes_delta, b.direction) == (-1, -AG_BYTES, -1)
        assert b.est_us_delta == pytest.approx(-f.est_us_delta)
    assert summary_line(back).startswith("-2 all_gather on tp, -1.0 KB (-76.2%), est. -")
    assert summary_line(back).endswith(" (-61.5%) at 100 GB/s")


def test_bandwidth_scales_estimates(dumps):
    d = diff(dumps["A"], dumps["B"], bandwidth_gbps=10)
    assert d.totals.est_us_delta == pytest.approx(20 * _ag_us(dumps["world"]))
    with pytest.raises(ValueError, match="bandwidth_gbps must be > 0"):
        diff(dumps["A"], dumps["B"], bandwidth_gbps=0)


def test_mesh_size_change_moves_time_not_bytes(by_world):
    """Plan A on 4 ranks, then on 2: the same all_reduce of 320 B, whose bus-bandwidth
    factor 2(n-1)/n falls from 1.5 to 1: 4.8 ns -> 3.2 ns."""
    d = diff(by_world[4]["A"], by_world[2]["A"])
    (row,) = d.changed
    assert _key(row) == ("MLPModule.net2", "forward", "all_reduce", "tp")
    assert (row.calls_delta, row.bytes_delta, row.direction) == (0, 0, -1)
    assert row.est_us_delta == pytest.approx(-0.0016)
    assert summary_line(d) == (
        "all_reduce on tp -1.6 ns, same bytes, est. -1.6 ns (-33.3%) at 100 GB/s"
    )


def test_extra_layer_rows_and_modules(dumps):
    d = diff(dumps["stacked1"], dumps["stacked2"])
    assert [(_key(r), r.calls_delta, r.bytes_delta) for r in d.changed] == [
        (("MLPStacked.layers.1.net1", "backward", "all_reduce", "tp"), 1, AR_BYTES),
        (("MLPStacked.layers.1.net2", "forward", "all_reduce", "tp"), 1, AR_BYTES),
    ]  # the same time change: module-tree order
    assert d.only_in_a == []
    assert d.only_in_b == [
        "MLPStacked.layers.1",
        "MLPStacked.layers.1.net1",
        "MLPStacked.layers.1.relu",
        "MLPStacked.layers.1.net2",
    ]
    assert [fqn for fqn, _ in d.module_order][:3] == [
        "Global", "MLPStacked", "MLPStacked.layers.0"  # a ModuleList runs no forward
    ]
    text = format_diff(d)
    assert "only in B: MLPStacked.layers.1 (+3 submodules)" in text


def test_each_collective_counts_once_not_per_ancestor(dumps):
    """Self amounts: the rows add up to the records, not to the inclusive module counts."""
    from commscope.comm import load_json

    trace = load_json(dumps["stacked2"])
    inclusive = sum(sum(n.collectives[p].values()) for n in trace.modules() for p in n.collectives)
    d = diff(dumps["stacked1"], dumps["stacked2"])
    assert d.totals.calls_after == len(trace.records) == 3
    assert inclusive > 3  # Global, MLPStacked, layers, layers.i and net2 all include it
    assert {r.module for r in d.rows} == {
        "MLPStacked.layers.0.net2", "MLPStacked.layers.1.net2", "MLPStacked.layers.1.net1"
    }


def test_identical_traces_have_no_change(dumps):
    d = diff(dumps["B"], dumps["B"])
    assert d.changed == [] and d.unchanged_count == 3
    assert d.totals.bytes_delta == 0 and d.totals.est_us_delta == 0
    assert summary_line(d) == "no change (3 calls, 1.3 KB in both traces)"
    text = format_diff(d)
    assert "module " not in text  # no table
    assert text.splitlines()[-2:] == [
        "3 unchanged rows hidden",
        "A -> B: no change (3 calls, 1.3 KB in both traces)",
    ]
    assert len(format_diff(d, unchanged=True).splitlines()) == len(text.splitlines()) + 5


def test_every_kind_of_input_gives_the_same_rows(dumps):
    from commscope.comm import load_json

    def rows(d: TraceDiff):
        return [r.to_json() for r in d.rows]

    expected = rows(diff(dumps["A"], dumps["B"]))
    as_dict = json.loads(Path(dumps["B"]).read_text())
    assert rows(diff(str(dumps["A"]), as_dict)) == expected
    assert rows(diff(load_json(dumps["A"]), dumps["B_mode"])) == expected
    live = diff(dumps["A_mode"], dumps["B_mode"].trace())
    assert rows(live) == expected
    assert isinstance(dumps["A_mode"].trace(), CommTrace)
    assert (live.a.label, live.b.label) == ("a", "b")
    named = diff(dumps["A"], dumps["B"], labels=("main", "pr"))
    assert (named.a.label, named.b.label) == ("main", "pr")


def test_bad_inputs_name_the_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(DiffInputError, match=r"cannot read .*bad\.json as JSON"):
        diff(bad, bad)
    with pytest.raises(DiffInputError, match=r"no such file: .*missing\.json"):
        diff(tmp_path / "missing.json", bad)
    with pytest.raises(DiffInputError, match="b is not a CommDebugMode JSON dump"):
        diff({"fqn": "Global", "children": []}, {"entries": []})
    with pytest.raises(DiffInputError, match="cannot compare a int"):
        diff(3, 4)
    broken = {"fqn": "Global", "children": [], "commscope": {"records": [{"index": 0}]}}
    with pytest.raises(DiffInputError, match="a is not a readable CommDebugMode JSON dump"):
        diff(broken, broken)


@torch_has("dtensor_tp_transformer_on_cpu")
def test_sequence_parallel_moves_more_bytes_in_less_time(tmp_path, capsys):
    """The 2-layer TP Transformer without and with SP (docs/comm.md's counts: TP issues
    all_reduce 15 + all_gather 1, TP + SP reduce_scatter 11 + all_gather 12). Bytes rise:
    each all_reduce becomes a reduce_scatter + all_gather pair that counts its message
    twice; link traffic and estimated time fall (all_reduce's factor is 2(n-1)/n), and
    --fail-on-increase, which checks estimated time, lets it pass."""
    from torch.distributed.device_mesh import init_device_mesh

    from commscope.comm import CommDebugMode
    from commscope.comm.examples import tp_transformer, transformer_input
    from tests.harness import fake_world

    paths = []
    with fake_world(0, 4):
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
        for sp in (False, True):
            model = tp_transformer(mesh, sequence_parallel=sp)
            with CommDebugMode() as cm:
                model(transformer_input()).sum().backward()
            paths.append(str(tmp_path / f"sp{int(sp)}.json"))
            cm.generate_json_dump(paths[-1], noise_level=0)
    d = diff(*paths)
    assert {(n.collective, n.calls_delta) for n in d.net} == {
        ("all_reduce", -15), ("all_gather", 11), ("reduce_scatter", 11)
    }
    assert all(n.axis == "tp" for n in d.net)
    assert d.totals.bytes_delta > 0 and d.totals.est_us_delta < 0
    assert d.growth().percent < 0
    assert main(["diff", *paths, "--fail-on-increase", "0"]) == 0
    assert "-15 all_reduce on tp" in capsys.readouterr().out


# ------------------------------------------------------------------ PyTorch's dumps


def test_pytorch_dump_against_ours(dumps):
    """PyTorch's dump has inclusive counts only: own counts are derived, bytes and axes
    are unknown and ours are folded to '?' so the rows line up."""
    d = diff(dumps["A"], dumps["B_torch"])
    assert d.b.source == "pytorch" and not d.b.has_bytes and not d.axes_known
    assert [(_key(r), r.calls_delta) for r in d.changed] == [
        (("MLPModule.net1", "forward", "all_gather", UNKNOWN_AXIS), 1),
        (("MLPModule.net2", "backward", "all_gather", UNKNOWN_AXIS), 1),
    ]
    for row in d.rows:
        assert row.bytes_after is None and row.bytes_delta is None and row.est_us_delta is None
        assert row.bytes_before is not None
    assert d.growth().measure == "calls" and d.growth().percent == pytest.approx(200.0)
    assert summary_line(d) == (
        f"+2 all_gather, bytes and time unknown ({dumps['B_torch']}: counts only)"
    )
    # PyTorch and commscope agree on the same plan: only the bytes are new on our side.
    same = diff(dumps["B_torch"], dumps["B"])
    assert same.changed == [] and same.totals.calls_before == same.totals.calls_after == 3


def test_pytorch_fixture_dump():
    """PyTorch 2.13's own dump of the tutorial MLP (tests/data/comm): one all_reduce,
    charged to net2 alone although Global and MLPModule list it too."""
    fixture = DATA / "pytorch_mlp_fwd_bwd_noise0.json"
    d = diff(fixture, fixture)
    assert d.changed == [] and [_key(r) for r in d.rows] == [
        ("MLPModule.net2", "forward", "all_reduce", UNKNOWN_AXIS)
    ]
    assert summary_line(d) == "no change (1 call in both traces)"
    assert d.a.describe().endswith("(pytorch: counts only, no bytes or axes)")


def test_json_form(dumps):
    data = diff_to_json(diff(dumps["A"], dumps["B"]))
    assert data["schema"] == "commscope.comm.diff" and data["schema_version"] == 1
    assert data["totals"]["bytes_delta"] == 1024
    assert data["growth"] == {"measure": "est_us", "before": pytest.approx(d_est(dumps, 0)),
                              "after": pytest.approx(d_est(dumps, 2)),
                              "percent": pytest.approx(160.0)}
    assert [r["collective"] for r in data["rows"]] == ["all_gather", "all_gather"]
    assert data["unchanged_rows"] == 1
    assert json.loads(json.dumps(data)) == data  # plain JSON, no Infinity


# ------------------------------------------------------------------ the command


def test_cli_text_and_exit_status(dumps, capsys):
    assert main(["diff", str(dumps["A"]), str(dumps["B"])]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"A: {dumps['A']} (commscope, rank 0 of {dumps['world']}, torch ")
    assert lines[3].split() == [
        "module", "phase", "collective", "axis", "calls", "A", "calls", "B", "calls", "+/-",
        "bytes", "A", "bytes", "B", "bytes", "+/-", "est.", "+/-", "@", "100", "GB/s",
    ]
    assert lines[5].split()[:12] == [
        "MLPModule.net1", "forward", "all_gather", "tp", "0", "1", "+1", "0", "B", "512", "B",
        "+512",
    ]
    assert "1 unchanged row hidden (--all to show)" in out
    assert lines[-1].startswith("A -> B: +2 all_gather on tp, +1.0 KB (+320.0%), est. +")
    assert lines[-1].endswith(" (+160.0%) at 100 GB/s")
    assert main(["diff", str(dumps["A"]), str(dumps["B"]), "--all"]) == 0
    assert "MLPModule.net2  forward   all_reduce" in capsys.readouterr().out


def test_cli_rich_table_on_a_terminal(dumps, capsys, monkeypatch):
    import commscope.console

    monkeypatch.setattr(commscope.console, "use_rich", lambda stream: True)
    assert main(["diff", str(dumps["stacked1"]), str(dumps["stacked2"])]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "layers.1.net1" in line).split()
    assert row == ["MLPStacked.layers.1.net1", "backward", "all_reduce", "tp", "0", "1", "+1",
                   "0", "B", "320", "B", "+320", "B", row[-2], "ns"]
    assert "only in B: MLPStacked.layers.1 (+3 submodules)" in out


def test_cli_fail_on_increase_both_ways(dumps, capsys):
    a, b = str(dumps["A"]), str(dumps["B"])
    assert main(["diff", a, b, "--fail-on-increase", "150"]) == 1  # est. time +160%
    err = capsys.readouterr().err
    before, after = {4: ("4.8 ns", "12.5 ns"), 2: ("3.2 ns", "8.3 ns")}[dumps["world"]]
    assert err == (f"commscope diff: total estimated time rose by 160.0% ({before} -> {after} "
                   "at 100 GB/s), more than --fail-on-increase 150%\n")
    assert main(["diff", a, b, "--fail-on-increase", "170"]) == 0  # bytes rose 320%: not it
    assert main(["diff", b, a, "--fail-on-increase", "0"]) == 0  # a decrease
    assert main(["diff", a, a, "--fail-on-increase", "0"]) == 0
    # A PyTorch dump has no bytes: calls are compared (1 -> 3, +200%).
    assert main(["diff", a, str(dumps["B_torch"]), "--fail-on-increase", "150"]) == 1
    assert "total calls rose by 200.0% (1 -> 3), more" in capsys.readouterr().err
    assert main(["diff", a, str(dumps["B_torch"]), "--fail-on-increase", "250"]) == 0


def test_cli_json(dumps, capsys):
    assert main(["diff", str(dumps["A"]), str(dumps["B"]), "--json",
                 "--bandwidth-gbps", "10"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(data) == sorted([
        "schema", "schema_version", "bandwidth_gbps", "a", "b", "axes_known", "summary",
        "totals", "growth", "net", "rows", "unchanged_rows", "only_in_a", "only_in_b",
        "module_order",
    ])
    assert data["bandwidth_gbps"] == 10 and data["axes_known"] is True
    assert data["a"]["label"] == str(dumps["A"]) and data["a"]["source"] == "commscope"
    assert data["rows"][0] == {
        "module": "MLPModule.net1", "phase": "forward", "collective": "all_gather",
        "axis": "tp", "calls_before": 0, "calls_after": 1, "calls_delta": 1,
        "bytes_before": 0, "bytes_after": 512, "bytes_delta": 512,
        "est_us_before": 0.0, "est_us_after": pytest.approx(10 * _ag_us(dumps["world"])),
        "est_us_delta": pytest.approx(10 * _ag_us(dumps["world"])), "direction": 1,
    }
    assert len(data["rows"]) == 2
    assert main(["diff", str(dumps["A"]), str(dumps["B"]), "--json", "--all"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 3


def test_cli_html(dumps, tmp_path, capsys):
    page = tmp_path / "d.html"
    assert main(["diff", str(dumps["A"]), str(dumps["B"]), "--json", "--html", str(page)]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays pure JSON
    assert captured.err == f"wrote {page}\n"
    text = page.read_text()
    start = text.index('<script type="application/json" id="diff-data">') + 47
    embedded = json.loads(text[start : text.index("</script>", start)])
    assert embedded["unchanged_rows"] == 1 and len(embedded["rows"]) == 3  # all rows
    assert "src=" not in text and "href=" not in text and "http" not in text


@pytest.mark.parametrize(
    ("files", "extra", "message"),
    [
        (("good", "bad"), [], "cannot read bad.json as JSON"),
        (("bad", "good"), [], "cannot read bad.json as JSON"),
        (("good", "missing"), [], "no such file: missing.json"),
        (("other", "good"), [], "other.json is not a CommDebugMode JSON dump"),
        (("empty", "good"), [], "cannot read empty.json as JSON"),
        (("good", "good"), ["--bandwidth-gbps", "0"], "--bandwidth-gbps must be a number > 0"),
        (("good", "good"), ["--fail-on-increase", "-1"], "--fail-on-increase must be a"),
        (("good", "good"), ["--html", "nodir/x.html"], "cannot write nodir/x.html"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    dumps, tmp_path, monkeypatch, capsys, files, extra, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.json").write_text(Path(dumps["A"]).read_text())
    (tmp_path / "bad.json").write_text('{"fqn": "Global", "chil')  # truncated
    (tmp_path / "other.json").write_text('{"entries": []}')
    (tmp_path / "empty.json").write_text("")
    assert main(["diff", *(f"{f}.json" for f in files), *extra]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("commscope diff: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["diff", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "commscope diff main.json pr.json --fail-on-increase 5" in out
