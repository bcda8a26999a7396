// merge_path: merge-based CSR SpMV (Merrill & Garland, SC16), written for this project.
//
// The row ends (indptr[1:]) and the nonzero indices 0 .. nnz-1 merge into one
// path of m + nnz items: row end r comes before nonzero j when indptr[r+1] <= j
// (so an empty row's end comes before the next nonzero). A point of the path is
// a coordinate (i, j): i row ends and j nonzeros consumed. The path is cut into
// tiles of blockDim.x * IPT items, a tile a thread block, and a tile into IPT
// items a thread: every thread gets the same work whatever the row lengths.
//
//   merge_path_search (prepare, once): the coordinate of every tile boundary
//     (diagonal b * tile), by a binary search of the row pointer along the
//     diagonal; tile_row / tile_nz, n_tiles + 1 entries each.
//   merge_path_spmv<V, IPT, STAGED, NARROW> (a run): per tile,
//     1. the ends of the rows the tile consumes, indptr[r0+1 .. r1], staged in
//        shared memory, and (STAGED) the products of its nonzeros, value *
//        x[column], computed by the whole block in order (coalesced reads;
//        streaming hint __ldcs on values and columns, read once);
//     2. each thread finds its start on its diagonal by a binary search of the
//        row ends (its end is the next thread's start); not STAGED, it reads its
//        own nonzeros' values and columns and gathers x;
//     3. it walks its items in order: a nonzero adds its product to the running
//        sum, a row end closes the row; every row it closes but the first is
//        written to y at once (the thread holds all of it), the first is kept
//        (the head: earlier threads may hold the rest of that row);
//     4. each thread's carry-out (the row it ends in and its partial sum of it)
//        goes through a block-wide segmented scan (reduce-by-key of rows): the
//        thread closing a row adds what the threads before it in the tile carry
//        of that row to its head and writes y; the tile's carry-out (its partial
//        sum of the row it ends in, a row that goes on into the next tile) is
//        written to carry[b].
//   merge_path_fixup<V> (a run, when some tile ends inside a row): the rows that
//     span tiles: y[tile_row[b+1]] += carry[b], the carries of a warp summed by
//     row first, so a row spanning many tiles takes one atomic a warp.
//
// Every row end is consumed by exactly one thread, so stage 1 writes every row of
// y (an empty row gets 0) and the fix-up only adds. 32-bit coordinates: the
// caller checks m + nnz < 2^31. Instantiated per value type, items a thread, loads and columns:
// merge_path_spmv<double, 7, true, true>, merge_path_fixup<double>, merge_path_search.

#ifndef MERGE_PATH_MAX_THREADS
#define MERGE_PATH_MAX_THREADS 512
#endif

namespace merge_path_detail {

constexpr unsigned FULL = 0xffffffffu;

// The count of row ends at diagonal d of the merge of `ends` (n_ends row ends) with the n_nz nonzeros
// j0, j0 + 1, ...: the path's coordinate there is (i, j0 + d - i). GLOBAL: `ends` is in global memory.
template <bool GLOBAL>
__device__ __forceinline__ int search(const int* ends, int n_ends, int j0, int n_nz, int d)
{
    int lo = max(d - n_nz, 0);
    int hi = min(d, n_ends);
    while (lo < hi) {
        const int pivot = (lo + hi) >> 1;
        int end;
        if constexpr (GLOBAL) {
            end = __ldg(&ends[pivot]);
        } else {
            end = ends[pivot];
        }
        if (end <= j0 + d - pivot - 1) {  // row end `pivot` comes before the nonzero on the diagonal
            lo = pivot + 1;
        } else {
            hi = pivot;
        }
    }
    return lo;
}

// Inclusive segmented scan over the lanes of (row, value) pairs whose rows never decrease: each lane gets
// the sum of the values of the lanes up to it that share its row.
template <typename V>
__device__ __forceinline__ V warp_scan_by_row(int row, V v, int lane)
{
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int r = __shfl_up_sync(FULL, row, o);
        const V u = __shfl_up_sync(FULL, v, o);
        if (lane >= o && r == row) v += u;
    }
    return v;
}

