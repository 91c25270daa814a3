"""The public surface of commscope.comm: what __all__ promises is there and documented."""

from __future__ import annotations

import inspect

import commscope.comm as comm


def test_all_names_exist_and_are_documented():
    assert len(comm.__all__) == len(set(comm.__all__))
    for name in comm.__all__:
        obj = getattr(comm, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name


def test_drop_in_signature():
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    ours, theirs = comm.CommDebugMode, TorchCommDebugMode
    for name in (
        "get_total_counts",
        "get_comm_counts",
        "get_parameter_info",
        "get_sharding_info",
        "generate_comm_debug_tracing_table",
        "log_comm_debug_tracing_table_to_file",
        "generate_json_dump",
    ):
        mine = inspect.signature(getattr(ours, name)).parameters
        pytorch = inspect.signature(getattr(theirs, name)).parameters
        for param, spec in pytorch.items():
            assert param in mine, (name, param)
            assert mine[param].default == spec.default, (name, param)
    cm = ours()
    for attr in ("comm_counts", "comm_module_counts", "comm_module_operation_counts",
                 "comm_registry", "advanced_module_tracker"):
        assert hasattr(cm, attr), attr
    assert issubclass(ours, __import__("torch").utils._python_dispatch.TorchDispatchMode)
