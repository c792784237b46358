"""Where each gradient lies in its bucket's flat buffer, and the collectives that read the buffers.

The one bucket layout of the project: the simulator schedules these
collectives, the solvers cut chunked buckets with them, the eager runtime
allocates its buffers and issues its all-reduces from them, and the compiled
runtime inserts the same calls into the backward graph.

1. Each bucket owns one flat buffer; its parameters lie in it back to back,
   in the order the plan lists them (element offsets).
2. With ``chunks = c`` the buffer is cut into c nearly equal slices of whole
   elements (:func:`chunk_bounds`), one collective each, in plan order.
3. A collective *covers* the parameters whose element ranges intersect its
   slice; it may be issued once every gradient it covers is ready. A
   parameter with no elements is covered by the slice its offset lies in
   (the last slice when it sits at the buffer's end), so every parameter
   gates at least one collective.

Example:
    >>> from schedopt.plan import Bucket
    >>> layout = bucket_layout([Bucket(params=("a", "b"), chunks=2)], numel={"a": 3, "b": 5}, itemsize=4)
    >>> [(c.start, c.end, c.nbytes, c.params) for c in layout.collectives]
    [(0, 4, 16, ('a', 'b')), (4, 8, 16, ('b',))]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from .errors import InvalidPlanError

if TYPE_CHECKING:
    from .graph import TrainGraph
    from .plan import Bucket

__all__ = ["Span", "Collective", "BucketLayout", "bucket_layout", "graph_layout", "chunk_bounds"]


@dataclass(frozen=True, slots=True)
class Span:
    """Elements ``[start, end)`` of bucket ``bucket``'s flat buffer: one parameter's gradient."""

    bucket: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Collective:
    """One all-reduce: elements ``[start, end)`` of bucket ``bucket``'s buffer (its chunk ``chunk``)."""

    bucket: int
    chunk: int
    start: int
    end: int
    nbytes: int
    params: tuple[str, ...]  # the gradients it covers, in buffer order

    @property
    def numel(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class BucketLayout:
    """The flat buffers of a plan's buckets and its collectives in issue order (see the module docstring)."""

    spans: Mapping[str, Span]
    bucket_numel: tuple[int, ...]
    collectives: tuple[Collective, ...]

    def gates(self) -> dict[str, list[int]]:
        """Return, per parameter, the indices of the collectives waiting for its gradient."""
        gates: dict[str, list[int]] = {name: [] for name in self.spans}
        for c, collective in enumerate(self.collectives):
            for name in collective.params:
                gates[name].append(c)
        return gates


def chunk_bounds(numel: int, chunks: int) -> list[tuple[int, int]]:
    """Return the ``[start, end)`` element ranges of ``chunks`` nearly equal slices of ``numel`` elements.

    Example:
        >>> chunk_bounds(10, 3)
        [(0, 3), (3, 6), (6, 10)]
    """
    return [(numel * j // chunks, numel * (j + 1) // chunks) for j in range(chunks)]


def bucket_layout(buckets: Sequence["Bucket"], *, numel: Mapping[str, int],
                  itemsize: Mapping[str, int] | int) -> BucketLayout:
    """Lay ``buckets`` out (see the module docstring).

    Args:
        buckets: in collective order, each with its parameters and chunk count.
        numel: each parameter's element count.
        itemsize: bytes per element, per parameter or one for all.

    Raises:
        InvalidPlanError: a bucket names a parameter ``numel`` lacks, a parameter is in two
            buckets, a bucket is empty, or its chunk count is not 1 to its element count.
    """
    spans: dict[str, Span] = {}
    sizes: list[int] = []
    collectives: list[Collective] = []
    for k, bucket in enumerate(buckets):
        if not bucket.params:
            raise InvalidPlanError(f"bucket {k} is empty")
        offset = 0
        for name in bucket.params:  # step 1
            if name not in numel:
                raise InvalidPlanError(f"bucket {k} names {name!r}, which is not a trainable parameter")
            if name in spans:
                raise InvalidPlanError(f"parameter {name!r} is in two buckets ({spans[name].bucket} and {k})")
            spans[name] = Span(k, offset, offset + numel[name])
            offset += numel[name]
        sizes.append(offset)
        if not isinstance(bucket.chunks, int) or not 1 <= bucket.chunks <= max(offset, 1):
            raise InvalidPlanError(f"bucket {k} has chunks = {bucket.chunks!r}; expected 1 to {max(offset, 1)}")
        width = itemsize if isinstance(itemsize, int) else itemsize[bucket.params[0]]
        bounds = chunk_bounds(offset, bucket.chunks)  # step 2
        for j, (start, end) in enumerate(bounds):  # step 3
            last = j + 1 == len(bounds)
            covered = tuple(name for name in bucket.params
                            if _covers(spans[name], start, end, last=last))
            collectives.append(Collective(bucket=k, chunk=j, start=start, end=end, nbytes=(end - start) * width,
                                          params=covered))
    return BucketLayout(spans=spans, bucket_numel=tuple(sizes), collectives=tuple(collectives))


def _covers(span: Span, start: int, end: int, *, last: bool) -> bool:
    if span.start < span.end:
        return span.start < end and start < span.end
    return start <= span.start < end or (last and span.start == end)


def graph_layout(graph: "TrainGraph", buckets: Sequence["Bucket"]) -> BucketLayout:
    """Lay ``buckets`` out over ``graph``'s parameters (their element counts and dtypes)."""
    params = graph.params
    return bucket_layout(buckets, numel={name: p.numel for name, p in params.items()},
                         itemsize={name: p.itemsize for name, p in params.items()})
