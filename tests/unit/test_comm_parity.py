"""Our CommDebugMode counts what PyTorch's counts, on the same models (fake process group).

Each test runs the same step twice on fresh, identically seeded models: once under
PyTorch's ``CommDebugMode``, once under ours, and compares totals, per-key counts and
per-module forward/backward counts. Where PyTorch is wrong (TP+SP backward attribution)
the test states the one expected difference.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

pytest.importorskip("expecttest")

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

from commscope import compat
from commscope.comm import CommDebugMode
from commscope.comm.examples import (
    mlp_input,
    tp_mlp,
    tp_transformer,
    transformer_input,
)
from tests.needs import torch_has

warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)


def _counts(cm):
    return {str(k): v for k, v in cm.get_comm_counts().items() if v}


def _module_counts(cm):
    return {
        fqn: {phase: {str(k): v for k, v in d.items() if v} for phase, d in entry.items()
              if phase in ("forward", "backward")}
        for fqn, entry in cm.comm_module_counts.items()
    }


def _run_both(build, step):
    """PyTorch's mode and ours on the same model; ours also with ``ops=False`` (no
    dispatch mode at all), which must capture exactly the same collectives."""
    result = {}
    for name, make in (("torch", TorchCommDebugMode), ("ours", CommDebugMode),
                       ("hooked", lambda: CommDebugMode(ops=False))):
        model, inp = build()
        cm = make()
        with cm:
            step(model, inp)
        result[name] = cm
    ours, hooked = result["ours"], result["hooked"]
    assert hooked.get_total_counts() == ours.get_total_counts() > 0
    assert _counts(hooked) == _counts(ours)
    assert hooked.comm_module_counts == ours.comm_module_counts
    assert hooked.records == ours.records
    return result["torch"], ours


_AG = "c10d_functional.all_gather_into_tensor"


def _charge_wo_regather_to_attention(mine: dict, pytorch: dict) -> None:
    """torch before 2.12: DTensor all-gathers attention's output once more in backward,
    inside attention but after ``wo``'s backward pre-hook fired. PyTorch charges it to
    ``attention.wo``; we charge it to ``attention``, whose forward made the autograd node
    (both count it under ``attention``). Move PyTorch's to where ours is."""
    if compat.has("dtensor_counts_of_2_12"):
        return
    for layer in (0, 1):
        wo = f"Transformer.layers.{layer}.attention.wo"
        theirs = dict(pytorch[wo]["backward"])
        assert theirs.get(_AG, 0) == mine[wo]["backward"].get(_AG, 0) + 1, (wo, theirs)
        if theirs[_AG] == 1:
            del theirs[_AG]
        else:
            theirs[_AG] -= 1
        pytorch[wo] = {**pytorch[wo], "backward": theirs}


def _forward(model, inp):
    model(inp)


def _forward_backward(model, inp):
    model(inp).sum().backward()


@pytest.fixture
def tp_mesh(fake_pg):
    with fake_pg(0, 4):
        yield init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))


@pytest.mark.parametrize("step", [_forward, _forward_backward], ids=["fwd", "fwd+bwd"])
def test_tp_mlp_matches_pytorch(tp_mesh, step):
    theirs, ours = _run_both(lambda: (tp_mlp(tp_mesh), mlp_input()), step)
    assert _counts(ours) == _counts(theirs) == {"c10d_functional.all_reduce": 1}
    assert ours.get_total_counts() == theirs.get_total_counts() == 1
    assert _module_counts(ours) == _module_counts(theirs)
    assert ours.get_sharding_info() == theirs.get_sharding_info()
    assert repr(ours) == "CommDebugMode(get_total_counts()=1)"
    if compat.has("comm_debug_mode_repr"):  # torch 2.10+ prints its mode so too
        assert repr(theirs) == repr(ours)
    ours_params = ours.get_parameter_info()
    theirs_params = theirs.get_parameter_info()
    assert {m: sorted(p) for m, p in ours_params.items()} == {
        m: sorted(p) for m, p in theirs_params.items()
    }
    for fqn, params in theirs_params.items():
        for name, value in params.items():
            assert type(ours_params[fqn][name]) is type(value)
            assert ours_params[fqn][name].shape == value.shape
    tracker, their_tracker = ours.advanced_module_tracker, theirs.advanced_module_tracker
    assert tracker.module_helper_dict == their_tracker.module_helper_dict
    assert tracker.parent_dict == their_tracker.parent_dict
    assert tracker.module_parents_dict == their_tracker.module_parents_dict
    assert tracker.sharding_dict == their_tracker.sharding_dict


@torch_has("dtensor_tp_transformer_on_cpu")
def test_tp_transformer_forward_matches_pytorch(tp_mesh):
    theirs, ours = _run_both(lambda: (tp_transformer(tp_mesh), transformer_input()), _forward)
    assert _counts(ours) == _counts(theirs)
    if compat.has("dtensor_counts_of_2_12"):  # what torch's DTensor issues since 2.12
        assert _counts(ours) == {
            "c10d_functional.all_reduce": 6,
            "c10d_functional.all_gather_into_tensor": 1,
        }
    assert _module_counts(ours) == _module_counts(theirs)


