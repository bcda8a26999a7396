"""``nut``: non-uniform tiling (Hong et al., 2018), one thread block per work item of a row panel.

The rows are cut into row panels; inside a panel the *active* columns (those
with a nonzero in that panel) are cut into tiles of ``cols_per_tile`` active
columns each (the panel's last tile may hold fewer). A block takes one panel:
for each tile it gathers the tile's x values into shared memory through the
tile's indirection array (its active column ids), its threads sum the tile's
entries into a shared-memory copy of the panel's y, and at the end the block
writes the panel's y. So x is read once per tile from global memory, however
many rows use it, and y is written once.

Panels. ``rows_per_panel`` rows each, unless that gives fewer than 2 x SMs
panels (a small matrix would leave the GPU idle): then the rows are cut into
2 x SMs panels of about equal nonzeros, and any panel longer than
``rows_per_panel`` rows is cut again, so a panel always fits the shared y.
A panel with a tile of more than :data:`DENSE_TILE_CAPS` times :func:`item_cap`
nonzeros is then cut by rows (a row is never cut) and tiled again: a tile's
entries are one block's work, and dense rows narrower than a tile are one tile.
``panel_ptr`` holds the panel starts (rows).

Slabs (beyond the paper; ``slabs=1``, the default, is the paper's tiling). With
``slabs`` > 1 the columns are cut into equal slabs (column c is in slab ``c *
slabs // n``) and a panel's tiles into one group per slab (a panel's active
columns of one slab, cut into tiles as above; with one slab a group is a panel).

Work items (beyond the paper). A block takes one work item: a run of one
group's tiles, ``item_tile_ptr[i] .. item_tile_ptr[i+1]``, of panel
``item_panel[i]``. A group is one item unless it holds more than
:func:`item_cap` nonzeros, or costs more than a block's share of a large launch
(:func:`item_starts`: entries and gathered columns over the blocks the GPU runs at
once): then its tiles are cut into items of about that many, or of half a share,
so a panel holding a hub row of millions of entries, or dense rows whose entries
are each a gather of their own, is the work of many blocks, not of one that the
whole launch waits for, and where the groups are fewer than the blocks that run at
once every block has work. A panel without entries has one
item of no tiles (it stores zeros). An item that is its panel's only one stores
the panel's y (``item_panel[i] >= 0``); the items of a panel of several add
theirs to y atomically (``item_panel[i] == ~panel``), after the rows of such
panels were cleared (``zero_rows``, or all of y when ``zero_all``: one fill is
cheaper than a scatter over half of y).

Order and bands. The blocks take the items by ``item_order``: band by band
(``bands`` ranges of about equal rows), inside a band slab by slab, inside a
slab the most nonzeros first. One launch runs them all; the hardware starts
blocks in index order, so the blocks running at a time work on one band's
slab. Why: on a GPU whose L2 holds a slab of x and a band of y but not all of
x (a power-law graph of tens of millions of rows), the gathers of x then hit L2
instead of DRAM. The price is y added to once per slab, more and smaller tiles,
and a shared y zeroed and flushed per item. Heaviest first, so that a big item
starts at once rather than last.

Tiles. ``tile_cols[tile_col_ptr[t]:tile_col_ptr[t+1]]`` are tile t's active
columns, ascending (the indirection array: x slot i of the tile is
``x[tile_cols[tile_col_ptr[t] + i]]``).

Encoding of a tile (the index matrix ``enc_idx`` and value matrix ``enc_val``).
The tile's ``e = tile_nnz[t]`` entries, in (row, column) order, are cut into
``w = ceil(e / s)`` stretches of ``s = ceil(e / threads)`` entries (the last may
be shorter); thread k of the block takes stretch k. Entry j of stretch k is stored
at ``tile_ptr[t] + j*w + k`` (column-major: a warp's j-th reads are consecutive
words); the ``s*w - e`` slots past the last stretch are padding (0) and never read.
An index word ``>= 0`` is the x slot of an entry in the same row as the previous
entry of the stretch. A negative word starts an output row: ``~word ==
(local_row << 16) | slot``, with ``local_row`` the row's offset in its panel.
The first entry of every row in the tile and the first entry of every stretch are
negative, so a thread knows each row from its own words. The 16-bit fields limit
slots to 65536 and panel rows to 32768 (the space stays well below).

The default config is the paper's rule for 48 KB of shared memory and float64
(see :func:`paper_defaults`): 2048 rows per panel, 4096 active columns per tile,
1024 threads. The same arrays are built by :func:`build` on the GPU (CuPy) and
on the CPU (NumPy), under the same keys of ``prepared.extra``;
:func:`decode` reads them back exactly as the kernel does.

>>> import scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(50, 40, density=0.1, random_state=0))
>>> f = Nut(num_sms=1)
>>> p = f.prepare_reference(A, {"rows_per_panel": 256, "cols_per_tile": 1024})
>>> bool(abs(f.run_reference(p, np.ones(40)) - A @ np.ones(40)).max() < 1e-12)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import InvalidConfigError, NoDeviceError
from kernels._arrays import argsort_unique, stable_argsort
from kernels._cuda import c_type, device_attributes, get_kernels, grid, require_cupy, to_numpy
from kernels._family import Family, Prepared
from kernels._space import Param, Space, Value

ROWS_PER_PANEL = (256, 512, 1024, 2048, 4096, 8192)
COLS_PER_TILE = (1024, 2048, 4096, 8192, 16384)
THREADS = (128, 256, 512, 1024)
SLABS = (1, 2, 4, 8)
FIT_SLABS = 4
"""The most slabs :meth:`Nut.adapt` gives (the space goes on to 8): past 4 the passes over y cost more than
the gathers of x they keep in L2 (bursts of the unseen benchmark, x of 96 and 192 MB, on the H100: 4 slabs
1.83x and 1.19x cuSPARSE cold in float32 and float64, 8 slabs 1.50x and 1.15x, each at its best of 8 configs;
bench/probe_unseen_configs.py A, bench/results/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_probe_unseen_nut.json).
Held on the H200 (stop 66, probe G, ``..._probe_unseen_slabs.json``) where rows have more entries than bursts'
0.8, best of 12 configs at 4 / 8 slabs: bursts 0.91x / 0.74x and 1.17x / 0.85x (float64 / float32), the issue's
R-MAT at 131 M entries 1.07x / 0.98x and 1.19x / 1.15x, its LP (x of 128 MB) 2.41x / 2.37x and 1.97x / 1.96x;
8 slabs ahead by 1-4 % on its 40 %-empty rows (x of 96 MB: 1.66x against 1.61x in float64), tallwide and
scatterwide in float32: within what a second run moves."""
GATHER_COST = 3
"""What a tile's active column costs a block, in entries (a word of ``tile_cols``, an x gather of a 32-byte sector and
a store to shared memory, against an entry's 8 or 12 streamed bytes): the weight :func:`item_starts` gives columns.
An estimate, not a fit: with it the share rule sees the panels of a band with dense rows that hold a dense row (an
active column an entry) as the heavy ones they are (the H200's ncu: SMs busy 56 % of that launch). Probe K
(``bench/results/..._probe_nut_items-80.txt``), the kept rule against item_cap's cuts
alone: 1.34x in geomean over the 61 cells a rule changed; with columns costing nothing, 1.18x."""
MIN_SHARE = 1 << 14
"""The least cost (:data:`GATHER_COST`) a block's share of the launch must come to for :func:`item_starts` to cut by it:
below it a launch lasts a few microseconds, its blocks wait on memory latency more than on each other, and clearing
the cut panels' rows costs more than the balance gains. Probe K at a twenty-fifth of the size (about a million
entries, shares of 2 K to 11 K; an earlier rule, ``..._probe_nut_items-median-80.txt``): kronecker's one hub panel
cut, 1.44x -> 1.19x cuSPARSE; degreesorted, sellslices and tomography with 512 threads, a few panels cut, -7 % to
-15 %. Item_cap's cuts (a hub row's panel) are made whatever the share."""
CUT_GAIN = 1 / 3
"""The least share of a launch's length (the longer of a block's share and its costliest item) a cut must save for
:func:`item_starts` to make it. Probe K on the H200 with a tenth (``..._probe_nut_items-gain10-80.txt``; 8192-row
panels, tiles of 16384 columns, float32): where the costliest group came to 1.2 and 1.37 shares (kronecker,
communities) cutting cost 7 % and 4 %, at 1.35 (staircase) it gained 9 %, at 1.54 (coupled) 6-18 %, at 2.9 (the band
with dense rows) 40 %. A cut that leaves an item as costly (a heavy tile, which is never cut) is not made either."""
SHARED_PER_SM = 228 * 1024
"""Shared memory an SM of sm_90 (H100, H200) gives its blocks: what :func:`resident_blocks` counts with."""
DENSE_TILE_CAPS = 8
"""A tile of more than this many work-item caps (:func:`item_cap`) has its panel cut by rows
(:func:`_cut_dense_panels`): at most one SM's share of the nonzeros stays one block's work. On the H200 (probe J,
``bench/results/..._probe_nut_dense_panels-gu-79.txt``), cutting where a tile held more than one cap changed 4 of
the 90 unseen structures: denseblock, whose densest tile holds 54-217 caps, from 0.02-0.10x cuSPARSE to 0.66-1.26x;
degreesorted, topheavy and invertedindex (tiles of 1-4.6 caps) by -5 % to +25 % a config, 0.99-1.03 in geomean: not
worth tiling a matrix twice. With 8, denseblock alone is cut (``..._probe_nut_dense_panels-caps-79.txt``)."""
FIT_PANEL_BYTES = 32 * 1024
"""The least shared y of a panel :meth:`Nut.adapt` gives a config it cuts into slabs: 8192 rows in float32,
4096 in float64. Slabs split a panel's entries into one work item a slab, and a panel of the corpus's
2048 rows then gives a block few entries (bursts of the unseen benchmark: under one a thread). On the H200,
4 slabs, 4096 columns a tile, 512 threads (bench/probe_unseen_configs.py D,
bench/results/2026-11-26_NVIDIA-H200-sm-90_probe_unseen_rows_per_panel.json), rows a panel 2048 / 4096 / 8192:
bursts float32 1.22x / 1.41x / 1.57x cuSPARSE, float64 1.06x / 1.08x / 1.06x; communities-large float32
(2 slabs) 1.47x / 1.55x / 1.52x, float64 1.31x / 1.27x / 1.20x (with 1024 threads 1.08x / 1.25x / 1.28x)."""
FIT_SHARED_BYTES = 96 * 1024
"""The most shared memory (a panel of y and a tile of x) :meth:`Nut.adapt` gives a config it cuts into slabs:
two blocks an SM (sm_90 has 228 KB); it narrows the tiles to fit. Past it one block an SM is left to gather x
from the L2: on the H100, bursts of the unseen benchmark in float64, 4 slabs and 512 threads, 8192-row panels
ran 1.19x cuSPARSE with tiles of 4096 columns (96 KB) and 0.83x with 16384 (192 KB), 2048-row panels 1.17x
and 0.57x (48 and 144 KB); on the H200 communities-large in float64 took 1.03 ms and 1.12 ms (8192 rows, 4096 and
16384 columns). In float32 8192 rows and 16384 columns fit it (96 KB) and were the fastest of 32 configs on
communities-large (probes as for :data:`FIT_SLABS` and :data:`FIT_PANEL_BYTES`)."""
JOIN_THREADS = 512
"""The fewest threads of a config whose tile :meth:`Nut.joined` fits (the fewest probe I measured)."""
BANDS = (1, 2, 4, 8, 16)
DEFAULT_SMS = 132
"""SMs assumed when no GPU is visible (H100 SXM and H200)."""

STRUCTURE = (
    "panel_ptr",
    "item_order",
    "item_panel",
    "item_tile_ptr",
    "zero_rows",
    "tile_col_ptr",
    "tile_cols",
    "tile_nnz",
    "tile_ptr",
    "enc_idx",
    "enc_val",
)
"""The arrays of the NuT structure in ``prepared.extra`` (self-contained: the CSR is not needed)."""

_SLOT_BITS = 16
_KEYS_PER_THREAD = 8
"""Entries a thread of ``nut_keys`` takes at a time: its block searches all of indptr once for each span."""
_MAX_ROWS = 1 << (31 - _SLOT_BITS)
_MAX_SLOTS = 1 << _SLOT_BITS


def _widest_tile(columns: int) -> int:
    """The widest ``cols_per_tile`` of the space within ``columns`` (the narrowest where none is):
    :meth:`Nut.adapt`'s and :meth:`Nut.joined`'s fit of a tile to the shared memory left beside a panel's y."""
    return max((c for c in COLS_PER_TILE if c <= columns), default=COLS_PER_TILE[0])


