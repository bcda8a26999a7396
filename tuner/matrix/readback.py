"""Small results of kernels queued one after another, in one device buffer read back to the host once.

``plan()`` queues three kernels' small results on a matrix new to the store: the structure pass's 8 words, the
features' 46 counters and the selector's ranking (some 300 doubles). Each in a buffer of its own took an allocation,
a copy back and a wait for the GPU apiece, 20-50 us each on the GPU machines' hosts, whose caches the GPU's work
empties (``bench/results/2026-11-28_predict-host-54.txt``). Here they take parts of one zeroed buffer
(:meth:`ReadBack.take`), and the first :meth:`Part.read` copies every part taken back at once, behind all the
kernels that write them (one stream: the order they were queued in). Where more work is to follow them on the
stream before the host reads (a prediction's 16-bit row columns, :func:`kernels._narrow.rows_written_once`),
:meth:`ReadBack.queue_copy` queues that copy first, into pinned memory, so that the read waits for the copy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Part", "ReadBack", "part_of"]

WORDS = 1024
"""64-bit words of a plan's read-back: the structure pass, the features and a ranking of up to some 290 configs."""


class ReadBack:
    """A zeroed device buffer of ``words`` 64-bit words, handed out in parts and copied to the host once."""

    def __init__(self, words: int = WORDS) -> None:
        import cupy

        self._device = cupy.zeros(words, dtype=cupy.uint64)
        self._taken = 0
        self._host: np.ndarray | None = None
        self._copied: Any = None  # the event after a queued copy (queue_copy), until a read waited for it

    def __del__(self) -> None:
        if getattr(self, "_copied", None) is not None:  # pinned memory goes back to CuPy's pool: not while written
            self._copied.synchronize()

    def take(self, words: int) -> Part | None:
        """The next ``words`` words of the buffer, or None where they do not fit or it was read back already."""
        start, stop = self._taken, self._taken + words
        if self._host is not None or stop > self._device.size:
            return None
        self._taken = stop
        return Part(self, self._device[start:stop], start, stop)

    def queue_copy(self) -> None:
        """Queue the copy of every part taken so far now, behind the kernels queued so far, into pinned host memory
        (the host goes on at once, and a read waits for this copy, not for work queued after it); no part is
        taken after it. Nothing where they were read back already."""
        import cupy
        import cupyx

        if self._host is not None:
            return
        host = cupyx.empty_pinned(self._taken, dtype=np.uint64)
        stream = cupy.cuda.get_current_stream()
        self._device.data.copy_to_host_async(host.__array_interface__["data"][0], host.nbytes, stream)
        self._host, self._copied = host, stream.record()

    def _words(self, start: int, stop: int) -> np.ndarray:
        if self._host is None:  # every part taken, at once: waits for every kernel queued before this read
            self._host = _copied_back(self._device, self._taken)
        elif self._copied is not None:
            self._copied.synchronize()
            self._copied = None
        return self._host[start:stop]


def _copied_back(device: Any, words: int) -> np.ndarray:
    """The first ``words`` of ``device`` (uint64) on the host, behind the work queued on the current stream: one copy
    into a new array, without ``ndarray.get``'s slice and device switch (100 against 45 us on an H200 machine's host
    with its caches emptied, ``bench/results/2026-11-28_predict-readback-60.txt``)."""
    import cupy

    host = np.empty(words, dtype=np.uint64)
    stream = cupy.cuda.get_current_stream()
    device.data.copy_to_host_async(host.__array_interface__["data"][0], host.nbytes, stream)
    stream.synchronize()
    return host


@dataclass(frozen=True)
class Part:
    """Words ``start:stop`` of a :class:`ReadBack`: ``device`` (uint64) for a kernel to write, :meth:`read` on
    the host once written."""

    owner: ReadBack
    device: Any
    start: int
    stop: int

    def read(self) -> np.ndarray:
        """The part's words on the host (uint64), the whole read-back copied at the first read of any part."""
        return self.owner._words(self.start, self.stop)


def part_of(into: ReadBack | None, words: int) -> Part:
    """``words`` of ``into`` where given and they fit, else of a read-back of their own."""
    part = into.take(words) if into is not None else None
    return part if part is not None else ReadBack(words).take(words)
