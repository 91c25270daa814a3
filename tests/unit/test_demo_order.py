"""The demo prints its story in order however its ranks are scheduled."""

from __future__ import annotations

import io

from commscope.console import Console
from commscope.demo.faults import FAULT_STEP
from commscope.demo.launch import Message
from commscope.demo.run import _wait_for_job


class _Job:
    """Messages in a given order, as the ranks' queue would deliver them."""

    def __init__(self, messages: list[Message]) -> None:
        self._messages = messages

    def messages(self, timeout: float):
        yield from self._messages

    def alive(self) -> list[int]:
        return []


def _run(tmp_path, messages: list[Message]) -> list[str]:
    out = io.StringIO()
    _wait_for_job(_Job(messages), Console(out), tmp_path, 4, 1.0, 5.0)
    return [line.strip() for line in out.getvalue().splitlines() if line.strip()]


def test_a_fault_reported_before_rank_0s_step_is_shown_after_it(tmp_path):
    early = [Message(0, "step", (s, 0.5)) for s in range(FAULT_STEP - 1)]
    lines = _run(tmp_path, [*early, Message(3, "fault", "missing"), Message(3, "died", 17),
                            Message(0, "step", (FAULT_STEP - 1, 0.25))])
    at = lines.index(f"step {FAULT_STEP - 1}: mean loss 0.2500")
    assert lines[at + 1].startswith(f"rank 3 injects the fault at step {FAULT_STEP}")
    assert lines[at + 2] == "rank 3 died (exit code 17)"


def test_the_fault_line_is_shown_even_if_rank_0_never_reports(tmp_path):
    lines = _run(tmp_path, [Message(3, "fault", "missing")])
    assert any(line.startswith("rank 3 injects the fault") for line in lines)
