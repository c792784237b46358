"""Applies plans to torch.distributed training (``wrap``, ``SCHEDOPT_PLAN``).

Not written yet: plans can already be made, saved, inspected and simulated.
"""

__all__: list[str] = []
