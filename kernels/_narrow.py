"""Narrow columns: a segment's column indices as 16-bit offsets from its lowest (index compression after
CSR-DU, Kourtis et al., 2008), for the families whose products read columns segment by segment.

A segment is a run of consecutive entries, ``ptr[s] .. ptr[s+1]-1`` (csr_vector: a row; merge_path: a
tile; csr5: a tile of its transposed copy of the columns). Where a segment's columns span fewer than
:data:`OFFSET_LIMIT` and it holds no more entries than that, it keeps its lowest column in one 32-bit word
(``base[s]``) and each entry's column as a 16-bit offset from it; another segment has ``base[s] == -1`` and its
entries are read from the int32 columns. A product of a local matrix (a mesh, a band, blocks, a renumbered
graph) then reads 10 bytes an entry instead of 12 in float64 and 6 instead of 8 in float32, and 4 more a segment;
where that saves nothing (narrow segments holding fewer than 2 entries for each segment of the matrix), no
offsets are kept.

The GPU writes them with ``narrow_offsets`` (narrow.cu), the reference with NumPy; both give the same base
and the same offsets in narrow segments (a wide segment's are 0 here, unwritten there).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._cuda import get_kernels, grid, require_cupy
from kernels._space import Param

CU_FILE, KERNELS = "narrow.cu", ("narrow_offsets",)
OFFSET_LIMIT = 1 << 16
"""A segment's columns are stored as offsets where its highest and lowest are fewer than this apart."""
_MAX_BLOCKS = 4096
"""Blocks of narrow_offsets at most (its warps stride over the segments): a few waves on a Hopper GPU."""
_LANE_ENTRIES = 4
"""Entries of the mean segment a thread of narrow_offsets takes, about (:func:`group_lanes`): their loads are in
flight together. On the rows of nine unseen matrices of 12-32 M entries (an H200) that pick was the fastest of
the six or within 1.3 % of it, and took 0.27-0.88 of the time that a thread an entry of the mean row took (a
row's loads, shuffles and stores one after another; 66-164 us against 79-294; the same on rows of 3,000);
``bench/results/2026-11-28_narrow-lanes-58.txt``."""
_BASE_BYTES, _SAVED_BYTES = 4, 2
"""Bytes of a segment's base word; bytes an offset saves against an int32 column."""
_ROW_ENTRIES = "_spmv_narrow_row_entries"
"""The attribute :func:`note_narrow_rows` keeps its count in."""


def indices_param(segment: str) -> Param:
    """The ``indices`` parameter of a family whose products read columns a ``segment`` (row, tile) at a time."""
    return Param("indices", ("narrow", "int32"), "narrow", f"columns read as 16-bit offsets from the {segment}'s "
                 f"lowest where a {segment} spans fewer than 65,536 and that saves bytes (narrow), or as int32")


def attach(extra: dict[str, Any], params: Mapping[str, Any], ptr: Any, indices: Any,
           narrow_entries: int | None = None) -> bool:
    """Where ``params`` ask for narrow columns and they pay, their ``base`` and ``offsets`` put in ``extra``
    (written on the GPU for CuPy arrays, by the reference for NumPy ones; where counted, those
    :func:`rows_written_once` wrote for these very arrays); whether they were. ``narrow_entries``:
    the entries of the narrow segments where a pass over the matrix counted them already (a row family's:
    :func:`narrow_rows`), which then decides whether they pay: where they do not, no kernel runs (on ten unseen
    matrices of 12-33 M entries, an H100, a preparation took 0.17-0.45 ms before, 0.05 after), and where they do,
    none of their count is read back (its wait and copy, 0.02-0.05 ms)."""
    if params["indices"] != "narrow":
        return False
    known = narrow_entries is not None
    if known and not _pays(narrow_entries, ptr.size - 1):
        return False
    found = _written_once(ptr, indices) if known else None
    if found is None:
        found = (narrow_columns if isinstance(indices, np.ndarray) else narrow_columns_on_gpu)(ptr, indices,
                                                                                              pays=known)
    if found is not None:
        extra["base"], extra["offsets"] = found
    return found is not None


def reads_row_columns(family: Any, params: Mapping[str, Any]) -> bool:
    """Whether ``family``'s preparation with ``params`` takes the 16-bit columns of the matrix's own rows, those
    :func:`rows_written_once` writes: a row family's (``row_columns``) with narrow ``indices``."""
    return bool(getattr(family, "row_columns", False)) and params.get("indices") == "narrow"


