"""A mixture-of-experts training job shaped like Megatron-Core's, for the bed's scenarios.

The job is what an NCCL job of that kind issues, scaled down:

* **groups** (:class:`Layout`), created on every rank in Megatron's order with
  Megatron's descriptions (``TENSOR_MODEL_PARALLEL_GROUP``, ``PIPELINE_MODEL_PARALLEL_GROUP``,
  ``EXPERT_MODEL_PARALLEL_GROUP``, ``CONTEXT_PARALLEL_GROUP`` ...): ranks are laid out
  ``tp-cp-dp-pp`` (tensor parallel fastest), experts ``tp-ep-dp-pp`` with an expert
  tensor parallel size of 1. A rank is a member of one group of each kind, so its
  ``pg_id`` numbering follows the kinds it belongs to.
* **a step** (:func:`train_step`): a 1F1B pipeline schedule over ``microbatches``
  (Megatron's ``forward_backward_pipelining_without_interleaving``), each send/recv
  combination one ``batch_isend_irecv`` on the pipeline group (or, with
  ``p2p_on_default``, plain ``isend``/``irecv`` on the default group); every forward and
  backward pass does sequence-parallel all_gather/reduce_scatter on the tensor group,
  an all_gather on the context group, and the MoE token dispatch and combine
  (``all_to_all_single``) on the expert group, with compute kernels between them; then
  the distributed optimizer's reduce_scatter and all_gather on the data+context group,
  the expert grads' all_reduce, the tied embedding's all_reduce between the first and
  last stage, the grad norm's all_reduce on the model-parallel group and its
  ``.item()``: the step's one host sync.
* **faults** are injected through :class:`Hooks`: the scenario's code runs at named
  points of the step and may skip what follows (a skipped collective or recv).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import product
from typing import Any

import torch
import torch.distributed as dist

from tests.ncclbed import backend

__all__ = ["Layout", "Hooks", "Groups", "make_groups", "train_step", "train"]

HIDDEN = 32
TOKENS = 16


@dataclass(frozen=True)
class Layout:
    """Parallel sizes; ``dp`` follows from the world size."""

    world: int
    tp: int = 2
    cp: int = 2
    pp: int = 2
    ep: int = 4

    @property
    def dp(self) -> int:
        """Data-parallel size."""
        return self.world // (self.tp * self.cp * self.pp)

    def rank(self, tp: int, cp: int, dp: int, pp: int) -> int:
        """Global rank of a coordinate (``tp-cp-dp-pp``, tensor parallel fastest)."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def coords(self, rank: int) -> dict[str, int]:
        """``{"tp", "cp", "dp", "pp"}`` of a rank."""
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return {"tp": tp, "cp": cp, "dp": dp, "pp": pp}

    def _vary(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Groups of ranks that differ only along ``axes``."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        fixed = [a for a in ("tp", "cp", "dp", "pp") if a not in axes]
        out = []
        for values in product(*(range(sizes[a]) for a in reversed(fixed))):
            base = dict(zip(reversed(fixed), values))
            ranks = sorted(self.rank(**{**base, **dict(zip(axes, v))})
                           for v in product(*(range(sizes[a]) for a in axes)))
            out.append(ranks)
        return sorted(out)

    def _expert(self, axes: tuple[str, ...]) -> list[list[int]]:
        """Expert groups: within a stage, ``ep`` consecutive non-pipeline ranks."""
        per_stage = self.world // self.pp
        edp = per_stage // self.ep
        out = []
        for pp in range(self.pp):
            stage = list(range(pp * per_stage, (pp + 1) * per_stage))
            if axes == ("ep",):
                out += [stage[i * self.ep:(i + 1) * self.ep] for i in range(edp)]
            elif axes == ("dp",):
                out += [stage[i::self.ep] for i in range(self.ep)]
        return out

    def groups(self) -> list[tuple[str, list[list[int]]]]:
        """Every kind of group, in Megatron's order of creation, with its groups."""
        stages = self._vary(("pp",))
        return [
            ("DATA_PARALLEL_GROUP_WITH_CP", self._vary(("cp", "dp"))),
            ("DATA_PARALLEL_GROUP", self._vary(("dp",))),
            ("CONTEXT_PARALLEL_GROUP", self._vary(("cp",))),
            ("MODEL_PARALLEL_GROUP", self._vary(("tp", "pp"))),
            ("TENSOR_MODEL_PARALLEL_GROUP", self._vary(("tp",))),
            ("PIPELINE_MODEL_PARALLEL_GROUP", stages),
            ("EMBEDDING_GROUP", [[g[0], g[-1]] for g in stages]),
            ("POSITION_EMBEDDING_GROUP", [[g[0]] for g in stages]),
            ("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", self._vary(("tp", "cp", "dp"))),
            ("TENSOR_AND_CONTEXT_PARALLEL_GROUP", self._vary(("tp", "cp"))),
            ("EXPERT_MODEL_PARALLEL_GROUP", self._expert(("ep",))),
            ("EXPERT_DATA_PARALLEL_GROUP", self._expert(("dp",))),
        ]


@dataclass
class Groups:
    """This rank's group of each kind (``None`` where it is in none)."""

    by_desc: dict[str, Any] = field(default_factory=dict)
    ranks: dict[str, list[int]] = field(default_factory=dict)

    def __getitem__(self, desc: str) -> Any:
        return self.by_desc[desc]


def make_groups(layout: Layout, rank: int) -> Groups:
    """Create every group on this rank, in Megatron's order (every rank creates every
    group; a rank keeps the one of each kind it is a member of), each with the job's
    timeout, as Megatron passes ``--distributed-timeout-minutes`` to every group."""
    mine = Groups()
    timeout = timedelta(seconds=float(os.environ.get("BED_TIMEOUT_S", "5")))
    for desc, groups in layout.groups():
        for ranks in groups:
            pg = dist.new_group(ranks, group_desc=desc, timeout=timeout)
            if rank in ranks:
                mine.by_desc[desc] = pg
                mine.ranks[desc] = ranks
    return mine


Hook = Callable[[str, int, int, Any], bool | None]
"""``hook(point, rank, step, detail) -> skip``: runs at a named point of the step; a
true result skips what follows the point (one collective, or one send/recv)."""


@dataclass
class Hooks:
    """Fault injection: every point of the step asks :meth:`at`."""

    hooks: list[Hook] = field(default_factory=list)

    def at(self, point: str, rank: int, step: int, detail: Any = None) -> bool:
        """Run the hooks at ``point``; whether to skip what follows."""
        skip = False
        for h in self.hooks:
            skip = bool(h(point, rank, step, detail)) or skip
        return skip


@dataclass
class _Ctx:
    layout: Layout
    rank: int
    step: int
    g: Groups
    hooks: Hooks
    p2p_on_default: bool
    compute_ms: float


def _act(rows: int = TOKENS) -> torch.Tensor:
    return torch.ones(rows, HIDDEN)


def _coll(c: _Ctx, point: str, run: Callable[[], Any]) -> None:
    if not c.hooks.at(point, c.rank, c.step):
        run()


def _layer(c: _Ctx, phase: str) -> None:
    """One transformer + MoE layer, forward or backward."""
    tp, cp, ep = (c.g["TENSOR_MODEL_PARALLEL_GROUP"], c.g["CONTEXT_PARALLEL_GROUP"],
                  c.g["EXPERT_MODEL_PARALLEL_GROUP"])
    x = _act()
    full = torch.empty(TOKENS * c.layout.tp, HIDDEN)
    _coll(c, f"{phase}:tp_all_gather",
          lambda: dist.all_gather_into_tensor(full, x, group=tp))
    kv = torch.empty(TOKENS * c.layout.cp, HIDDEN)
    _coll(c, f"{phase}:cp_all_gather", lambda: dist.all_gather_into_tensor(kv, x, group=cp))
    backend.compute(c.compute_ms)
    tokens = torch.ones(TOKENS * c.layout.ep, HIDDEN)
    routed = torch.empty_like(tokens)
    _coll(c, f"{phase}:ep_dispatch", lambda: dist.all_to_all_single(routed, tokens, group=ep))
    backend.compute(c.compute_ms)
    _coll(c, f"{phase}:ep_combine", lambda: dist.all_to_all_single(tokens, routed, group=ep))
    _coll(c, f"{phase}:tp_reduce_scatter",
          lambda: dist.reduce_scatter_tensor(x, full, group=tp))


def _communicate(c: _Ctx, send_next: bool, send_prev: bool, recv_prev: bool,
                 recv_next: bool, what: str) -> None:
    """Megatron's ``_communicate``: the step's send/recv with the neighbouring stages."""
    stages = c.g.ranks["PIPELINE_MODEL_PARALLEL_GROUP"]
    me = stages.index(c.rank)
    prev = stages[me - 1] if me > 0 else None
    nxt = stages[me + 1] if me + 1 < len(stages) else None
    wanted = {("send", "prev"): send_prev, ("recv", "prev"): recv_prev,
              ("send", "next"): send_next, ("recv", "next"): recv_next}
    peers = {"prev": prev, "next": nxt}
    # Megatron's order: one batch in any order; one op at a time (_p2p_ops), even stages
    # send first and odd ones receive first, so two neighbours never both send first
    order = [("send", "next"), ("recv", "prev"), ("send", "prev"), ("recv", "next")] \
        if me % 2 == 0 else [("recv", "prev"), ("send", "next"), ("recv", "next"),
                             ("send", "prev")]
    ops = [(kind, peers[side]) for kind, side in order
           if wanted[(kind, side)] and peers[side] is not None]
    ops = [op for op in ops if not c.hooks.at(f"p2p:{what}:{op[0]}", c.rank, c.step, op[1])]
    if not ops:
        return
    if c.p2p_on_default:
        for kind, peer in ops:
            fn = dist.isend if kind == "send" else dist.irecv
            fn(_act(), peer)
        return
    group = c.g["PIPELINE_MODEL_PARALLEL_GROUP"]
    batch = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, _act(), peer, group)
             for kind, peer in ops]
    for req in dist.batch_isend_irecv(batch):
        req.wait()


