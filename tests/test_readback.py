"""One read-back for several kernels' small results (tuner.matrix.readback): its lending on any machine, the rest
on the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.measure.backend import _spin_kernel


@pytest.mark.gpu
def test_parts_are_read_back_at_once_and_a_full_or_read_buffer_hands_out_none() -> None:
    import cupy

    from tuner.matrix.readback import ReadBack, part_of

    read_back = ReadBack(8)
    first, second = read_back.take(3), read_back.take(4)
    assert read_back.take(2) is None  # 7 of 8 taken: two do not fit
    assert not first.device.any() and not second.device.any()  # zeroed, for kernels that add into them
    first.device[:] = cupy.arange(1, 4, dtype=cupy.uint64)
    second.device[:] = cupy.asarray(np.array([0.5, -2.0, np.inf, 7.0]).view(np.uint64))
    assert first.read().tolist() == [1, 2, 3]
    second.device[0] = 99  # written after the copy back: not seen, the host holds the first read's words
    assert second.read().view(np.float64).tolist() == [0.5, -2.0, np.inf, 7.0]
    assert read_back.take(1) is None  # read already: a part taken now would never be copied back

    own = part_of(read_back, 5)  # none left there: a read-back of its own
    assert own.owner is not read_back and own.read().tolist() == [0] * 5
    shared = ReadBack(16)
    part = part_of(shared, 5)
    assert part.owner is shared and part_of(None, 2).owner is not shared


@pytest.mark.gpu
def test_a_queued_copy_holds_the_words_as_they_were_when_it_was_queued() -> None:
    """queue_copy copies the parts taken so far behind the work queued before it, into pinned memory, and the
    first read waits for that copy only: what is queued after it (a prediction's row columns) neither shows in
    the words read nor delays them; no part is taken after it, and a second queue_copy or read changes nothing."""
    import cupy

    from tuner.matrix.readback import ReadBack

    read_back = ReadBack(8)
    part = read_back.take(4)
    part.device[:] = cupy.arange(10, 14, dtype=cupy.uint64)
    read_back.queue_copy()
    assert read_back.take(1) is None
    _spin_kernel()((1,), (1,), (np.int64(200_000_000),))  # some 0.1 s of the GPU, queued after it
    part.device[:] = 0  # and after that: not in the words read
    read_back.queue_copy()
    assert part.read().tolist() == [10, 11, 12, 13]
    assert not cupy.cuda.get_current_stream().done  # the read waited for the copy, not for the spin behind it
    assert part.read().tolist() == [10, 11, 12, 13] and not part.device.any()


@pytest.mark.gpu
def test_read_backs_whose_copies_are_queued_together_each_read_their_own_words() -> None:
    """A thread's pinned memory is lent to one queued copy at a time: a second read-back queued before the first is
    read lands elsewhere, and once read each keeps its words, whatever the read-backs after it copy."""
    from tuner.matrix.readback import ReadBack

    parts = []
    for value in (1, 2):
        read_back = ReadBack(4)
        parts.append(read_back.take(4))
        parts[-1].device[:] = value
        read_back.queue_copy()
    assert parts[1].read().tolist() == [2] * 4 and parts[0].read().tolist() == [1] * 4
    later = ReadBack(4)
    third = later.take(4)
    third.device[:] = 3
    later.queue_copy()
    assert third.read().tolist() == [3] * 4
    assert parts[0].read().tolist() == [1] * 4 and parts[1].read().tolist() == [2] * 4


@pytest.mark.gpu
def test_a_kept_read_back_is_lent_to_one_at_a_time_and_zeroed_behind_the_work_queued_before_it() -> None:
    """plan()'s read-back keeps its device buffer (one a thread, GPU and stream): lent again once read, zeroed each
    time by a memset queued behind what was queued before (a prediction's gated row columns read the ranking's words
    after the copy): never under the words of a read-back not yet read."""
    import gc

    import cupy

    from tuner.matrix.readback import ReadBack

    gc.collect()  # a read-back of an earlier test, never read, in a reference cycle: its kept buffer lent still
    first = ReadBack(kept=True)
    part = first.take(4)
    part.device[:] = 7
    other = ReadBack(kept=True)  # the first not read yet: a buffer of its own
    mine = other.take(4)
    mine.device[:] = 8
    behind = cupy.empty_like(part.device)  # allocated before the spin: an allocation may wait for the GPU
    first.queue_copy()
    _spin_kernel()((1,), (1,), (np.int64(200_000_000),))  # some 0.1 s of the GPU, queued after the copy
    behind[...] = part.device  # queued after the spin, as the gated row columns are: reads the words
    assert part.read().tolist() == [7] * 4  # waits for the copy only
    again = ReadBack(kept=True)  # the first read: its buffer lent again, zeroed behind the work queued above
    words = again.take(4)
    assert words.device.data.ptr == part.device.data.ptr and not cupy.cuda.get_current_stream().done
    assert behind.tolist() == [7] * 4 and words.read().tolist() == [0] * 4
    assert part.read().tolist() == [7] * 4 and mine.read().tolist() == [8] * 4  # each its own words still
    assert mine.device.data.ptr != part.device.data.ptr


def test_a_threads_kept_object_is_lent_to_one_borrower_at_a_time_and_each_thread_keeps_its_own() -> None:
    """What plan()'s kept device words and a queued copy's pinned memory are lent by: the thread's object of a key
    while it is free, a new one (not kept) while it is lent; another key or another thread, another object."""
    import threading

    from tuner.matrix.readback import _lent

    class Thing:
        busy = False

    key = ("test", object())
    first = _lent(key, Thing)
    assert first.busy
    meanwhile = _lent(key, Thing)  # the kept one lent still: a new one
    assert meanwhile is not first and meanwhile.busy
    meanwhile.busy = False
    first.busy = False  # returned
    again = _lent(key, Thing)
    assert again is first and _lent(("test", "other"), Thing) is not first
    again.busy = False
    elsewhere: list[object] = []
    worker = threading.Thread(target=lambda: elsewhere.append(_lent(key, Thing)))
    worker.start()
    worker.join()
    assert elsewhere[0] is not first