// prod[q] = data[j] * x[column(j)] for j = first + q * stride below `end`, else 0: every load of values and
// columns issued before the first gather of x (values and columns are read once: streaming hint).
template <typename V, int IPT, typename Column>
__device__ __forceinline__ void load_products(V* prod, const int first, const int stride, const int end,
                                              const V* __restrict__ data, const V* __restrict__ x,
                                              const Column column)
{
    int col[IPT];
    V val[IPT];
#pragma unroll
    for (int q = 0; q < IPT; ++q) {
        const int j = first + q * stride;
        col[q] = j < end ? column(j) : 0;
        val[q] = j < end ? __ldcs(&data[j]) : V(0);
    }
#pragma unroll
    for (int q = 0; q < IPT; ++q) prod[q] = first + q * stride < end ? val[q] * __ldg(&x[col[q]]) : V(0);
}

}  // namespace merge_path_detail

// Tile boundary k (k = 0 .. n_tiles): the path's coordinate at diagonal min(k * tile, m + nnz).
__global__ void merge_path_search(const int m,
                                  const int nnz,
                                  const int tile,
                                  const int n_tiles,
                                  const int* __restrict__ indptr,
                                  int* __restrict__ tile_row,
                                  int* __restrict__ tile_nz)
{
    const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k > n_tiles) return;
    const long long diagonal = k * tile;
    const int d = diagonal < (long long)m + nnz ? (int)diagonal : m + nnz;  // m + nnz < 2^31: checked by the caller
    const int i = merge_path_detail::search<true>(indptr + 1, m, 0, nnz, d);
    tile_row[k] = i;
    tile_nz[k] = d - i;
}