@torch_has("dtensor_tp_transformer_on_cpu")
def test_tp_transformer_forward_backward_matches_pytorch(tp_mesh):
    theirs, ours = _run_both(
        lambda: (tp_transformer(tp_mesh), transformer_input()), _forward_backward
    )
    assert _counts(ours) == _counts(theirs)
    if compat.has("dtensor_counts_of_2_12"):
        assert ours.comm_module_counts["Global"]["backward"]["all_reduce"] == 9
    mine, pytorch = _module_counts(ours), _module_counts(theirs)
    _charge_wo_regather_to_attention(mine, pytorch)
    assert mine == pytorch


@torch_has("dtensor_tp_transformer_on_cpu")
def test_tp_sp_transformer_matches_pytorch_except_backward_attribution(tp_mesh):
    theirs, ours = _run_both(
        lambda: (tp_transformer(tp_mesh, sequence_parallel=True), transformer_input()),
        _forward_backward,
    )
    assert _counts(ours) == _counts(theirs)
    if compat.has("dtensor_counts_of_2_12"):
        assert _counts(ours) == {
            "c10d_functional.reduce_scatter_tensor": 11,
            "c10d_functional.all_gather_into_tensor": 12,
        }
    mine, pytorch = _module_counts(ours), _module_counts(theirs)
    # PyTorch charges the backward reduce-scatter of attention's input redistribution
    # (PrepareModuleInput, attention's own hook) to attention.wq, whose backward pre-hook
    # fired last. It belongs to attention, which both of us already count it under.
    for layer in (0, 1):
        wq = f"Transformer.layers.{layer}.attention.wq"
        attention = f"Transformer.layers.{layer}.attention"
        assert pytorch[wq]["backward"] == {"c10d_functional.reduce_scatter_tensor": 1}
        assert wq not in mine
        assert mine[attention] == pytorch[attention]
        assert mine[attention]["backward"]["c10d_functional.reduce_scatter_tensor"] == 1
        del pytorch[wq]
    _charge_wo_regather_to_attention(mine, pytorch)
    assert mine == pytorch


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


@torch_has("fsdp2_on_cpu")
def test_fsdp2_matches_pytorch(fake_pg):
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        model = _Net()
        fully_shard(model.l1)
        fully_shard(model.l2)
        fully_shard(model)
        return model, torch.randn(4, 8)

    with fake_pg(0, 2):
        theirs, ours = _run_both(build, _forward_backward)
        assert _counts(ours) == _counts(theirs) == {
            "c10d._allgather_base_": 4,
            "c10d._reduce_scatter_base_": 2,
        }
        assert _module_counts(ours) == _module_counts(theirs)
        # l1's reduce-scatter runs in FSDP2's end-of-backward callback (its input needs no
        # grad): charged to l1, whose node ran last.
        (l1,) = [fqn for fqn in ours.comm_module_counts if fqn.endswith(".l1")]
        assert ours.comm_module_counts[l1]["backward"]["reduce_scatter"] == 1
        assert {r.collective for r in ours.records} == {"all_gather", "reduce_scatter"}
        assert all(r.group_size == 2 and r.bytes > 0 for r in ours.records)


def _redistributions(mesh):
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    out = {}

    def case(name, fn):
        out[name] = fn

    case("distribute Shard(0)", lambda: distribute_tensor(t, mesh, [Shard(0)]))
    shard0 = distribute_tensor(t, mesh, [Shard(0)])
    case("Shard(0)->Replicate", lambda: shard0.redistribute(mesh, [Replicate()]))
    case("Shard(0)->Shard(1)", lambda: shard0.redistribute(mesh, [Shard(1)]))
    case("full_tensor", lambda: shard0.full_tensor())
    replicated = distribute_tensor(t, mesh, [Replicate()])
    case("Replicate->Shard(0)", lambda: replicated.redistribute(mesh, [Shard(0)]))
    from torch.distributed.tensor import DTensor

    partial = DTensor.from_local(t.clone(), mesh, [Partial()], run_check=False)
    case("Partial->Replicate", lambda: partial.redistribute(mesh, [Replicate()]))
    case("Partial->Shard(0)", lambda: partial.redistribute(mesh, [Shard(0)]))
    return out


def test_dtensor_redistributions_match_pytorch(tp_mesh):
    expected = {
        "distribute Shard(0)": {"c10d.scatter_": 1},
        "Shard(0)->Replicate": {"c10d_functional.all_gather_into_tensor": 1},
        "Shard(0)->Shard(1)": {"c10d_functional.all_gather_into_tensor": 1},
        "full_tensor": {"c10d_functional.all_gather_into_tensor": 1},
        "Replicate->Shard(0)": {},
        "Partial->Replicate": {"c10d_functional.all_reduce": 1},
        "Partial->Shard(0)": {"c10d_functional.reduce_scatter_tensor": 1},
    }
    for name, fn in _redistributions(tp_mesh).items():
        with TorchCommDebugMode() as theirs:
            fn()
        with CommDebugMode() as ours:
            fn()
        assert _counts(ours) == _counts(theirs) == expected[name], name
        for record in ours.records:
            assert record.axis == "tp", (name, record)
            assert record.group_size == 4
            assert record.module == "Global" and record.phase == "forward"
