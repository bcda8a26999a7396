"""Small results of kernels queued one after another, in one device buffer read back to the host once.

``plan()`` queues three kernels' small results on a matrix new to the store: the structure pass's 8 words, the
features' 46 counters and the selector's ranking (some 300 doubles). Each in a buffer of its own took an allocation,
a copy back and a wait for the GPU apiece, 20-50 us each on the GPU machines' hosts, whose caches the GPU's work
empties (``bench/results/2026-11-28_predict-host-54.txt``). Here they take parts of one zeroed buffer
(:meth:`ReadBack.take`), and the first :meth:`Part.read` copies every part taken back at once, behind all the
kernels that write them (one stream: the order they were queued in). Where more work is to follow them on the
stream before the host reads (a prediction's 16-bit row columns, :func:`kernels._narrow.rows_written_once`),
:meth:`ReadBack.queue_copy` queues that copy first, into pinned memory, so that the read waits for the copy only.
``plan()``'s read-back is ``ReadBack(kept=True)``: its device buffer is kept by the thread and zeroed by a memset
each plan, not allocated anew.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Part", "ReadBack", "part_of"]

WORDS = 1024
"""64-bit words of a plan's read-back: the structure pass, the features and a ranking of up to some 290 configs."""


class ReadBack:
    """A zeroed device buffer of ``words`` 64-bit words, handed out in parts and copied to the host once. With
    ``kept`` (``plan()``'s, of :data:`WORDS` words), the thread's buffer for the current GPU and stream
    (:class:`_KeptWords`), lent until the first read."""

    def __init__(self, words: int = WORDS, *, kept: bool = False) -> None:
        import cupy

        self._kept = _KeptWords.lend() if kept and words == WORDS else None
        self._device = self._kept.device if self._kept is not None else cupy.zeros(words, dtype=cupy.uint64)
        self._taken = 0
        self._host: np.ndarray | None = None
        self._pinned: _Pinned | None = None  # where a queued copy (queue_copy) lands, until a read waited for it

    def __del__(self) -> None:
        if getattr(self, "_pinned", None) is not None:  # its pinned memory is free again: not while being written
            self._pinned.release()
        if getattr(self, "_kept", None) is not None:
            self._kept.busy = False

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

        if self._host is not None:
            return
        self._pinned = _Pinned.lend(self._taken)
        stream = cupy.cuda.get_current_stream()
        self._device.data.copy_to_host_async(self._pinned.address, 8 * self._taken, stream)
        self._pinned.event.record(stream)
        self._host = self._pinned.host

    def _words(self, start: int, stop: int) -> np.ndarray:
        if self._host is None:  # every part taken, at once: waits for every kernel queued before this read
            self._host = _copied_back(self._device, self._taken)
        elif self._pinned is not None:  # a queued copy: waited for, and its words kept apart from the pinned buffer
            pinned, self._pinned = self._pinned, None
            pinned.event.synchronize()
            self._host = pinned.host[:self._taken].copy()
            pinned.busy = False
        if self._kept is not None:  # read: lent again (the kernels queued behind the copy run before its next memset)
            self._kept.busy = False
            self._kept = None
        return self._host[start:stop]


_KEPT = threading.local()
"""``by_key``: this thread's :class:`_Pinned` and :class:`_KeptWords`, by kind and GPU (and stream)."""


def _lent(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """This thread's object of ``key`` (made at the first ask) where it is free, else a new one: lent (``busy``)
    until its borrower clears ``busy``."""
    kept = _KEPT.__dict__.setdefault("by_key", {})
    found = kept.get(key)
    if found is None:
        found = kept[key] = make()
    elif found.busy:
        found = make()
    found.busy = True
    return found


class _KeptWords:
    """A device buffer of :data:`WORDS` words for :class:`ReadBack` ``(kept=True)``: one a thread, GPU and stream,
    zeroed by a memset on that stream each time it is lent, since a new zeroed buffer for each plan (an allocation
    and a memset) took 50-100 us of it on the GPU machines' hosts (``bench/results/2026-11-28_predict-gate-62.txt``)."""

    def __init__(self) -> None:
        import cupy

        self.device = cupy.empty(WORDS, dtype=cupy.uint64)
        self.busy = False

    @classmethod
    def lend(cls) -> _KeptWords:
        """This thread's for the current GPU and stream, zeroed behind the work queued there (which may still read
        it: a prediction's gated row columns read the ranking's words), where it is free; else a new one."""
        import cupy

        kept = _lent(("words", cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr), cls)
        kept.device.data.memset_async(0, 8 * WORDS)
        return kept


class _Pinned:
    """Pinned host memory of :data:`WORDS` words (or more) and an event, for :meth:`ReadBack.queue_copy`: one a
    thread and GPU, made once and lent to one read-back at a time (another meanwhile gets one of its own), since
    pinned memory and an event made for each plan took tens of microseconds of it on the GPU machines' hosts."""

    def __init__(self, words: int) -> None:
        import cupy
        import cupyx

        self.host = cupyx.empty_pinned(words, dtype=np.uint64)
        self.address = self.host.__array_interface__["data"][0]
        self.event = cupy.cuda.Event(block=False, disable_timing=True)
        self.busy = False

    @classmethod
    def lend(cls, words: int) -> _Pinned:
        """This thread's for the current GPU where it is free and ``words`` fit, else a new one; lent until
        :meth:`release` (or its borrower, having waited for the copy, clears ``busy``)."""
        import cupy

        if words > WORDS:
            pinned = cls(words)
            pinned.busy = True
            return pinned
        return _lent(("pinned", cupy.cuda.runtime.getDevice()), lambda: cls(WORDS))

    def release(self) -> None:
        """Lend it again, once the copy into it is done."""
        self.event.synchronize()
        self.busy = False


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
