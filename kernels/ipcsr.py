"""``ipcsr``: improved PCSR (Gao, Qi & He, 2016), row blocks staged in shared memory.

Rows are packed into row blocks: consecutive rows whose nonzeros together fit
``shared_size`` staged values, at most ``nt`` rows (one per thread) per block;
a row longer than ``shared_size`` gets a block of its own (the paper's
Algorithm 4 with the long-row change of Algorithm 6). One thread block per row
block stages ``data[j] * x[indices[j]]`` in shared memory with coalesced loads,
then reduces each row with a group of ``g`` threads, ``g`` chosen per block by a
decision tree on ``nt / rows_in_block`` (see :func:`threads_per_row`); a long
row is reduced by the whole block, chunk by chunk. With ``long_chunks`` > 0 a
long row is cut into pieces of ``long_chunks * shared_size`` nonzeros, a block
each, so that a few very long rows do not leave one SM working after the rest
of the GPU is done (the paper's one block per long row is ``long_chunks = 0``).
The piece that finishes last adds the pieces' sums in order (deterministic);
the counters and partial sums it uses are scratch of the prepared matrix, so two
of its products must not run at once (products queued on one stream never do).

The greedy packing is sequential as written in the paper; :func:`row_blocks`
computes exactly the same blocks without a loop over rows: the end of the block
that would start at every row is found at once (one vectorized searchsorted on
the row pointer), and the chain of block starts from row 0 is then followed by
pointer doubling, ``log2(blocks)`` vectorized rounds. The same code runs on
NumPy (the CPU reference) and on CuPy (``prepare``), so the two block tables are
equal element for element.

>>> import scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(2000, 2000, density=0.01, format="csr", random_state=0))
>>> f = Ipcsr()
>>> p = f.prepare_reference(A, {"shared_size": 512, "nt": 64})
>>> p.extra["block_row_start"][:4], p.extra["block_tpr"][:3]
(array([ 0, 24, 50, 75], dtype=int32), array([2, 2, 2], dtype=int32))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, require_cupy
from kernels._family import Family, Prepared
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space

__all__ = ["DEFAULT_SHARED_SIZE", "Ipcsr", "block_table", "paper_shared_size", "row_blocks", "threads_per_row"]

SHARED_SIZES = (512, 1024, 2048, 4096, 8192, 16384)
THREADS_PER_BLOCK = (64, 128, 256, 512, 1024)
TREE_T1 = (2, 4, 8)
TREE_T2 = (8, 32, 128, 1024)
LONG_CHUNKS = (0, 1, 2, 4, 8, 16)

# Hopper (H100/H200): 228 KB of shared memory and 2048 resident threads per SM,
# at most 32 resident blocks per SM, 227 KB per block with opt-in.
HOPPER_SMEM_PER_SM = 228 * 1024
HOPPER_THREADS_PER_SM = 2048
HOPPER_BLOCKS_PER_SM = 32
SMEM_OPT_IN_LIMIT = 227 * 1024
DEFAULT_SMEM_LIMIT = 48 * 1024


def paper_shared_size(
    nt: int = 256,
    itemsize: int = 8,
    *,
    smem_per_sm: int = HOPPER_SMEM_PER_SM,
    threads_per_sm: int = HOPPER_THREADS_PER_SM,
    max_blocks_per_sm: int = HOPPER_BLOCKS_PER_SM,
) -> int:
    """The paper's SHARED_SIZE: shared memory per SM / resident blocks per SM, in values.

    Rounded DOWN to a power of two, so that shared memory never lowers the
    occupancy the formula was made for. On Hopper with ``nt=256``: 2048 threads
    / 256 = 8 blocks per SM, 228 KB / 8 = 28.5 KB = 3648 doubles, so 2048
    (16 KB of doubles: 8 blocks use 128 KB plus their reduction areas, all
    resident). The same 2048 values is 8 KB in float32 (the formula would allow
    4096); the space has one default for both dtypes.
    """
    blocks = max(1, min(threads_per_sm // nt, max_blocks_per_sm))
    values = smem_per_sm // blocks // itemsize
    return 1 << (int(values).bit_length() - 1)


DEFAULT_SHARED_SIZE = paper_shared_size(256, 8)
assert DEFAULT_SHARED_SIZE in SHARED_SIZES

SPACE = Space(
    (
        Param(
            "shared_size",
            SHARED_SIZES,
            DEFAULT_SHARED_SIZE,
            "nonzeros staged in shared memory per row block (values; the paper's SHARED_SIZE; "
            "default: Hopper shared memory per SM / blocks per SM at nt=256, as a power of two)",
        ),
        Param("nt", THREADS_PER_BLOCK, 256, "threads per block, also the most rows per row block"),
        Param(
            "tree_t1",
            TREE_T1,
            2,
            "decision tree: a block gets the scalar reduction (1 thread per row) when nt/rows < tree_t1",
        ),
        Param(
            "tree_t2",
            TREE_T2,
            32,
            "decision tree: the most threads per row of a multi-row block (the largest power of two "
            "<= min(nt/rows, tree_t2)); a one-row block always uses all nt threads",
        ),
        Param(
            "long_chunks",
            LONG_CHUNKS,
            0,
            "a long row is cut into pieces of at most long_chunks * shared_size nonzeros, one block each, "
            "added up in order by the piece that finishes last (0: one block per long row, the paper)",
        ),
    )
)


# -- the decomposition (NumPy or CuPy, same code) ---------------------------------------------
def row_blocks(indptr: Any, shared_size: int, nt: int, xp: Any = np) -> Any:
    """Row-block boundaries (int32, ``blocks + 1`` entries, first 0, last ``m``) of the paper's greedy.

    The paper (Algorithms 4 and 6) walks the rows adding each to the current
    block; the block is closed after a row when its nonzeros reach exactly
    ``shared_size`` or it holds ``nt`` rows; a row that takes it past
    ``shared_size`` is moved to the next block, unless it is alone, in which
    case it is a long row and keeps a block of its own. So the block starting at
    row ``s`` ends (exclusive) at::

        p = first e > s with indptr[e] - indptr[s] >= shared_size   (m + 1 if none)
        end(s) = min(s + nt, m,  p if the sum is exactly shared_size or p == s + 1 else p - 1)

    ``end`` is computed for every row at once (searchsorted), then the block
    starts ``0, end(0), end(end(0)), ...`` are collected by pointer doubling:
    after round k the first 2**(k+1) starts are known, and ``end`` is replaced by
    ``end∘end``. Work O(m log blocks), memory O(m), no loop over rows or blocks;
    the rounds are as many as a bound on the blocks asks (:func:`_doubling_rounds`). Empty rows are
    ordinary rows: they count towards ``nt`` and belong to a block.
    """
    m = int(indptr.shape[0]) - 1
    cum = indptr.astype(xp.int64)
    start = xp.arange(m, dtype=xp.int64)
    target = cum[:-1] + shared_size
    p = xp.searchsorted(cum, target, side="left")  # in [s + 1, m + 1]
    reached = p <= m
    p_in = xp.minimum(p, m)
    inexact = reached & (cum[p_in] != target)
    end = xp.where(inexact & (p - 1 > start), p - 1, p_in)
    end = xp.minimum(end, start + nt)

    jump = xp.empty(m + 1, dtype=xp.int32)
    jump[:m] = end
    jump[m] = m
    starts = xp.zeros(1, dtype=xp.int32)
    for _ in range(_doubling_rounds(m, int(indptr[-1]), shared_size, nt)):  # no read-back a round
        starts = xp.concatenate((starts, jump[starts]))
        jump = jump[jump]
    # starts ascend, then stay at m: a search, where a count_nonzero would build a CUB reduction per size class
    n_blocks = int(xp.searchsorted(starts, xp.asarray([m], dtype=starts.dtype))[0])
    out = xp.empty(n_blocks + 1, dtype=xp.int32)
    out[:n_blocks] = starts[:n_blocks]
    out[n_blocks] = m
    return out


def _doubling_rounds(m: int, nnz: int, shared_size: int, nt: int) -> int:
    """Rounds of :func:`row_blocks`' pointer doubling that surely reach row ``m``: after ``k`` rounds the first
    ``2**k`` starts are known, and the blocks number at most ``m`` (a row at least each) and at most
    ``3 nnz / shared_size + m / nt + 2``: at most ``m / nt + 1`` close at ``nt`` rows, at most
    ``nnz / shared_size`` hold ``shared_size`` entries or more (exactly that many, or a long row alone), the
    rest close where the next row would take them past ``shared_size``, so such a block and the next hold more
    than ``shared_size`` together: fewer than ``2 nnz / shared_size`` of them, and the last one. Reading back
    whether ``m`` was reached cost a synchronization a round, 2 ms on the GPU for a matrix of 80,000 blocks;
    the bound costs a round or two more of O(m) gathers (about 20 us each there)."""
    bound = min(m, 3 * nnz // shared_size + m // nt + 2)
    return max(bound, 0).bit_length()


def threads_per_row(block_row_start: Any, nt: int, tree_t1: int, tree_t2: int, xp: Any = np) -> Any:
    """The decision tree: threads per row (int32, a power of two) for every block.

    With ``r = rows in the block`` and ``q = nt // r`` (threads available per row):

    - ``r == 1``: ``nt`` (the full-block reduction; a long row is always alone);
    - ``q < tree_t1``: 1 (scalar: one thread per row);
    - otherwise: the largest power of two ``<= min(q, tree_t2)`` (multiple scalar).

    So ``rows * threads_per_row <= nt`` always.
    """
    rows = xp.diff(block_row_start)
    q = nt // rows
    g = xp.ones(rows.shape, dtype=xp.int32)
    width = 2
    while width <= min(nt, tree_t2):
        g = xp.where(q >= width, width, g)
        width *= 2
    g = xp.where(q < tree_t1, 1, g)
    g = xp.where(rows == 1, nt, g)
    return g.astype(xp.int32)


def long_row_span(params: dict[str, Any]) -> int:
    """Most nonzeros of a long row one block sums (0: no limit, a long row is one block)."""
    return int(params["long_chunks"]) * int(params["shared_size"])


def split_long_rows(indptr: Any, starts: Any, tpr: Any, span: int, xp: Any = np) -> dict[str, Any]:
    """Cut every one-row block of more than ``span`` nonzeros into ceil(nnz / span) piece blocks.

    The pieces of a row are consecutive blocks that all start at that row, so
    ``block_row_start`` repeats it (a block's rows end at ``max(next start, its
    start + 1)``); ``block_piece`` numbers them 0, 1, ... (0 for every other
    block). Vectorized: block j of the result is the original block
    ``searchsorted(cumulative pieces, j, "right")``.
    """
    rows = xp.diff(starts)
    nnz = xp.diff(indptr.astype(xp.int64)[starts])
    pieces = xp.ones(rows.shape, dtype=xp.int64)
    if span:
        pieces = xp.where((rows == 1) & (nnz > span), -(-nnz // span), 1)
    last = xp.cumsum(pieces)
    n_blocks = int(last[-1]) if pieces.size else 0
    owner = xp.searchsorted(last, xp.arange(n_blocks, dtype=xp.int64), side="right")
    out_starts = xp.empty(n_blocks + 1, dtype=xp.int32)
    out_starts[:n_blocks] = starts[owner]
    out_starts[n_blocks] = starts[-1]
    piece = xp.arange(n_blocks, dtype=xp.int64) - (last - pieces)[owner]
    return {"block_row_start": out_starts, "block_tpr": tpr[owner], "block_piece": piece.astype(xp.int32)}


def block_table(indptr: Any, params: dict[str, Any], xp: Any = np) -> dict[str, Any]:
    """``{"block_row_start", "block_tpr", "block_piece"}``: the block table the kernel reads, on NumPy or CuPy."""
    starts = row_blocks(indptr, params["shared_size"], params["nt"], xp)
    tpr = threads_per_row(starts, params["nt"], params["tree_t1"], params["tree_t2"], xp)
    return split_long_rows(indptr, starts, tpr, long_row_span(params), xp)


def _pow2_ceil(v: np.ndarray) -> np.ndarray:
    """Smallest power of two >= v (v >= 1), elementwise; a loop over bits, not elements."""
    out = np.ones_like(v)
    while (small := out < v).any():
        out = np.where(small, out * 2, out)
    return out


# -- the family ---------------------------------------------------------------------------------
class Ipcsr(Family):
    name = "ipcsr"
    summary = "row blocks staged in shared memory; scalar or grouped reduction per block by a decision tree"
    source = "Gao, Qi & He (2016), Efficient CSR-Based SpMV on GPU: improved PCSR (Algorithms 4, 6, 7)"
    cu_file = "ipcsr.cu"
    space = SPACE

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return (f"ipcsr<{c_type(dtype)}>",)

    @staticmethod
    def shared_bytes(params: dict[str, Any], dtype: Any) -> int:
        """Dynamic shared memory per block: the staging area and the cross-warp reduction area."""
        return (params["shared_size"] + params["nt"]) * np.dtype(dtype).itemsize

    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        (kernel,) = get_kernels(self.cu_file, self.name_expressions(prepared.dtype)).values()
        need = self.shared_bytes(prepared.params, prepared.dtype)
        if need > DEFAULT_SMEM_LIMIT and kernel.max_dynamic_shared_size_bytes < need:
            # Only ever raised: a smaller config prepared later must not break this one.
            kernel.max_dynamic_shared_size_bytes = need
        table = block_table(prepared.A.indptr, prepared.params, cupy)
        prepared.extra.update(table)
        # A counter (zero between products: the last piece's atomicInc wraps it) and a partial sum
        # for every block, used by the pieces of long rows only.
        split = bool(np.any(cupy.asnumpy(table["block_piece"])))  # few blocks: read on the host
        n = table["block_piece"].size if split else 1
        prepared.extra["counters"] = cupy.zeros(n, dtype=cupy.uint32)
        prepared.extra["partials"] = cupy.zeros(n, dtype=prepared.dtype)
        prepared.extra["kernel"] = kernel

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, p, e = prepared.A, prepared.params, prepared.extra
        n_blocks = int(e["block_tpr"].size)
        e["kernel"](
            (n_blocks,),
            (p["nt"],),
            (
                e["block_row_start"], e["block_tpr"], e["block_piece"], A.indptr, A.indices, A.data, x, out,
                np.int32(p["shared_size"]), np.int32(long_row_span(p)), e["counters"], e["partials"],
            ),
            shared_mem=self.shared_bytes(p, prepared.dtype),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        """The block table, and for every entry the slot (piece, lane) that sums it on the GPU.

        A piece is a row, or one ``span``-long piece of a long row that the table
        splits (its k-th ``span`` nonzeros). Lane of entry j at offset ``o = j - rs``
        in its row, in a block of g threads per row: ``(o % shared_size) % g``
        (the row is staged chunk by chunk, and a piece starts at a multiple of
        shared_size; lane l sums the chunk's entries l, l+g, ...; in increasing j,
        as the kernel does). A piece's lanes then go through the halving tree over
        g lanes; lanes at or past ``width = min(g, shared_size, pow2ceil(piece
        length))`` only ever hold exact zeros, so the reference keeps ``width``
        lanes per piece and its tree adds the same numbers in the same order
        (adding 0 is exact). A row's pieces are then added in order, as the last
        piece block does.
        """
        A, p = prepared.A, prepared.params
        table = block_table(A.indptr, p, np)
        prepared.extra.update(table)
        indptr = A.indptr.astype(np.int64)
        first = table["block_piece"] == 0  # the blocks of row_blocks, before long rows are split
        starts = np.append(table["block_row_start"][:-1][first], prepared.shape[0])
        per_block = np.diff(starts)
        g_row = np.repeat(table["block_tpr"][first], per_block).astype(np.int64)
        pieces = np.repeat(np.bincount(np.cumsum(first) - 1), per_block)  # a split block holds one row
        span = long_row_span(p)
        piece_start = np.zeros(prepared.shape[0] + 1, dtype=np.int64)
        np.cumsum(pieces, out=piece_start[1:])
        rows = row_ids(A.indptr)
        offset = np.arange(prepared.nnz, dtype=np.int64) - indptr[rows]
        piece = piece_start[rows] + np.where(pieces[rows] > 1, offset // max(span, 1), 0)
        piece_row = np.repeat(np.arange(prepared.shape[0]), pieces)
        piece_len = np.bincount(piece, minlength=int(piece_start[-1]))
        g_piece = g_row[piece_row]
        width = np.minimum(_pow2_ceil(np.maximum(piece_len, 1)), np.minimum(g_piece, p["shared_size"]))
        slot_start = np.zeros(width.size + 1, dtype=np.int64)
        np.cumsum(width, out=slot_start[1:])
        lane = (offset % p["shared_size"]) % g_row[rows]
        prepared.extra["width"] = width.astype(np.int32)
        prepared.extra["slot_start"] = slot_start
        prepared.extra["slot"] = slot_start[piece] + lane
        prepared.extra["piece_start"] = piece_start

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        e = prepared.extra
        partial = segment_sums(e["slot"], products(prepared.A, x), int(e["slot_start"][-1]))
        sums = np.zeros(e["width"].size)
        for w in np.unique(e["width"]).tolist():  # at most log2(shared_size) + 1 distinct widths
            pieces = np.flatnonzero(e["width"] == w)
            lanes = partial[e["slot_start"][pieces, None] + np.arange(w)]
            offset = w // 2
            while offset:
                lanes[:, :offset] += lanes[:, offset : 2 * offset]
                offset //= 2
            sums[pieces] = lanes[:, 0]
        count = np.diff(e["piece_start"])
        y = np.zeros(prepared.shape[0])
        for k in range(int(count.max(initial=0))):  # a row's pieces in order, as the last piece adds them
            rows = np.flatnonzero(count > k)
            y[rows] += sums[e["piece_start"][rows] + k]
        return y
