"""Fault injection for training tests: step hooks for :func:`hardpos.train.trainer.build_trainer`.

A step hook is called on every Ray Train worker after every step as
``hook(step, rank, world_size)``; it must be picklable (it travels in the loop config).
"""
from __future__ import annotations

import dataclasses

from hardpos import storage


@dataclasses.dataclass(frozen=True)
class FailOnce:
    """Make the last worker raise once when global step ``at_step`` is reached.

    ``marker``: a file (local or s3://) written before raising; while it exists the hook does
    nothing, so the run restarted by Ray Train (``fault.max_failures`` >= 1) trains on. Its
    text, ``failed once at step <n>``, lets a test check the fault really happened.
    """

    at_step: int
    marker: str

    def __call__(self, step: int, rank: int, world: int) -> None:
        if step != self.at_step or rank != world - 1 or storage.exists(self.marker):
            return
        storage.write_text(self.marker, f"failed once at step {step}\n")
        raise RuntimeError(f"injected fault at step {step} (tests.support.faults.FailOnce)")
