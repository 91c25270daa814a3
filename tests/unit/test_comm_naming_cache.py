"""Module names kept across blocks (``modules._NAMINGS``) are exactly what a fresh walk
gives, also after the model changed between blocks.

Each case runs a block with the cache as it is, and compares the names with those of a
block whose tracker is not allowed to use the cache (a fresh walk, as PyTorch names).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from commscope.comm import CommDebugMode
from commscope.comm.capture import modules


class Block(nn.Module):
    """Two linears and an activation."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.down = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Model(nn.Module):
    """Two blocks in a ModuleList, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _names(model: nn.Module, *, cached: bool) -> list[str]:
    """The FQNs one ``ops=False`` block gives, in first-run order."""
    saved = modules._NAMINGS.lookup
    if not cached:
        modules._NAMINGS.lookup = lambda root: None  # type: ignore[method-assign]
    try:
        with CommDebugMode(ops=False) as mode:
            model(torch.randn(2, 4))
    finally:
        modules._NAMINGS.lookup = saved  # type: ignore[method-assign]
    return [rec.fqn for rec in mode.advanced_module_tracker.modules()]


def _check(model: nn.Module) -> list[str]:
    """The cached names (taken first, from what earlier blocks stored) equal a fresh
    walk's."""
    got = _names(model, cached=True)
    assert got == _names(model, cached=False)
    return got


def test_a_second_block_takes_the_names_from_the_cache() -> None:
    model = Model()
    first = _check(model)
    assert modules._NAMINGS.lookup(model) is not None
    assert _names(model, cached=True) == first
    assert "Model.blocks.1.down" in first


def test_a_replaced_child_is_named_afresh() -> None:
    model = Model()
    _check(model)
    model.blocks[1].down = nn.Sequential(nn.Linear(8, 4))
    names = _check(model)
    assert "Model.blocks.1.down.0" in names


def test_an_added_child_is_named() -> None:
    model = Model()
    _check(model)
    model.blocks.append(Block())
    assert "Model.blocks.2.up" in _check(model)


def test_a_root_whose_class_changes_is_renamed() -> None:
    """``fully_shard`` swaps the class for ``FSDP<name>``: the names follow."""
    model = Model()
    _check(model)
    model.__class__ = type("FSDPModel", (Model,), {})
    names = _check(model)
    assert names[1] == "FSDPModel"
    assert "FSDPModel.head" in names


def test_a_shared_module_is_named_as_a_fresh_walk_names_it() -> None:
    model = Model()
    model.blocks[1].up = model.blocks[0].up
    _check(model)
    _check(model)


def test_a_module_run_on_its_own_is_a_root_of_its_own() -> None:
    model = Model()
    _check(model)
    names = _check(model.blocks[0])
    assert names[1] == "Block"
    assert _check(model)[1] == "Model"


def test_a_freed_model_leaves_no_strong_reference() -> None:
    import gc
    import weakref

    model = Model()
    _check(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_names_match_pytorchs_mod_tracker_with_a_shared_module() -> None:
    """A module reachable by two paths is named as PyTorch's ``ModTracker`` names it (a
    rename does not walk the module's children again), first block and cached block."""
    from torch.distributed._tools.mod_tracker import ModTracker

    model = Model()
    model.blocks[1].up = model.blocks[0].up
    model.blocks[1].act = model.blocks[0]  # a whole block below another: deeper sharing
    model.blocks[1].forward = lambda x: model.blocks[1].down(model.blocks[1].up(x))
    theirs = ModTracker()
    with theirs:
        model(torch.randn(2, 4))
    expected = {id(m): theirs.get_known_fqn(m) for m in model.modules()}
    for _ in range(2):  # a fresh walk, then the names from the cache
        with CommDebugMode(ops=False) as mode:
            model(torch.randn(2, 4))
        tracker = mode.advanced_module_tracker
        assert {id(m): tracker.get_known_fqn(m) for m in model.modules()} == expected
