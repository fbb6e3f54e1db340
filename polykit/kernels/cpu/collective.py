"""cpu.collective: DistCollective layers between the simulated ranks of a SimulatedGroup.

The layer hands its input to the context's communicator (polykit.runtime.collectives), which
returns every group member's input in member order; the numpy definition
(kernels/reference/collective.py) gives this member's output. A group of one needs no
communicator; a larger one without a SimulatedCommunicator is a UsageError.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from polykit.compiler.ir.graph import POLYKIT_DOMAIN, Node
from polykit.compiler.ops.models.collective import KIND, group_of
from polykit.errors import UsageError
from polykit.kernels.cpu.base import DECLARED, CpuTactic
from polykit.compiler.ops.models.collective_reference import collective_result


def run_collective(node: Node, inputs: Sequence[np.ndarray | None], communicator: Any) -> list[np.ndarray]:
    members = group_of(node.attrs)
    if len(members) == 1 and communicator is None:
        return [collective_result(node.attrs, [inputs[0]], 0)]
    if not hasattr(communicator, "exchange"):
        raise UsageError(f"the cpu target runs collective layers through a SimulatedGroup's communicator, not "
                         f"{type(communicator).__name__}", where=f"layer {node.name!r}",
                         hint="create the context with communicator=SimulatedGroup(ranks).communicator(rank)")
    contributions = communicator.exchange(inputs[0], members, node.name)
    return [collective_result(node.attrs, contributions, members.index(communicator.rank))]


DECLARED.append(CpuTactic("cpu", KIND, "cpu.collective", domain=POLYKIT_DOMAIN, priority=10, conservative=True,
                          run_fn=run_collective, communicates=True, code_of=lambda layer: run_collective))
