"""A product bound to two vectors and captured as a CUDA graph, for loops that run y = A·x thousands of times.

Each ``ex(x, out)`` costs the host some 8-15 us (its checks, then CuPy's launch of
each kernel): on an H100, loops of ``ex(x, out)`` on matrices of 0.06-1.2 M nonzeros
ran at 9.7-14.8 us a call while the GPU's work took 4.3-10.2 us; from about 6 M
nonzeros on, the GPU is the slower of the two and the host's time is hidden
(``bench/loop.py``, ``bench/results/..._loop-865a063.json``). :func:`bind` captures one product, with x and
out fixed, into a CUDA graph (CuPy's stream capture), so a call is one graph
launch. The graph reads x where it lies when it runs: an iterative method
updates x in place (``x[...] = ...``) and reads out.

Whatever a product allocates while it is captured (a family's scratch) comes
from a memory pool of the bound product's own, kept while it lives: no other
array takes that memory while the graph still writes there. A product that
cannot be captured is bound as it is: each call runs it, and ``reason`` says
why (:meth:`kernels._family.Family.uncapturable`): cuSPARSE's (CuPy refuses
cuSPARSE calls on a stream being captured) and SURAA's with child grids launched
from the GPU into the fire-and-forget stream (a replayed graph does not wait for
them: its stream can be done before they are, where a plain launch's is not).
The other families are captured, SURAA's side streams included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BoundProduct", "bind"]


class BoundProduct:
    """``y = bound()``: one product of a fixed x into a fixed ``out``, as a CUDA graph where it could be captured
    (``captured``), else run as it is (``reason`` says why). Returns ``out``."""

    def __init__(self, product: Callable[[], Any], out: Any, *, graph: Any = None, keep: tuple[Any, ...] = (),
                 reason: str | None = None) -> None:
        self.out = out
        self.reason = reason
        self._product = product
        self._graph = graph
        self._keep = keep  # what the graph's memory lives in (its pool), and the stream it was captured on

    @property
    def captured(self) -> bool:
        return self._graph is not None

    def __call__(self) -> Any:
        if self._graph is None:
            self._product()
        else:
            self._graph.launch()  # on the caller's current stream
        return self.out

    def __repr__(self) -> str:
        how = "a CUDA graph" if self.captured else f"not captured ({self.reason})"
        return f"<BoundProduct into {self.out.shape[0]} rows, {how}>"


def bind(product: Callable[[], Any], out: Any) -> BoundProduct:
    """``product`` (a call that writes y into ``out`` on the current stream, run once already so that its
    kernels are compiled) captured into a CUDA graph on a stream of its own. Capturing runs nothing; a product
    that cannot be captured is bound as it is, with the error as its ``reason``."""
    import cupy

    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    try:
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture(mode=cupy.cuda.runtime.streamCaptureModeRelaxed)
            try:
                product()
            finally:
                graph = stream.end_capture()  # ends the capture even where the product failed in it
    except Exception as exc:  # a wait on the host, or a call that may not be captured: run as it is
        return BoundProduct(product, out, reason=f"{type(exc).__name__}: {exc}")
    return BoundProduct(product, out, graph=graph, keep=(pool, stream))