def paper_defaults(dtype: Any, shared_bytes: int = 48 * 1024) -> tuple[int, int]:
    """(rows per panel, active columns per tile) by the paper's rule for ``shared_bytes`` per block.

    A third of the shared memory holds the panel's y, two thirds the tile's x:
    ``paper_defaults("float64") == (2048, 4096)``, ``paper_defaults("float32") == (4096, 8192)``.
    """
    words = shared_bytes // np.dtype(dtype).itemsize
    return words // 3, words * 2 // 3


class Nut(Family):
    name = "nut"
    summary = "non-uniform 2-D tiles: row panels x equal counts of active columns, x and y in shared memory"
    source = "Hong et al., 2018 (Hy-SpMSpV: non-uniform tiling)"
    cu_file = "nut.cu"
    adapt_first = "slabs"
    prepare_spmvs = 30.0  # H200, stop 76: 11-45 SpMVs (median 25) in the races without a selector on unseen matrices
    space = Space(
        (
            Param("rows_per_panel", ROWS_PER_PANEL, 2048, "rows of a panel at most (its y lives in shared memory)"),
            Param("cols_per_tile", COLS_PER_TILE, 4096, "active columns of a tile (its x lives in shared memory)"),
            Param("threads", THREADS, 1024, "threads per block; each takes one stretch of a tile's entries"),
            Param("slabs", SLABS, 1, "column slabs, run one after the other: x gathers stay in one (1: the paper's)"),
            Param("bands", BANDS, 1, "row bands, each run slab after slab so its y stays in L2",
                  when={"slabs": SLABS[1:]}),
        )
    )

    def __init__(self, *, num_sms: int | None = None) -> None:
        """``num_sms`` fixes the SM count of the small-matrix rule (default: the current GPU's, else 132)."""
        self.num_sms = num_sms

    def sm_count(self) -> int:
        if self.num_sms is not None:
            return self.num_sms
        try:
            return device_attributes()["MultiProcessorCount"]
        except NoDeviceError:
            return DEFAULT_SMS

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return _kernel_names(dtype)

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced unranked (no selector for this GPU) with panels of :data:`FIT_PANEL_BYTES` of y and tiles as
        wide as the shared memory then takes (:meth:`joined`): 8192 rows and 16384 columns in float32, as 20 of
        the 26 NuT configs that won the unseen benchmark's float32 races had (the H200, stops 75-76, the shipped
        selector ranking); 4096 and 8192 in float64. The race fits its slabs to the L2
        (:func:`tuner.execute.race.adapted`)."""
        rows = next(r for r in ROWS_PER_PANEL if r >= FIT_PANEL_BYTES // itemsize)
        return self.joined({**self.space.defaults(), "rows_per_panel": rows}, itemsize=itemsize)

    def adapt(self, params: Mapping[str, Any], *, cols: int, itemsize: int, l2_bytes: int) -> dict[str, Any] | None:
        """As many slabs as it takes for one slab of x to fill at most a third of the L2 (the rest holds the
        band of y and the tiles streaming through), at most :data:`FIT_SLABS`; with more than one slab, panels
        of at least :data:`FIT_PANEL_BYTES` of y and tiles narrowed to fit :data:`FIT_SHARED_BYTES`. On the
        8 M-column graph of the unseen benchmark the search found 4 slabs in float64 (x: 64 MB) and 2 in float32
        against the H100's 50 MB of L2, where the selector's one slab lost to cuSPARSE in float64."""
        if l2_bytes <= 0:
            return None
        slabs = next((s for s in SLABS if s == FIT_SLABS or cols * itemsize <= s * l2_bytes / 3), FIT_SLABS)
        config = self.space.validate(params, family=self.name)
        fitted = {**config, "slabs": slabs}
        if slabs > 1:
            rows = min(max(config["rows_per_panel"], FIT_PANEL_BYTES // itemsize), ROWS_PER_PANEL[-1])
            fitted["rows_per_panel"] = next(r for r in ROWS_PER_PANEL if r >= rows)
            room = FIT_SHARED_BYTES // itemsize - fitted["rows_per_panel"]
            fitted["cols_per_tile"] = _widest_tile(min(room, config["cols_per_tile"]))
        fitted = self.space.validate(fitted, family=self.name)
        return None if fitted == config else fitted

    def joined(self, params: Mapping[str, Any], *, itemsize: int) -> dict[str, Value]:
        """``params`` with the widest tile whose x fits beside the panel's y in the shared memory a block of
        their threads has when the SM's threads are full (:data:`FIT_SHARED_BYTES` for 1024 threads, two blocks
        an SM; half for 512): on an x that fits the L2, one slab, the tile sets how often a panel waits for its
        next x. Probe I (bench/probe_unseen_configs.py, the H200, 7 unseen matrices, both dtypes, panels of 2048
        to 8192 rows): with 1024 threads that tile ran 0.988 of the fastest of 4096, 8192 and 16384 columns
        (geomean; 1.066x the three's time as given), with 512 threads 0.959 (1.058x); set l's cliques in float64
        1.24x cuSPARSE with 8192 columns against 0.99x with the 4096 its race joined
        (``bench/results/2026-11-29_NVIDIA-H200-sm-90_probe_unseen_l68.json``). Fewer threads, which the probe
        did not measure, keep their tile."""
        config = self.space.validate(params, family=self.name)
        if config["threads"] < JOIN_THREADS:
            return config
        room = FIT_SHARED_BYTES * config["threads"] // THREADS[-1] // itemsize - config["rows_per_panel"]
        return {**config, "cols_per_tile": _widest_tile(room)}

    def memory_ratio(self, prepared: Prepared) -> float:
        """Bytes of the NuT structure over the bytes of the CSR arrays (indptr + indices + data)."""
        return prepared.ratio_to_csr(STRUCTURE)

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p = prepared.A, prepared.params
        ex = prepared.extra
        ex.update(build(A.indptr, A.indices, A.data, prepared.shape, **p, num_sms=self.sm_count(), xp=cupy))
        kernel = _kernels(prepared.dtype)["spmv"]
        shared = (ex["max_panel_rows"] + ex["max_tile_cols"]) * prepared.dtype.itemsize
        limit = device_attributes()["MaxSharedMemoryPerBlockOptin"]
        if shared > limit:
            raise InvalidConfigError(
                f"nut {p} needs {shared} bytes of shared memory per block; this GPU allows {limit}"
            )
        if shared > kernel.max_dynamic_shared_size_bytes:
            kernel.max_dynamic_shared_size_bytes = shared
        ex["kernel"], ex["shared_bytes"] = kernel, shared

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        ex = prepared.extra
        if ex["zero_all"]:
            out.fill(0)
        elif ex["zero_rows"].size:
            out[ex["zero_rows"]] = 0
        n_items = ex["item_order"].size
        ex["kernel"](
            (n_items,),
            (prepared.params["threads"],),
            (
                np.int32(n_items), np.int32(ex["max_panel_rows"]), ex["item_order"], ex["item_panel"],
                ex["item_tile_ptr"], ex["panel_ptr"], ex["tile_col_ptr"], ex["tile_cols"], ex["tile_nnz"],
                ex["tile_ptr"], ex["enc_idx"], ex["enc_val"], x, out,
            ),
            shared_mem=ex["shared_bytes"],
        )

    # -- CPU reference ----------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        A = prepared.A
        prepared.extra.update(
            build(A.indptr, A.indices, A.data, prepared.shape, **prepared.params, num_sms=self.sm_count())
        )

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        rows, cols, vals = decode(prepared.extra, threads=prepared.params["threads"])
        products = vals.astype(np.float64) * x.astype(np.float64)[cols]
        return np.bincount(rows, weights=products, minlength=prepared.shape[0])


_BUILD_KERNELS = (*(f"{k}<{t}>" for k in ("nut_keys", "nut_runs", "nut_actives", "nut_mark", "nut_uids")
                    for t in ("int", "long long")),
                  "nut_slots", "nut_bit_counts", "nut_bit_ranks", "nut_bit_list", "nut_chunk_ranks")
"""The structure's kernels (:func:`_tiles_on_gpu`), the same for every value type."""


def _kernel_names(dtype: Any) -> tuple[str, ...]:
    """The product's kernel, the encoding's and the structure's (see :func:`build`), one module per value type."""
    return f"nut_spmv<{c_type(dtype)}>", f"nut_encode<{c_type(dtype)}>", *_BUILD_KERNELS


def _kernels(dtype: Any) -> dict[str, Any]:
    """Every kernel of :func:`_kernel_names`, the product's as ``spmv`` and the encoding's as ``encode``."""
    spmv, encode, *build_kernels = names = _kernel_names(dtype)
    kernels = get_kernels(Nut.cu_file, names)
    return {"spmv": kernels[spmv], "encode": kernels[encode], **{k: kernels[k] for k in build_kernels}}


# -- the decomposition, for NumPy and CuPy alike ------------------------------------
def build(
    indptr: Any,
    indices: Any,
    data: Any,
    shape: tuple[int, int],
    *,
    rows_per_panel: int,
    cols_per_tile: int,
    threads: int,
    num_sms: int,
    slabs: int = 1,
    bands: int = 1,
    max_item_nnz: int | None = None,
    xp: Any = np,
) -> dict[str, Any]:
    """The NuT structure of a CSR matrix (nnz > 0, rows > 0) as ``xp`` arrays (``numpy`` or ``cupy``).

    Only functions that NumPy and CuPy share are used, with unique or stably
    sorted keys, so both give identical arrays; on CuPy the passes over the
    entries are kernels of nut.cu (:func:`_tiles_on_gpu`, and ``nut_encode`` for
    the tiles' encoding) that write what the NumPy lines do, mostly without their
    sorts (the GPU tests compare every array), and what is counted in panels, tiles and work items
    (:func:`_panel_starts`, :func:`_work_items`) is NumPy on the host either way. Returns the :data:`STRUCTURE`
    arrays plus ``max_panel_rows`` and ``max_tile_cols`` (ints: the shared memory
    a block needs) and ``zero_all`` (clear all of y before the launch rather than
    ``zero_rows``). ``max_item_nnz`` caps a work item's nonzeros where its tiles
    allow (default: :func:`item_starts`).
    """
    if not (0 < rows_per_panel <= _MAX_ROWS and 0 < cols_per_tile <= _MAX_SLOTS and threads > 0
            and slabs > 0 and bands > 0 and (max_item_nnz is None or max_item_nnz > 0)):
        raise InvalidConfigError(
            f"nut needs 0 < rows_per_panel <= {_MAX_ROWS}, 0 < cols_per_tile <= {_MAX_SLOTS}, threads > 0, "
            "slabs > 0, bands > 0, max_item_nnz > 0"
        )
    m, n = shape
    nnz = int(indices.shape[0])
    i64 = xp.int64
    indptr = indptr.astype(i64)

    on_gpu = hasattr(xp, "RawModule")  # CuPy: kernels of nut.cu, not a dozen passes over nnz-long temporaries

    def tiled(starts: np.ndarray) -> tuple[Any, _Tiles, np.ndarray, np.ndarray]:
        """The panels of ``starts`` on ``xp``, their tiles, where each tile's entries start and each group's tile
        count (NumPy)."""
        panel_ptr = xp.asarray(starts)
        if on_gpu:
            tiles = _tiles_on_gpu(xp, _kernels(data.dtype), indptr, indices, panel_ptr, n, slabs=slabs,
                                  cols_per_tile=cols_per_tile)
            entry_ptr = tiles.tile_entry_ptr
        else:
            tiles = _tiles(xp, indptr, indices, panel_ptr, n, slabs=slabs, cols_per_tile=cols_per_tile)
            entry_ptr = xp.searchsorted(tiles.tile_sorted, xp.arange(tiles.n_tiles + 1, dtype=tiles.tile_sorted.dtype),
                                        side="left")
        return panel_ptr, tiles, to_numpy(entry_ptr), to_numpy(tiles.tiles_per_group)

    # Panels: row starts (on the host), then the active columns and tiles of each (see _tiles); where a tile
    # holds many times what a work item may, its panel is cut by rows and tiled again (_cut_dense_panels).
    panel_ptr_host = _panel_starts(xp, indptr, m, nnz, rows_per_panel, 2 * num_sms)
    panel_ptr, tiles, tile_entry_ptr, tiles_per_group = tiled(panel_ptr_host)
    cut = _cut_dense_panels(xp, indptr, panel_ptr_host, tile_entry_ptr, tiles_per_group, slabs=slabs,
                            cap=item_cap(nnz, (panel_ptr_host.shape[0] - 1) * slabs, num_sms), caps=DENSE_TILE_CAPS)
    if cut is not None:
        panel_ptr_host = cut
        panel_ptr, tiles, tile_entry_ptr, tiles_per_group = tiled(cut)
    group_tile_ptr = to_numpy(tiles.group_tile_ptr)
    tile_cols = np.diff(to_numpy(tiles.tile_col_ptr))
    max_panel_rows = int(np.diff(panel_ptr_host).max())
    max_tile_cols = int(tile_cols.max()) if tile_cols.size else 0
    tile_nnz = np.diff(tile_entry_ptr)
    groups = group_tile_ptr.shape[0] - 1
    if max_item_nnz is None:
        slots = resident_blocks(threads, (max_panel_rows + max_tile_cols) * data.dtype.itemsize, num_sms)
        starts = item_starts(tile_nnz, tile_cols, group_tile_ptr, cap=item_cap(nnz, groups, num_sms), slots=slots)
    else:
        starts = _item_starts(tile_nnz, group_tile_ptr, np.full(groups, max_item_nnz, dtype=np.int64))
    items = _work_items(tile_entry_ptr, starts, group_tile_ptr, panel_ptr_host, m=m, nnz=nnz, slabs=slabs,
                        bands=bands, threads=threads)

    # The tiles' encoding: stretches of s entries a thread, w threads; entry (k, j) at tile_ptr + j*w + k.
    s, w, tile_ptr = (xp.asarray(a) for a in items.stretches)
    storage = int(items.stretches[2][-1])
    enc_idx = xp.zeros(storage, dtype=xp.int32)
    enc_val = xp.zeros(storage, dtype=data.dtype)
    if on_gpu:
        _encode_on_gpu(tiles, s, w, tile_ptr, data, enc_idx, enc_val)
    else:
        order = tiles.order
        tile_sorted = tiles.tile_sorted
        q = xp.arange(nnz, dtype=i64) - xp.asarray(tile_entry_ptr)[tile_sorted]
        s_e, w_e = s[tile_sorted], w[tile_sorted]
        j = q % s_e
        pos = tile_ptr[tile_sorted] + j * w_e + q // s_e
        row_sorted = tiles.local_row[order]
        starts_row = j == 0
        starts_row[1:] |= row_sorted[1:] != row_sorted[:-1]
        slot = tiles.active_slot[tiles.entry_uid[order]]
        word = xp.where(starts_row, ~((row_sorted << _SLOT_BITS) | slot), slot)
        enc_idx[pos] = word.astype(xp.int32)
        enc_val[pos] = data[order]
    return {
        "panel_ptr": panel_ptr.astype(xp.int32),
        **{k: xp.asarray(v) for k, v in items.arrays.items()},
        "tile_col_ptr": xp.asarray(tiles.tile_col_ptr).astype(xp.int32),
        "tile_cols": tiles.tile_cols,
        "tile_ptr": tile_ptr,
        "enc_idx": enc_idx,
        "enc_val": enc_val,
        "max_panel_rows": max_panel_rows,
        "max_tile_cols": max_tile_cols,
        "zero_all": items.zero_all,
    }


@dataclass(frozen=True)
class _Items:
    """What :func:`_work_items` gives :func:`build` (NumPy arrays)."""

    arrays: dict[str, np.ndarray]  # item_order, item_panel, item_tile_ptr, zero_rows, tile_nnz (int32)
    stretches: tuple[np.ndarray, np.ndarray, np.ndarray]  # s, w and tile_ptr of each tile (int64)
    zero_all: bool


def _work_items(tile_entry_ptr: np.ndarray, starts: np.ndarray, group_tile_ptr: np.ndarray,
                panel_ptr: np.ndarray, *, m: int, nnz: int, slabs: int, bands: int, threads: int) -> _Items:
    """The work items, their order, the rows to clear and the tiles' stretches, in NumPy: arrays of panels,
    tiles and items (thousands, not nonzeros), which on the GPU cost a launch or a read-back each for next to
    no work."""
    n_tiles, n_panels = tile_entry_ptr.shape[0] - 1, panel_ptr.shape[0] - 1
    tile_nnz = np.diff(tile_entry_ptr)

    # Work items: runs of a group's tiles, from each tile of ``starts`` (_item_starts).
    tile_group = _owner(np, np.diff(group_tile_ptr))
    first_tile = np.nonzero(starts)[0]
    item_group = tile_group[first_tile]
    # A panel without a tile (without entries) gets an item of none, which stores its zeros; it goes before
    # the item that starts at the same tile, so the items stay in tile order.
    empty = np.nonzero(group_tile_ptr[:-1:slabs] == group_tile_ptr[slabs::slabs])[0]
    holds_tiles = np.arange(first_tile.shape[0] + empty.shape[0]) < first_tile.shape[0]
    first_tile = np.concatenate([first_tile, group_tile_ptr[empty * slabs]])
    item_group = np.concatenate([item_group, empty * slabs])
    by_tile = np.argsort(first_tile * 2 + holds_tiles, kind="stable")
    item_tile_ptr = np.append(first_tile[by_tile], n_tiles)
    item_group = item_group[by_tile]
    item_panel = item_group // slabs
    items_of_panel = np.bincount(item_panel, minlength=n_panels)
    alone = items_of_panel[item_panel] == 1
    item_nnz = np.diff(tile_entry_ptr[item_tile_ptr])

    # The order the blocks take the items in: band by band, slab by slab, the most nonzeros first.
    band_of_panel = np.searchsorted(_band_starts(panel_ptr, m, bands), np.arange(n_panels), side="right") - 1
    launch = band_of_panel[item_panel] * slabs + item_group % slabs
    item_order = argsort_unique(launch * (nnz + 1) + (nnz - item_nnz))

    # Rows no item stores: those of panels with several items, which add to them.
    cleared = np.nonzero(items_of_panel > 1)[0]
    sizes = np.diff(panel_ptr)[cleared]
    zero_all = 2 * int(sizes.sum()) >= m
    zero_rows = np.zeros(0, dtype=np.int64) if zero_all else _ranges(np, panel_ptr[cleared], sizes)

    s = (tile_nnz + threads - 1) // threads
    w = (tile_nnz + s - 1) // s
    arrays = {
        "item_order": item_order.astype(np.int32),
        "item_panel": np.where(alone, item_panel, ~item_panel).astype(np.int32),
        "item_tile_ptr": item_tile_ptr.astype(np.int32),
        "zero_rows": zero_rows.astype(np.int32),
        "tile_nnz": tile_nnz.astype(np.int32),
    }
    return _Items(arrays, (s, w, _exclusive_cumsum(np, s * w)), zero_all)


@dataclass(frozen=True)
class _Tiles:
    """What :func:`build` needs of the entries, active columns and tiles, from :func:`_tiles` (int64)."""

    local_row: Any  # each entry's row inside its panel
    entry_uid: Any  # each entry's active column (a number in (panel, column) order)
    active_slot: Any  # each active column's slot in its tile
    tile_cols: Any  # each active column's column (int32): the tiles' indirection arrays, one after the other
    tile_col_ptr: Any  # where each tile's active columns start, then their count
    tiles_per_group: Any
    group_tile_ptr: Any  # where each group's tiles start, then the tile count
    n_tiles: int
    order: Any  # the entries by tile, CSR order inside a tile (stable)
    tile_sorted: Any  # the tile of each entry in that order


def _tiles(xp: Any, indptr: Any, indices: Any, panel_ptr: Any, n: int, *, slabs: int, cols_per_tile: int) -> _Tiles:
    """The entries' panels, the panels' active columns and their tiles, in NumPy (or any namespace of its
    functions: the tests run it on a stand-in for CuPy)."""
    i64 = xp.int64
    nnz = int(indices.shape[0])
    n_panels = int(panel_ptr.shape[0]) - 1
    entry_row = _owner(xp, xp.diff(indptr))
    entry_panel = _owner(xp, xp.diff(panel_ptr))[entry_row]  # a gather: a search over rows, not over nnz
    local_row = entry_row - panel_ptr[entry_panel]

    # Active columns: the distinct (panel, column) pairs, numbered in order (so by slab inside a panel).
    key = entry_panel * n + indices.astype(i64)
    order = stable_argsort(xp, _narrow(key, n_panels * n))
    key_sorted = key[order]
    new = xp.ones(nnz, dtype=bool)
    new[1:] = key_sorted[1:] != key_sorted[:-1]
    uid_sorted = xp.cumsum(new, dtype=i64) - 1
    entry_uid = xp.empty(nnz, dtype=i64)
    entry_uid[order] = uid_sorted
    active = key_sorted[new]
    active_group = (active // n) * slabs + (active % n) * slabs // n
    group_active_ptr = xp.searchsorted(active_group, xp.arange(n_panels * slabs + 1, dtype=i64), side="left")

    # Tiles: cols_per_tile active columns each, a group's last one possibly fewer.
    tiles_per_group = (xp.diff(group_active_ptr) + cols_per_tile - 1) // cols_per_tile
    group_tile_ptr = _exclusive_cumsum(xp, tiles_per_group)
    n_tiles = int(group_tile_ptr[-1])
    rank = xp.arange(active.shape[0], dtype=i64) - group_active_ptr[active_group]
    active_tile = group_tile_ptr[active_group] + rank // cols_per_tile
    active_slot = rank % cols_per_tile
    tile_col_ptr = xp.searchsorted(active_tile, xp.arange(n_tiles + 1, dtype=i64), side="left")

    # Entries grouped by tile, in CSR order (row, column) inside each tile.
    entry_tile = active_tile[entry_uid]
    order = stable_argsort(xp, _narrow(entry_tile, n_tiles))
    return _Tiles(local_row, entry_uid, active_slot, (active % n).astype(xp.int32), tile_col_ptr, tiles_per_group,
                  group_tile_ptr, n_tiles, order, entry_tile[order])


BITMAP_BITS_PER_NONZERO = 256
"""The GPU finds the active columns with a bit for every (panel, column) pair (:func:`_actives_by_bitmap`)
where those bits are at most this many a nonzero (32 bytes: the sort's temporaries take about as much), else
by a sort of the pairs (:func:`_actives_by_sort`). Whole preparations of 11 unseen matrices (``bench/unseen.py``,
12-40 M nonzeros, 2 configs, both dtypes) against the two sorts before, in one run a GPU: with the bitmap
(0.4-18 bytes a nonzero) 1.17-1.71x as fast on the H100 and 1.15-1.71x on the H200 (median 1.39x on both),
with the sort (42-1884 bytes) 0.85-1.07x and 0.96-1.07x (``bench/results/2026-11-27_nut-prepare-ab-50.txt``).
A first version with the bitmap at any size took 21 ms against the sort's 5.8 on bursts (470 bytes a nonzero,
H200), 3.3 against 4.0 on road's 2048-row panels (52)."""
_CHUNK = 1024
"""Entries a warp of ``nut_chunk_ranks`` takes at least; a panel with more tiles than that takes chunks of as
many entries as it has tiles (rounded up to a warp), so that its counts, one a tile and chunk, are no more than
its entries and tiles."""


@dataclass(frozen=True)
class _GpuTiles:
    """What :func:`build` needs from :func:`_tiles_on_gpu`: the same tiles as :func:`_tiles` (counts of groups
    and tiles in NumPy), and instead of the entries sorted by tile, where each one goes (``nut_encode``)."""

    local_row: Any  # each entry's row inside its panel (int32)
    entry_uid: Any  # each entry's active column (int32)
    active_tile: Any  # each active column's tile (int32)
    active_slot: Any  # each active column's slot in its tile (int32)
    tile_cols: Any  # each active column's column (int32)
    tile_col_ptr: np.ndarray  # where each tile's active columns start, then their count
    tiles_per_group: np.ndarray
    group_tile_ptr: np.ndarray
    tile_entry_ptr: np.ndarray  # where each tile's entries start in tile order, then nnz
    ranks: _ChunkRanks


@dataclass(frozen=True)
class _ChunkRanks:
    """Each entry's place in its tile, as :func:`_chunk_ranks` leaves it for ``nut_encode`` (CuPy arrays)."""

    tile_panel: Any  # each tile's panel (int64)
    panel_entry_ptr: Any  # each panel's first entry, then nnz (int64)
    chunk_size: Any  # each panel's entries a chunk (int64)
    tile_chunk_base: Any  # where each tile's counts start in ``before``, a count a chunk of its panel (int64)
    before: Any  # the entries before each (tile, chunk)'s in tile order (int32)
    rank: Any  # each entry's rank among its chunk's entries of its tile (int32)


def _tiles_on_gpu(cupy: Any, kernels: dict[str, Any], indptr: Any, indices: Any, panel_ptr: Any, n: int, *,
                  slabs: int, cols_per_tile: int) -> _GpuTiles:
    """:func:`_tiles` on the GPU: each entry's panel row and (panel, column) key in one pass (``nut_keys``), the
    active columns from a bitmap of the keys or a sort of them, their tiles and slots (``nut_slots``), and each
    entry's place in its tile (:func:`_chunk_ranks`), on int32 where values fit."""
    i32 = cupy.int32
    nnz, m = int(indices.shape[0]), int(indptr.shape[0]) - 1
    n_panels = int(panel_ptr.shape[0]) - 1
    wide = n_panels * n > np.iinfo(np.int32).max
    key_type, suffix = (cupy.int64, "long long") if wide else (i32, "int")
    local_row = cupy.empty(nnz, dtype=i32)
    key = cupy.empty(nnz, dtype=key_type)
    kernels[f"nut_keys<{suffix}>"](*_launch(-(-nnz // _KEYS_PER_THREAD)), (
        np.int64(nnz), np.int64(m), indptr, indices.astype(i32, copy=False), np.int64(n_panels), panel_ptr,
        np.int64(n), np.int64(_KEYS_PER_THREAD), local_row, key))
    actives = _actives_by_bitmap if n_panels * n <= BITMAP_BITS_PER_NONZERO * nnz else _actives_by_sort
    group_active_ptr, entry_uid, active_group, tile_cols = actives(cupy, kernels, key, suffix, n_panels, n, slabs)
    del key
    tiles_per_group = (np.diff(group_active_ptr) + cols_per_tile - 1) // cols_per_tile
    group_tile_ptr = _exclusive_cumsum(np, tiles_per_group)
    n_tiles, n_active = int(group_tile_ptr[-1]), int(group_active_ptr[-1])
    active_tile = cupy.empty(n_active, dtype=i32)
    active_slot = cupy.empty(n_active, dtype=i32)
    kernels["nut_slots"](*_launch(n_active), (np.int64(n_active), active_group, cupy.asarray(group_active_ptr),
                                              cupy.asarray(group_tile_ptr), np.int64(cols_per_tile), active_tile,
                                              active_slot))
    tile_group = _owner(np, tiles_per_group)
    tile_col_ptr = np.append(group_active_ptr[tile_group] + (np.arange(n_tiles) - group_tile_ptr[tile_group])
                             * cols_per_tile, n_active)
    ranks, tile_entry_ptr = _chunk_ranks(cupy, kernels, indptr, panel_ptr, entry_uid, active_tile,
                                         tile_group // slabs, group_tile_ptr[::slabs])
    return _GpuTiles(local_row, entry_uid, active_tile, active_slot, tile_cols, tile_col_ptr, tiles_per_group,
                     group_tile_ptr, tile_entry_ptr, ranks)


def _actives_by_bitmap(cupy: Any, kernels: dict[str, Any], key: Any, suffix: str, n_panels: int, n: int,
                       slabs: int) -> tuple[np.ndarray, Any, Any, Any]:
    """Where each group's active columns start (NumPy, then their count), each entry's active column, and each
    active column's group and column, from a bit a (panel, column) pair (nut.cu's ``nut_mark`` and the
    kernels after it; see :data:`BITMAP_BITS_PER_NONZERO`)."""
    i32, i64 = cupy.int32, cupy.int64
    nnz = int(key.shape[0])
    words = ((n_panels * n >> 5) + 8) // 8 * 8  # a word past the last bit (whose rank is the count), in sectors of 8
    bits = cupy.zeros(words, dtype=cupy.uint32)
    kernels[f"nut_mark<{suffix}>"](*_launch(nnz, capped=True), (np.int64(nnz), key, bits))
    counts = cupy.zeros(words // 8 + 1, dtype=i64)
    kernels["nut_bit_counts"](*_launch(words // 8, capped=True), (np.int64(words // 8), bits, counts))
    sector_before = cupy.cumsum(counts)
    group = np.arange(n_panels * slabs + 1, dtype=np.int64)  # (panel, slab) groups, then the end
    first_col = -(-(group % slabs) * n // slabs)  # ceil(slab * n / slabs): the slab's first column
    starts = cupy.asarray((group // slabs) * n + first_col)  # a group's first bit
    ranks = cupy.empty(starts.shape[0], dtype=i64)
    kernels["nut_bit_ranks"](*_launch(starts.shape[0]), (np.int64(starts.shape[0]), starts, bits, sector_before,
                                                         ranks))
    entry_uid = cupy.empty(nnz, dtype=i32)
    kernels[f"nut_uids<{suffix}>"](*_launch(nnz), (np.int64(nnz), key, bits, sector_before, entry_uid))
    group_active_ptr = ranks.get()
    active_group = cupy.empty(int(group_active_ptr[-1]), dtype=i32)
    tile_cols = cupy.empty(int(group_active_ptr[-1]), dtype=i32)
    kernels["nut_bit_list"](*_launch(words, capped=True), (np.int64(words), bits, sector_before, np.int64(n),
                                                           np.int64(slabs), active_group, tile_cols))
    return group_active_ptr, entry_uid, active_group, tile_cols


def _actives_by_sort(cupy: Any, kernels: dict[str, Any], key: Any, suffix: str, n_panels: int, n: int,
                     slabs: int) -> tuple[np.ndarray, Any, Any, Any]:
    """:func:`_actives_by_bitmap`'s arrays from a sort of the keys and a scan of where their runs start."""
    i32 = cupy.int32
    nnz = int(key.shape[0])
    launch = _launch(nnz)
    order = stable_argsort(cupy, key)
    starts = cupy.empty(nnz, dtype=i32)
    kernels[f"nut_runs<{suffix}>"](*launch, (np.int64(nnz), order, key, starts))
    runs = cupy.cumsum(starts, dtype=i32)
    n_active = int(runs[-1])
    entry_uid = cupy.empty(nnz, dtype=i32)
    active_group = cupy.empty(n_active, dtype=i32)
    tile_cols = cupy.empty(n_active, dtype=i32)
    kernels[f"nut_actives<{suffix}>"](*launch, (np.int64(nnz), order, key, starts, runs, np.int64(n), np.int64(slabs),
                                                entry_uid, active_group, tile_cols))
    group_active_ptr = to_numpy(cupy.searchsorted(active_group, cupy.arange(n_panels * slabs + 1, dtype=i32),
                                                  side="left")).astype(np.int64)
    return group_active_ptr, entry_uid, active_group, tile_cols


def _chunk_ranks(cupy: Any, kernels: dict[str, Any], indptr: Any, panel_ptr: Any, entry_uid: Any, active_tile: Any,
                 tile_panel: np.ndarray, panel_tile_ptr: np.ndarray) -> tuple[_ChunkRanks, np.ndarray]:
    """Each entry's place in its tile, without sorting the entries by tile (nut.cu's ``nut_chunk_ranks``): a
    count of each tile's entries in every chunk of its panel's entries (at least :data:`_CHUNK` a chunk, and
    no fewer than the panel's tiles), and each entry's rank in its chunk. Also where each tile's entries start
    in tile order, then nnz (NumPy)."""
    i32 = cupy.int32
    panel_entry_ptr = indptr[panel_ptr]
    entries = np.diff(to_numpy(panel_entry_ptr))
    chunk_size = np.maximum(_CHUNK, -(-np.diff(panel_tile_ptr) // 32) * 32)
    chunks = -(-entries // chunk_size)
    panel_chunk_ptr = _exclusive_cumsum(np, chunks)
    n_chunks = int(panel_chunk_ptr[-1])
    tile_chunk_base = _exclusive_cumsum(np, chunks[tile_panel])
    table = cupy.zeros(int(tile_chunk_base[-1]) + 1, dtype=i32)
    rank = cupy.empty(entry_uid.shape[0], dtype=i32)
    host = (chunk_size, tile_chunk_base, panel_chunk_ptr, _owner(np, chunks), tile_panel)
    ends = np.cumsum([a.shape[0] for a in host])
    chunk_size, tile_chunk_base, panel_chunk_ptr, chunk_panel, tile_panel = (  # one copy to the GPU, not five
        cupy.split(cupy.asarray(np.concatenate(host).astype(np.int64, copy=False)), ends[:-1].tolist()))
    kernels["nut_chunk_ranks"](*_launch(32 * n_chunks), (
        np.int64(n_chunks), chunk_panel, panel_chunk_ptr, panel_entry_ptr, chunk_size, entry_uid, active_tile,
        tile_chunk_base, table, rank))
    before = cupy.cumsum(table, dtype=i32)  # table[0] is 0: at (tile, chunk), the entries before its
    tile_entry_ptr = to_numpy(before[tile_chunk_base]).astype(np.int64)
    return _ChunkRanks(tile_panel, panel_entry_ptr, chunk_size, tile_chunk_base, before, rank), tile_entry_ptr


_BLOCKS_PER_SM = 32
"""The most blocks a grid-stride kernel of a few instructions an item is launched with, per SM (``capped``:
four times as many threads as an SM holds). On an H200, capped against a block for every 256 items: on 150 M
words of incidence's bitmap ``nut_bit_list`` 1.66 ms against 2.04, ``nut_mark`` 1.36 against 2.14 (skyline's
0.36 against 1.29: fewer atomics in flight on one word); but ``nut_encode``, a chain of gathers an entry,
1.31-2.65 ms against 1.17-2.24 on six unseen matrices, so it and the others are not capped
(``bench/results/2026-11-27_nut-prepare-steps-50.txt``)."""


def _launch(n: int, block: int = 256, *, capped: bool = False) -> tuple[tuple[int], tuple[int]]:
    """Grid and block of a grid-stride kernel over ``n`` items (``capped``: see :data:`_BLOCKS_PER_SM`)."""
    most = _BLOCKS_PER_SM * device_attributes()["MultiProcessorCount"] if capped else 65535 * 8
    return (min(grid(n, block), most),), (block,)


def _encode_on_gpu(tiles: _GpuTiles, s: Any, w: Any, tile_ptr: Any, data: Any, enc_idx: Any,
                   enc_val: Any) -> None:
    """``enc_idx`` and ``enc_val`` filled by ``nut_encode`` (nut.cu), an entry a thread: the NumPy branch of
    :func:`build`, without the entries sorted by tile."""
    r = tiles.ranks
    nnz = data.shape[0]
    _kernels(data.dtype)["encode"](*_launch(nnz), (
        np.int64(nnz), tiles.entry_uid, tiles.active_tile, tiles.active_slot, r.tile_panel, r.panel_entry_ptr,
        r.chunk_size, r.tile_chunk_base, r.before, r.rank, s, w, tile_ptr, tiles.local_row, data, enc_idx, enc_val))


def item_cap(nnz: int, groups: int, num_sms: int) -> int:
    """Nonzeros a work item holds at most where its group's tiles can be cut: an eighth of an SM's share
    of the nonzeros (so no item outlasts the others by much: a hub row's panel is cut into many), but at
    least 4 times a group's mean (an even spread stays whole: a cut costs cleared rows and atomic adds)."""
    return max(nnz // (8 * num_sms), 4 * nnz // groups, 1)


def resident_blocks(threads: int, shared_bytes: int, num_sms: int) -> int:
    """The blocks of ``threads`` threads and ``shared_bytes`` of shared memory the GPU runs at once: an SM runs 32
    blocks at most, its registers (32 a thread, ``__launch_bounds__(1024, 2)``) hold 2048 threads, its shared
    memory :data:`SHARED_PER_SM` (each block 1 KB more, the driver's)."""
    return num_sms * max(1, min(32, 2048 // threads, SHARED_PER_SM // (shared_bytes + 1024)))


def item_starts(tile_nnz: np.ndarray, tile_cols: np.ndarray, group_tile_ptr: np.ndarray, *, cap: int,
                slots: int) -> np.ndarray:
    """Which tiles start a work item: each group's first; each where the group's running count of nonzeros passes a
    multiple of ``cap`` (:func:`item_cap`: a hub row's panel is many items); and, where a block's share of the
    launch's cost (entries plus :data:`GATHER_COST` a tile's active column, over the ``slots`` blocks that run at
    once) is at least :data:`MIN_SHARE`, in each group costing more than a share each where its running cost
    passes a multiple of about half a share, if that shortens the launch (the longer of a share and its costliest
    item: the heaviest are taken first) by :data:`CUT_GAIN`. Other groups stay whole: a cut costs cleared rows and
    atomic adds, and the blocks of one panel's pieces no longer sweep x together."""
    starts = _item_starts(tile_nnz, group_tile_ptr, np.full(group_tile_ptr.shape[0] - 1, cap, dtype=np.int64))
    tile_cost = tile_nnz + GATHER_COST * tile_cols
    group_cost = np.diff(np.append(0, np.cumsum(tile_cost))[group_tile_ptr])
    share = float(group_cost.sum()) / slots
    heavy = group_cost > share
    if share < MIN_SHARE or not heavy.any():
        return starts
    pieces = np.where(heavy, np.ceil(group_cost / (share / 2)), 1.0)
    cut = starts | _item_starts(tile_cost, group_tile_ptr, np.ceil(group_cost / pieces).astype(np.int64))
    before, after = (max(share, float(np.add.reduceat(tile_cost, np.nonzero(s)[0]).max())) for s in (starts, cut))
    return cut if after <= (1 - CUT_GAIN) * before else starts


def _item_starts(tile_weight: np.ndarray, group_tile_ptr: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Which tiles start a work item: a group's first, and each where the group's running weight passes a multiple
    of its cap."""
    tile_group = _owner(np, np.diff(group_tile_ptr))
    offset = np.append(0, np.cumsum(tile_weight))
    chunk = (offset[:-1] - offset[group_tile_ptr[tile_group]]) // caps[tile_group]
    starts = np.ones(tile_weight.shape[0], dtype=bool)
    starts[1:] = (tile_group[1:] != tile_group[:-1]) | (chunk[1:] != chunk[:-1])
    return starts


def _band_starts(panel_ptr: np.ndarray, m: int, bands: int) -> list[int]:
    """Panel indices where the bands start, then the panel count: band b holds the panels whose first
    row lies in [b*m/bands, (b+1)*m/bands), empty bands dropped."""
    n_panels = len(panel_ptr) - 1
    starts = np.searchsorted(panel_ptr[:-1], np.arange(bands, dtype=np.int64) * m // bands, side="left")
    return sorted({*starts.tolist(), n_panels})


def _panel_starts(xp: Any, indptr: Any, m: int, nnz: int, rows: int, small: int) -> np.ndarray:
    """Row starts of the panels (NumPy int64, ends with m): uniform, or ``small`` panels balanced by nonzeros.

    Balanced when ``rows``-row panels would number fewer than ``small``; every
    panel is then cut again into pieces of at most ``rows`` rows. ``indptr`` (an ``xp`` array) is
    searched only then.
    """
    if -(-m // rows) >= small:
        return np.append(np.arange(0, m, rows, dtype=np.int64), np.int64(m))
    targets = xp.asarray(np.arange(1, small, dtype=np.int64) * nnz // small)  # on the host: one copy, not 3 kernels
    ends = to_numpy(xp.searchsorted(indptr, targets, side="left"))
    bounds = np.unique(np.concatenate([[0], ends, [m]]).astype(np.int64))  # distinct, increasing starts
    pieces = (np.diff(bounds) + rows - 1) // rows
    return np.append(_ranges(np, bounds[:-1], pieces, rows), bounds[-1])


def _cut_dense_panels(xp: Any, indptr: Any, starts: np.ndarray, tile_entry_ptr: np.ndarray,
                      tiles_per_group: np.ndarray, *, slabs: int, cap: int, caps: int) -> np.ndarray | None:
    """``starts`` (panel starts, NumPy int64, ending with m) with each panel that has a tile of more than ``caps`` x
    ``cap`` nonzeros cut by rows into pieces of about equal nonzeros, as many as that tile holds caps (a row is never
    cut); None where no tile holds that many.

    Why: a tile's entries are one block's work, and dense rows narrower than a tile are one tile: the unseen
    benchmark's denseblock (a 4,000 x 4,000 dense block in a 2-D Laplacian) put 16 M entries in one tile and ran
    at 0.02-0.10x cuSPARSE whole, 0.67-1.27x cut (the H200, 31 configs in both dtypes,
    ``bench/results/..._probe_nut_dense_panels-caps-79.txt``). A panel heavy by many tiles (a hub row's) is left whole:
    its tiles are cut into work items, and cut by rows it regathers the x its pieces share (invertedindex there:
    1.62x cuSPARSE whole, 1.28x with every panel of more than the cap cut, ``..._probe_nut_heavy_panels-79.txt``).
    """
    tile_nnz = np.diff(tile_entry_ptr)
    if tile_nnz.size == 0 or tile_nnz.max() <= caps * cap:
        return None
    densest = np.zeros(starts.shape[0] - 1, dtype=np.int64)
    np.maximum.at(densest, _owner(np, tiles_per_group) // slabs, tile_nnz)
    heavy = np.nonzero(densest > caps * cap)[0]
    pieces = -(-densest[heavy] // cap)
    lo, hi = to_numpy(indptr[xp.asarray(np.concatenate([starts[heavy], starts[heavy + 1]]))]).reshape(2, -1)
    owner = np.repeat(np.arange(heavy.shape[0]), pieces - 1)
    k = _ranges(np, np.ones(heavy.shape[0], dtype=np.int64), pieces - 1)  # 1 .. pieces-1 of each heavy panel
    targets = lo[owner] + (hi - lo)[owner] * k // pieces[owner]
    cuts = to_numpy(xp.searchsorted(indptr, xp.asarray(targets), side="left"))
    return np.unique(np.concatenate([starts, cuts.astype(np.int64)]))


def _ranges(xp: Any, starts: Any, counts: Any, step: int = 1) -> Any:
    """``counts[i]`` values from ``starts[i]`` by ``step``, range after range (int64)."""
    owner = _owner(xp, counts)
    index = xp.arange(owner.shape[0], dtype=xp.int64) - _exclusive_cumsum(xp, counts)[owner]
    return starts.astype(xp.int64)[owner] + index * step


def _owner(xp: Any, counts: Any) -> Any:
    """For counts c_0, c_1, ...: c_0 zeros, c_1 ones, ... (int64), i.e. ``repeat(arange, counts)``."""
    if xp is np:
        return np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)
    ends = xp.cumsum(counts)
    total = int(ends[-1]) if ends.shape[0] else 0
    return xp.searchsorted(ends, xp.arange(total, dtype=xp.int64), side="right")


def _exclusive_cumsum(xp: Any, counts: Any) -> Any:
    out = xp.zeros(counts.shape[0] + 1, dtype=xp.int64)
    out[1:] = xp.cumsum(counts)
    return out


def _narrow(key: Any, bound: int) -> Any:
    """``key`` (integers, each below ``bound``) as uint16 or int32 where they fit: a radix sort of a quarter or
    half the passes of int64's (on the H200, an argsort of 20-40 M uint16 keys takes 0.6-1.0 ms, of int32
    keys 0.9-1.7 ms)."""
    if bound <= np.iinfo(np.uint16).max + 1:
        return key.astype(np.uint16)
    return key.astype(np.int32, copy=False) if bound <= np.iinfo(np.int32).max else key


# -- reading the structure back as the kernel does ------------------------------------
def decode(extra: dict[str, Any], *, threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, column, value) of every entry, read from the NuT arrays exactly as the kernel reads them.

    Walks each tile's stretches (thread k reads ``tile_ptr + j*w + k`` for
    ``j < min(s, e - k*s)``), takes the row from the last negative word of the
    stretch and the column through the tile's indirection array (a tile belongs to
    its work item's panel). Raises
    ``ValueError`` where the kernel would go wrong: a stretch that does not start
    with a negative word, a slot outside the tile, a row outside the panel.
    Entries come out in tile order, then thread, then position in the stretch.
    """
    ex = {k: np.asarray(v) for k, v in extra.items() if k in STRUCTURE}
    e = ex["tile_nnz"].astype(np.int64)
    n_tiles = e.shape[0]
    s = (e + threads - 1) // threads
    w = (e + s - 1) // s
    tile = np.repeat(np.arange(n_tiles, dtype=np.int64), e)
    q = np.arange(tile.shape[0], dtype=np.int64) - np.repeat(np.cumsum(e) - e, e)
    j, k = q % s[tile], q // s[tile]
    pos = ex["tile_ptr"][tile] + j * w[tile] + k
    word = ex["enc_idx"][pos].astype(np.int64)
    vals = ex["enc_val"][pos]
    if np.any(word[j == 0] >= 0):
        raise ValueError("a stretch does not start with a negative (row) word")
    named = word < 0
    code = np.where(named, ~word, 0)
    slot = np.where(named, code & (_MAX_SLOTS - 1), word)
    last_named = np.maximum.accumulate(np.where(named, np.arange(word.shape[0]), 0))
    local_row = (code >> _SLOT_BITS)[last_named]
    panel_ptr, tile_col_ptr = ex["panel_ptr"].astype(np.int64), ex["tile_col_ptr"].astype(np.int64)
    item_panel = ex["item_panel"].astype(np.int64)
    item = np.searchsorted(ex["item_tile_ptr"], np.arange(n_tiles), side="right") - 1
    panel = np.where(item_panel < 0, ~item_panel, item_panel)[item]
    if np.any(slot >= np.diff(tile_col_ptr)[tile]):
        raise ValueError("an index word points past its tile's active columns")
    if np.any(local_row >= np.diff(panel_ptr)[panel][tile]):
        raise ValueError("a row word points past its panel's rows")
    cols = ex["tile_cols"][tile_col_ptr[tile] + slot]
    rows = panel_ptr[panel][tile] + local_row
    return rows, cols, vals
