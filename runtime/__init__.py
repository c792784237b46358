"""Applies plans to torch.distributed training.

Not written yet (tracked by its own issue); plans can already be made,
saved, inspected and simulated.
"""

__all__: list[str] = []