def note_narrow_rows(A: Any, entries: int) -> None:
    """Keep on the CSR matrix object ``A`` the entries of its rows that span fewer than :data:`OFFSET_LIMIT`
    columns, as a pass over it counted them (``plan()``'s structure pass, :mod:`tuner.matrix.structure_gpu`),
    for :func:`narrow_rows`. Should ``A``'s columns change in place afterwards, a stale count costs speed, never
    a wrong product: the offsets written mark each row wide or narrow by its own columns."""
    setattr(A, _ROW_ENTRIES, int(entries))


def narrow_rows(A: Any) -> int | None:
    """What :func:`note_narrow_rows` kept on ``A``; None where nothing was (the row families pass it to
    :func:`attach`)."""
    return getattr(A, _ROW_ENTRIES, None)


@dataclass(frozen=True)
class PickGate:
    """A config picked on the GPU before the host knows which (``plan(effort="predict")``'s ranking kernel):
    ``words[at]`` (a double, on the GPU) is its place in a list of configs, -1 for none; ``takes`` (a byte a
    config, on the GPU) is nonzero for those whose preparation takes the rows' 16-bit columns; ``taken()``, once
    ``words`` are read back, whether the pick is one of them."""

    words: Any
    at: int
    takes: Any
    taken: Callable[[], bool]


@contextlib.contextmanager
def rows_written_once(A: Any, gate: PickGate | None = None) -> Iterator[None]:
    """Within: the 16-bit columns of the rows of ``A`` (a CuPy CSR matrix whose narrow rows
    :func:`note_narrow_rows` counted) queued on the GPU now, where they pay, and taken by every row family's
    preparation of ``A`` in this thread (:func:`attach`) instead of each writing its own. ``plan()``'s race queues them
    as soon as its structure pass is read back, before it knows what it will run: the GPU writes them while the
    host ranks the configs (0.07-0.16 ms of an H200 on unseen matrices of 12-32 M entries, which a row family's
    preparation waited for), and a race's row entrants and its winner share one copy. Where no row family is
    prepared, they were written for nothing (the GPU was idle then) and are freed on leaving; where the GPU has
    no room for them, each preparation writes its own as before.

    With ``gate``, they are queued before the rows are counted and written only where the GPU's pick takes them
    (``narrow_offsets`` reads the gate): a prediction queues them behind its ranking kernel, after the read-back's
    copy, so that they are written while the host reads the pick back; a preparation takes them only where
    ``gate.taken()`` and, the count read back by then, they pay."""
    entries = narrow_rows(A)
    written = None
    if gate is not None or (entries is not None and _pays(entries, A.shape[0])):
        cupy = require_cupy()
        with contextlib.suppress(cupy.cuda.memory.OutOfMemoryError):
            written = (A.indptr, A.indices, queue_encode(A.indptr, A.indices, gate=gate),
                       gate.taken if gate is not None else None)
    outer = getattr(_WRITTEN, "rows", None)
    _WRITTEN.rows = written
    try:
        yield
    finally:
        _WRITTEN.rows = outer


_WRITTEN = threading.local()
"""``rows``: (indptr, indices, (base, offsets), the gate's ``taken`` or None) of the matrix whose rows
:func:`rows_written_once` wrote in this thread, or None."""


def _written_once(ptr: Any, indices: Any) -> tuple[Any, Any] | None:
    """The base and offsets :func:`rows_written_once` wrote for exactly these arrays (the same objects), or None
    (also where a gate kept them from being written)."""
    written = getattr(_WRITTEN, "rows", None)
    if written is None or written[0] is not ptr or written[1] is not indices:
        return None
    return written[2] if written[3] is None or written[3]() else None


def launch_columns(extra: Mapping[str, Any], indices: Any) -> tuple[Any, Any]:
    """The base and offsets a kernel is launched with; A's ``indices`` stand in for them where none were
    attached (the int32 instantiation never reads them: one signature for both)."""
    return extra.get("base", indices), extra.get("offsets", indices)


def reference_columns(extra: Mapping[str, Any], ptr: np.ndarray, indices: np.ndarray) -> np.ndarray | None:
    """The entries' columns as the reference's product reads them, None where none were attached (A's own)."""
    return columns(ptr, extra["base"], extra["offsets"], indices) if "base" in extra else None


