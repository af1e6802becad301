"""How many intra-op threads torch gets for a model of a given size, and a scope that sets them.

A 2M-parameter model decoding at batch 1 does a few hundred tiny matmuls per token: on a 2-core machine it runs
about twice as fast on one thread as on two, and when another process shares the cores, torch's spinning worker
threads make it ~20x slower (measured on the embedded example; ``scripts/bench.py threads`` prints the ratio).
Intra-op parallelism only pays once one op carries enough work to split, so dsparkhub gives small models one thread
and leaves large ones torch's default. This module only chooses and scopes; it never changes torch's inter-op pool.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

__all__ = ["SMALL_MODEL_PARAMETERS", "threads_for", "torch_threads"]

#: Models below this many parameters run on one intra-op thread (an op of a 50M-parameter model at hidden ~512 is
#: ~1 MFLOP per token: below what a second thread amortises on CPU).
SMALL_MODEL_PARAMETERS = 50_000_000


def threads_for(num_parameters: int, *, device: str | torch.device = "cpu", cores: int | None = None) -> int:
    """Intra-op threads for models of ``num_parameters`` parameters in all on ``device``.

    Args:
        num_parameters: parameters of the models that will run (target plus drafter), a count.
        device: where they run; on an accelerator the CPU threads only feed kernels, so 1.
        cores: usable cores (default ``$OMP_NUM_THREADS`` when set, else ``os.sched_getaffinity``).

    Returns:
        1 for models under :data:`SMALL_MODEL_PARAMETERS` or off-CPU; else every usable core (>= 1).
    """
    if torch.device(device).type != "cpu" or num_parameters < SMALL_MODEL_PARAMETERS:
        return 1
    if cores is None:
        env = os.environ.get("OMP_NUM_THREADS", "")
        cores = int(env) if env.isdigit() and int(env) > 0 else (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    return max(1, cores)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``; the previous count is restored on exit (also on errors).

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"thread count must be >= 1, found {n}")
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