// One block a tile of blockDim.x * IPT path items (blockDim.x a multiple of 32, at most
// MERGE_PATH_MAX_THREADS); dynamic shared memory: the tile's row ends, then, when STAGED, its products
// (together at most a tile of items: blockDim.x * IPT * sizeof(V) + 16 bytes).
// NARROW: a tile whose columns span fewer than 65,536 (tile_base[b] >= 0) reads them as 16-bit offsets from
// tile_base[b] (narrow.cu writes them, a tile a segment); a wider tile reads the CSR's int32 columns.
template <typename V, int IPT, bool STAGED, bool NARROW>
__global__ void __launch_bounds__(MERGE_PATH_MAX_THREADS)
merge_path_spmv(const int* __restrict__ indptr,
                const int* __restrict__ indices,
                const int* __restrict__ tile_base,
                const unsigned short* __restrict__ offsets,
                const V* __restrict__ data,
                const V* __restrict__ x,
                V* __restrict__ y,
                const int* __restrict__ tile_row,
                const int* __restrict__ tile_nz,
                V* __restrict__ carry)
{
    using namespace merge_path_detail;
    extern __shared__ __align__(16) unsigned char merge_path_shared[];
    __shared__ int s_row[MERGE_PATH_MAX_THREADS / 32];
    __shared__ V s_val[MERGE_PATH_MAX_THREADS / 32];

    const int b = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int r0 = tile_row[b];
    const int j0 = tile_nz[b];
    const int n_rows = tile_row[b + 1] - r0;  // row ends in the tile
    const int n_nz = tile_nz[b + 1] - j0;     // nonzeros in the tile
    const int items = n_rows + n_nz;
    int* ends = reinterpret_cast<int*>(merge_path_shared);  // row ends of rows r0 .. r1-1
    V* prods = reinterpret_cast<V*>(merge_path_shared + ((n_rows * (int)sizeof(int) + 15) & ~15));

    // 1. the tile's row ends; when STAGED, its products too, read by the whole block in order (coalesced;
    //    the values and columns are read once: streaming hint), as CUB stages them. A thread's IPT loads are
    //    issued together (n_nz <= a tile = IPT * blockDim.x), so they wait on memory together.
    for (int k = threadIdx.x; k < n_rows; k += blockDim.x) ends[k] = __ldg(&indptr[r0 + 1 + k]);
    // The products of entries first, first + stride, ... (IPT of them, those below `end`), by the tile's kind
    // of column: one loop each, so that no branch splits the loads (the tile's kind is the block's).
    const int lowest = NARROW ? tile_base[b] : -1;
    auto products = [&](V* prod, const int first, const int stride, const int end) {
        if (lowest >= 0) {
            load_products<V, IPT>(prod, first, stride, end, data, x,
                                  [=](int j) { return lowest + (int)__ldcs(&offsets[j]); });
        } else {
            load_products<V, IPT>(prod, first, stride, end, data, x, [=](int j) { return __ldcs(&indices[j]); });
        }
    };
    V prod[IPT];
    if constexpr (STAGED) {
        products(prod, j0 + threadIdx.x, blockDim.x, j0 + n_nz);
#pragma unroll
        for (int q = 0; q < IPT; ++q) {
            const int k = q * blockDim.x + threadIdx.x;
            if (k < n_nz) prods[k] = prod[q];
        }
    }
    __syncthreads();

    // 2. the thread's items: row ends is .. ie-1 and nonzeros js .. je-1 of the tile (local rows, global nonzeros).
    const int d = min((int)threadIdx.x * IPT, items);
    const int is = search<false>(ends, n_rows, j0, n_nz, d);
    int ie = __shfl_down_sync(FULL, is, 1);
    if (lane == 31) ie = search<false>(ends, n_rows, j0, n_nz, min(d + IPT, items));
    const int js = j0 + d - is;
    const int je = j0 + min(d + IPT, items) - ie;
    // Not STAGED: the thread reads its own (consecutive) nonzeros, its IPT loads together.
    if constexpr (STAGED) {
#pragma unroll
        for (int q = 0; q < IPT; ++q) prod[q] = js + q < je ? prods[js - j0 + q] : V(0);
    } else {
        products(prod, js, 1, je);
    }

    // 3. the walk: row end i comes before nonzero j when its end is <= j.
    V acc = 0;
    V head = 0;  // the thread's partial sum of the first row it closes (row r0 + is)
    int i = is;
    auto close_row = [&]() {
        if (i == is) {
            head = acc;
        } else {
            y[r0 + i] = acc;
        }
        acc = V(0);
        ++i;
    };
#pragma unroll
    for (int q = 0; q < IPT; ++q) {
        if (js + q < je) {
            while (i < ie && ends[i] <= js + q) close_row();
            acc += prod[q];
        }
    }
    while (i < ie) close_row();

    // 4. carry-outs: (row r0 + ie, acc). Block-wide segmented scan: lanes, then the warps' totals.
    const int row = r0 + ie;
    const V incl = warp_scan_by_row(row, acc, lane);
    if (lane == 31) {
        s_row[warp] = row;
        s_val[warp] = incl;
    }
    __syncthreads();
    int prev_row = -1;  // what the warps before this one carry: (prev_row, prev_val)
    V prev_val = 0;
    for (int w = 0; w < warp; ++w) {
        prev_val = s_row[w] == prev_row ? prev_val + s_val[w] : s_val[w];
        prev_row = s_row[w];
    }
    int ex_row = __shfl_up_sync(FULL, row, 1);  // what the threads before this one carry
    V ex_val = __shfl_up_sync(FULL, incl, 1);
    if (lane == 0) {
        ex_row = prev_row;
        ex_val = prev_val;
    } else if (ex_row == prev_row) {
        ex_val = prev_val + ex_val;
    }
    if (ie > is) y[r0 + is] = (ex_row == r0 + is ? ex_val : V(0)) + head;
    if (threadIdx.x == blockDim.x - 1) carry[b] = prev_row == row ? prev_val + incl : incl;  // row == r1
}

// y[tile_row[b+1]] += carry[b] for every tile b whose last row goes on (tile_row[b+1] < m).
template <typename V>
__global__ void __launch_bounds__(256)
merge_path_fixup(const int m, const int n_tiles, const int* __restrict__ tile_row, const V* __restrict__ carry,
                 V* __restrict__ y)
{
    using namespace merge_path_detail;
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    const int row = b < n_tiles ? tile_row[b + 1] : m;
    const V v = warp_scan_by_row(row, b < n_tiles ? carry[b] : V(0), lane);
    const int next = __shfl_down_sync(FULL, row, 1);
    if (row < m && (lane == 31 || next != row)) atomicAdd(&y[row], v);
}