def train_step(c: _Ctx, microbatches: int) -> None:
    """One step: 1F1B over the microbatches, then the optimizer and the grad norm."""
    stages = c.g.ranks["PIPELINE_MODEL_PARALLEL_GROUP"]
    stage, pp = stages.index(c.rank), len(stages)
    c.hooks.at("step", c.rank, c.step)
    warmup = min(pp - stage - 1, microbatches)
    remaining = microbatches - warmup
    for _ in range(warmup):
        _communicate(c, False, False, True, False, "recv_forward")
        _layer(c, "fwd")
        _communicate(c, True, False, False, False, "send_forward")
    if remaining:
        _communicate(c, False, False, True, False, "recv_forward")
    for i in range(remaining):
        last = i == remaining - 1
        _layer(c, "fwd")
        _communicate(c, True, False, False, True, "send_forward_recv_backward")
        _layer(c, "bwd")
        if last:
            _communicate(c, False, True, False, False, "send_backward")
        else:
            _communicate(c, False, True, True, False, "send_backward_recv_forward")
    for _ in range(warmup):
        _communicate(c, False, False, False, True, "recv_backward")
        _layer(c, "bwd")
        _communicate(c, False, True, False, False, "send_backward")
    c.hooks.at("optimizer", c.rank, c.step)
    grads = torch.ones(8 * c.layout.cp * c.layout.dp, HIDDEN)
    shard = torch.empty(8, HIDDEN)
    dpcp = c.g["DATA_PARALLEL_GROUP_WITH_CP"]
    _coll(c, "opt:dp_reduce_scatter", lambda: dist.reduce_scatter_tensor(shard, grads, group=dpcp))
    _coll(c, "opt:expert_dp_all_reduce",
          lambda: dist.all_reduce(torch.ones(8, HIDDEN), group=c.g["EXPERT_DATA_PARALLEL_GROUP"]))
    if c.rank in c.g.ranks.get("EMBEDDING_GROUP", ()):
        _coll(c, "opt:embedding_all_reduce",
              lambda: dist.all_reduce(torch.ones(4, HIDDEN), group=c.g["EMBEDDING_GROUP"]))
    _coll(c, "opt:dp_all_gather", lambda: dist.all_gather_into_tensor(grads, shard, group=dpcp))
    norm = torch.ones(1)
    _coll(c, "opt:grad_norm", lambda: dist.all_reduce(norm, group=c.g["MODEL_PARALLEL_GROUP"]))
    if not c.hooks.at("sync", c.rank, c.step):
        backend.synchronize()  # grad_norm.item()


def train(layout: Layout, rank: int, steps: int, *, hooks: Hooks | None = None,
          microbatches: int = 2, p2p_on_default: bool = False, compute_ms: float = 1.0,
          groups: Groups | None = None) -> Groups:
    """Create the groups (unless given) and run ``steps`` training steps."""
    g = groups or make_groups(layout, rank)
    for step in range(steps):
        c = _Ctx(layout, rank, step, g, hooks or Hooks(), p2p_on_default, compute_ms)
        train_step(c, microbatches)
    return g
