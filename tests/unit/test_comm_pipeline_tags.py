"""The pipeline hooks of CommDebugMode: wrapped only while a mode is active (nested modes
included, exceptions included), and tags that never keep a tensor alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.distributed.pipelining import stage as stage_module

from commscope.comm import CommDebugMode
from commscope.comm.capture import pipeline
from commscope.comm.capture.modules import BACKWARD, ModuleTracker

_NAMES = ("get_fwd_recv_ops", "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops")


def _methods() -> dict[tuple[str, str], object]:
    classes = (stage_module._PipelineStageBase, stage_module.PipelineStage)
    names = (*_NAMES, "_prepare_forward_infra", "_warmup_forward_vote")
    return {(c.__name__, n): c.__dict__.get(n) for c in classes for n in names}


def test_wrapped_while_active_and_restored_after_nesting_and_errors():
    original = _methods()
    assert not pipeline.installed()
    with pytest.raises(RuntimeError, match="boom"), CommDebugMode():
        with CommDebugMode():
            assert pipeline.installed()
            assert _methods() != original
        assert pipeline.installed()  # the outer mode still needs them
        raise RuntimeError("boom")
    assert not pipeline.installed()
    assert _methods() == original
    assert pipeline._TAGS == {} and pipeline._CONTEXT == []


def test_tags_hold_no_tensor_and_die_with_it():
    tracker = ModuleTracker()
    tag = pipeline.StageTag(BACKWARD, 3, "class 'PipelineStage'")
    with CommDebugMode():
        t = torch.ones(4)
        pipeline._tag(t, tag)
        rec, phase, stage = pipeline.attribute(tracker, [t])
        assert (rec.fqn, rec.module_type, rec.parent, phase, stage) == (
            "pipeline stage 3",
            "class 'PipelineStage'",
            tracker.global_record,
            BACKWARD,
            3,
        )
        assert pipeline.attribute(tracker, [torch.ones(4)]) is None  # untagged
        ref = weakref.ref(t)
        del t
        gc.collect()
        assert ref() is None
        assert pipeline._TAGS == {}


def test_tags_are_dropped_on_exit():
    t = torch.ones(2)
    with CommDebugMode():
        pipeline._tag(t, pipeline.StageTag(BACKWARD, 0, ""))
        assert pipeline._TAGS
    assert pipeline._TAGS == {}
    assert pipeline.attribute(ModuleTracker(), [t]) is None
