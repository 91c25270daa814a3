"""Small parallel models for examples, tests and benchmarks of the comm tracer.

They are PyTorch's own test models (``torch.testing._internal.distributed._tensor
.common_dtensor``), parallelized the way PyTorch's CommDebugMode tutorial does it, so our
numbers can be compared with PyTorch's. That module needs the ``expecttest`` package.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["tp_mlp", "tp_transformer", "mlp_input", "transformer_input"]


def _common() -> Any:
    try:
        from torch.testing._internal.distributed._tensor import common_dtensor
    except ImportError as exc:
        raise ImportError(
            "commscope.comm.examples needs PyTorch's test models, which import "
            f"'expecttest' ({exc}); pip install expecttest"
        ) from exc
    return common_dtensor


def tp_mlp(mesh: Any, *, seed: int = 0) -> torch.nn.Module:
    """The tutorial's ``MLPModule`` (10 -> 16 -> 10) with ``net1`` colwise and ``net2``
    rowwise on a 1-D ``mesh``: one forward all-reduce."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(seed)
    model = _common().MLPModule(mesh.device_type)
    return parallelize_module(model, mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})


def mlp_input(*, seed: int = 0) -> torch.Tensor:
    """An input batch for :func:`tp_mlp` (8 x 10)."""
    torch.manual_seed(seed)
    return torch.rand(8, 10)


def tp_transformer(
    mesh: Any, *, sequence_parallel: bool = False, n_layers: int = 2, seed: int = 0
) -> torch.nn.Module:
    """PyTorch's test ``Transformer`` (dim 16) parallelized with TP (and SP).

    ``use_attn_mask`` is off: on CPU, SDPA's math path would build a plain-tensor causal
    mask that DTensor refuses to mix with DTensors.
    """
    common = _common()
    torch.manual_seed(seed)
    args = common.ModelArgs(n_layers=n_layers, use_attn_mask=False)
    model = common.Transformer(args)
    return common.Transformer.parallelize(model, mesh, use_seq_parallel=sequence_parallel)


def transformer_input(*, seed: int = 0) -> torch.Tensor:
    """Token ids for :func:`tp_transformer` (batch 8, sequence 8)."""
    torch.manual_seed(seed)
    return torch.randint(0, 8, (8, 8))