def narrow_columns(ptr: np.ndarray, indices: np.ndarray, pays: bool = False
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """(base, offsets) of the segments ``ptr`` delimits over ``indices`` (int32 and uint16), or None where
    they do not pay (``pays``: known to, not counted again; the reference)."""
    base, offsets, narrow_entries = encode(ptr, indices)
    return (base, offsets) if pays or _pays(narrow_entries, ptr.size - 1) else None


def encode(ptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Every segment's base (-1 where it is wide), the offsets (0 in wide segments) and the entries of the
    narrow segments, whether they pay or not (the reference of :func:`encode_on_gpu`)."""
    segments = ptr.size - 1
    lengths = np.diff(ptr)
    filled = lengths > 0
    lo, hi = np.zeros(segments, dtype=np.int64), np.zeros(segments, dtype=np.int64)
    if indices.size:
        lo[filled] = np.minimum.reduceat(indices, ptr[:-1][filled])
        hi[filled] = np.maximum.reduceat(indices, ptr[:-1][filled])
    fits = (hi - lo < OFFSET_LIMIT) & (lengths <= OFFSET_LIMIT)  # longer ones are wide unread, as on the GPU
    owner = np.repeat(np.arange(segments), lengths)
    offsets = np.where(fits[owner], indices - lo[owner], 0).astype(np.uint16)
    return np.where(fits, lo, -1).astype(np.int32), offsets, int(lengths[fits].sum())


def narrow_columns_on_gpu(ptr: Any, indices: Any, pays: bool = False) -> tuple[Any, Any] | None:
    """The same on the GPU (CuPy arrays): where ``pays`` is not known, one read-back of the count decides."""
    if pays:
        return queue_encode(ptr, indices)
    base, offsets, narrow_entries = encode_on_gpu(ptr, indices)
    return (base, offsets) if _pays(narrow_entries, ptr.size - 1) else None


def encode_on_gpu(ptr: Any, indices: Any, lanes: int | None = None) -> tuple[Any, Any, int]:
    """``narrow_offsets``: every segment's base, the offsets (unwritten in wide segments) and the entries of
    the narrow segments; ``lanes`` threads a segment (default :func:`group_lanes`)."""
    narrow_entries = require_cupy().zeros(1, dtype=np.uint64)
    base, offsets = queue_encode(ptr, indices, lanes, narrow_entries)
    return base, offsets, int(narrow_entries.get()[0])


def queue_encode(ptr: Any, indices: Any, lanes: int | None = None, narrow_entries: Any = None,
                 gate: PickGate | None = None) -> tuple[Any, Any]:
    """``narrow_offsets`` launched: every segment's base and the offsets (unwritten in wide segments), and,
    into ``narrow_entries`` (one zeroed uint64 on the GPU) where given, the entries of the narrow segments; with
    ``gate``, none of them written unless the config it names takes them (:func:`rows_written_once`)."""
    cupy = require_cupy()
    segments = ptr.size - 1
    base, offsets = cupy.empty(segments, dtype=np.int32), cupy.empty(indices.size, dtype=np.uint16)
    kernel = get_kernels(CU_FILE, KERNELS)["narrow_offsets"]
    lanes = group_lanes(indices.size, segments) if lanes is None else lanes
    blocks = min(grid(lanes * segments, 256), _MAX_BLOCKS)
    opened = (gate.words, np.int64(gate.at), gate.takes) if gate is not None else (None, np.int64(0), None)
    kernel((blocks,), (256,), (np.int32(segments), np.int32(lanes), ptr, indices, base, offsets, narrow_entries,
                               *opened))
    return base, offsets


def group_lanes(entries: int, segments: int) -> int:
    """Threads ``narrow_offsets`` gives a segment: the power of 2 nearest (on a log scale) the mean segment's
    entries over :data:`_LANE_ENTRIES`, 2 at least where it holds more than one entry, 32 at most."""
    mean = entries / max(segments, 1)
    if mean <= 1:
        return 1
    return min(max(2 ** round(math.log2(mean / _LANE_ENTRIES)), 2), 32)


def columns(ptr: np.ndarray, base: np.ndarray, offsets: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The column of every entry as a product reads it: its segment's base plus its offset where the segment
    is narrow, else the int32 column (the reference)."""
    lowest = np.repeat(base.astype(np.int64), np.diff(ptr))
    return np.where(lowest >= 0, lowest + offsets, indices)


def _pays(narrow_entries: int, segments: int) -> bool:
    """Whether the offsets of the narrow segments save more bytes than every segment's base word costs."""
    return narrow_entries * _SAVED_BYTES > segments * _BASE_BYTES
