// csr5: CSR5-style tiles (Liu & Vinter, ICS 2015), written for this project.
//
// The nonzeros are cut into tiles of OMEGA x SIGMA entries (OMEGA = 32, a warp): lane l of tile t holds
// the SIGMA consecutive entries first + l * SIGMA + k (first = t * OMEGA * SIGMA, k = 0 .. SIGMA-1), stored
// transposed at first + k * OMEGA + l, so that each of a lane's SIGMA loads is coalesced over the warp.
// Prepared once (kernels/csr5.py, on the GPU): the transposed copies of the values and columns of the
// n_tiles full tiles; flags[t * OMEGA + l], bit k set where the lane's k-th entry starts a row;
// tile_ptr[t], the row of the tile's first entry (tile_ptr[n_tiles]: of the first entry after the full
// tiles, m when there is none); dirty[t], set where rows tile_ptr[t]+1 .. tile_ptr[t+1]-1 (from row 0 for
// tile 0) hold an empty row.
//
// Who writes a row: the tile holding the row's first entry writes its share of the row (y[r] =); tile t + 1
// (the tail for t + 1 = n_tiles), where it starts inside a row, hands its share of it (its head: the entries
// before its first row start) to carry[t], and merge_path_fixup (merge_path.cu) adds
// y[tile_ptr[t+1]] += carry[t] afterwards. An empty row is written 0 by the tile whose rows
// tile_ptr[t]+1 .. tile_ptr[t+1]-1 hold it (a dirty one; from row 0 for tile 0), or by the tail.
//
//   csr5_spmv<V, SIGMA, NARROW> (a run): a warp a tile, blocks of blockDim.x / 32 tiles;
//     1. the lane's SIGMA values and columns (streaming hint __ldcs: read once), then its gathers of x
//        (__ldg); its flag word;
//     2. the row of the lane's first row start: in a clean tile, tile_ptr[t] + the row starts before it in
//        the tile (an exclusive warp scan of __popc of the flags; the tile's first entry, where it starts a
//        row, is row tile_ptr[t] itself); in a dirty tile, by a binary search of the row pointer between
//        tile_ptr[t] and tile_ptr[t+1], for each row start;
//     3. the lane walks its entries: a row start closes the segment before it (a segment begun in the lane
//        is whole: written to y; the lane's first, its head, belongs to a row begun in an earlier lane);
//     4. heads handed left: a segmented suffix sum of the heads over the lanes, stopping at the first lane
//        that starts a row, adds to each lane's last segment what the lanes after it hold of that row, which
//        the lane then writes; lane 0's sum is the tile's head, written to carry[t-1] (0 where the tile's
//        first entry starts a row; tile 0's always does);
//     5. a dirty tile writes 0 to the empty rows it owns.
//   The tail (blocks tile_blocks ..): the entries after the last full tile (fewer than a tile), a thread a
//     row from tail_row (row 0 without full tiles) to m-1: a row begun in the tail is written, the share of
//     the row begun before it goes to carry[n_tiles-1].
//
// 32-bit indices: the caller checks that rows, columns and nonzeros fit. NARROW: a tile whose columns span
// fewer than 65,536 (tile_base[t] >= 0) reads them as 16-bit offsets from tile_base[t] (narrow.cu writes
// them over the transposed columns, a tile a segment). Instantiated per value type, SIGMA and columns:
// csr5_spmv<double, 16, true>.

#ifndef CSR5_MAX_THREADS
#define CSR5_MAX_THREADS 512
#endif

namespace csr5_detail {

constexpr unsigned FULL = 0xffffffffu;
constexpr int OMEGA = 32;

// The sum of v over the lanes before this one.
__device__ __forceinline__ int exclusive_sum(const int v, const int lane)
{
    int incl = v;
#pragma unroll
    for (int o = 1; o < OMEGA; o <<= 1) {
        const int u = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += u;
    }
    return incl - v;
}

// v summed over this lane and those after it up to the first lane whose `stop` is set (that one included;
// to lane 31 where none is): what lanes l .. hand to the segment open at the end of lane l - 1.
template <typename V>
__device__ __forceinline__ V suffix_sum_to_stop(V v, bool stop, const int lane)
{
#pragma unroll
    for (int o = 1; o < OMEGA; o <<= 1) {
        const V u = __shfl_down_sync(FULL, v, o);
        const int s = __shfl_down_sync(FULL, (int)stop, o);
        if (lane + o < OMEGA && !stop) {
            v += u;
            stop = s != 0;
        }
    }
    return v;
}

// The last row r in [lo, hi] with indptr[r] <= j: the row of entry j (indptr[lo] <= j).
__device__ __forceinline__ int row_of(const int* __restrict__ indptr, int lo, int hi, const int j)
{
    while (lo < hi) {
        const int mid = lo + ((hi - lo + 1) >> 1);
        if (__ldg(&indptr[mid]) <= j) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// prod[k] = values[j] * x[column(j)] for the lane's entries j = first + k * OMEGA + lane (transposed): every
// load of values and columns issued before the first gather of x.
template <typename V, int SIGMA, typename Column>
__device__ __forceinline__ void load_products(V* prod, const int first, const int lane,
                                              const V* __restrict__ values, const V* __restrict__ x,
                                              const Column column)
{
    int col[SIGMA];
    V val[SIGMA];
#pragma unroll
    for (int k = 0; k < SIGMA; ++k) {
        const int j = first + k * OMEGA + lane;
        col[k] = column(j);
        val[k] = __ldcs(&values[j]);
    }
#pragma unroll
    for (int k = 0; k < SIGMA; ++k) prod[k] = val[k] * __ldg(&x[col[k]]);
}

// The tail: row tail_row + r_local summed over its entries from `start` on, written to y where it begins
// there, else (the row begun in a full tile) handed to carry[n_tiles-1].
template <typename V>
__device__ __forceinline__ void tail_row_sum(const long long r_local, const int start, const int tail_row,
                                             const int m, const int n_tiles, const int* __restrict__ indptr,
                                             const int* __restrict__ indices, const V* __restrict__ data,
                                             const V* __restrict__ x, V* __restrict__ y, V* __restrict__ carry)
{
    const long long r = tail_row + r_local;
    if (r >= m) return;
    const int lo = __ldg(&indptr[r]);
    const int hi = __ldg(&indptr[r + 1]);
    V sum = 0;
    for (int j = max(lo, start); j < hi; ++j) sum += __ldcs(&data[j]) * __ldg(&x[__ldcs(&indices[j])]);
    if (lo >= start) {
        y[r] = sum;
    } else {
        carry[n_tiles - 1] = sum;  // start > lo >= 0: n_tiles >= 1
    }
}

}  // namespace csr5_detail

// Blocks 0 .. tile_blocks-1: a warp a full tile (blockDim.x a multiple of 32, at most CSR5_MAX_THREADS);
// the blocks after them: the tail, a thread a row from tail_row.
template <typename V, int SIGMA, bool NARROW>
__global__ void __launch_bounds__(CSR5_MAX_THREADS)
csr5_spmv(const int n_tiles,
          const int tile_blocks,
          const int tail_row,
          const int m,
          const int* __restrict__ indptr,
          const int* __restrict__ indices,
          const V* __restrict__ data,
          const int* __restrict__ columns,
          const int* __restrict__ tile_base,
          const unsigned short* __restrict__ offsets,
          const V* __restrict__ values,
          const unsigned* __restrict__ flags,
          const int* __restrict__ tile_ptr,
          const unsigned char* __restrict__ dirty,
          const V* __restrict__ x,
          V* __restrict__ y,
          V* __restrict__ carry)
{
    using namespace csr5_detail;
    if ((int)blockIdx.x >= tile_blocks) {
        tail_row_sum<V>((long long)(blockIdx.x - tile_blocks) * blockDim.x + threadIdx.x, n_tiles * OMEGA * SIGMA,
                        tail_row, m, n_tiles, indptr, indices, data, x, y, carry);
        return;
    }
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / OMEGA;
    if (warp >= n_tiles) return;  // a whole warp
    const int t = (int)warp;
    const int lane = threadIdx.x & (OMEGA - 1);
    const int first = t * OMEGA * SIGMA;  // < nnz < 2^31

    // 1. the lane's products (the tile's kind of column is the warp's: no branch splits the loads)
    V prod[SIGMA];
    const int lowest = NARROW ? __ldg(&tile_base[t]) : -1;
    if (lowest >= 0) {
        load_products<V, SIGMA>(prod, first, lane, values, x, [=](int j) { return lowest + (int)__ldcs(&offsets[j]); });
    } else {
        load_products<V, SIGMA>(prod, first, lane, values, x, [=](int j) { return __ldcs(&columns[j]); });
    }
    const unsigned bits = __ldcs(&flags[(long long)t * OMEGA + lane]);
    const int row0 = __ldg(&tile_ptr[t]);
    const int row1 = __ldg(&tile_ptr[t + 1]);
    const bool is_dirty = __ldg(&dirty[t]) != 0;

    // 2. the row of the lane's next row start in a clean tile
    const int starts_at_first = __shfl_sync(FULL, (int)(bits & 1u), 0);
    int next = row0 + 1 - starts_at_first + exclusive_sum(__popc(bits), lane);

    // 3. the walk: segments begun in the lane and closed in it are written
    V acc = 0;
    V head = 0;
    bool started = false;
    int row = 0;
#pragma unroll
    for (int k = 0; k < SIGMA; ++k) {
        if ((bits >> k) & 1u) {
            if (started) {
                y[row] = acc;
            } else {
                head = acc;
            }
            row = is_dirty ? row_of(indptr, row0, row1, first + lane * SIGMA + k) : next;
            ++next;
            started = true;
            acc = V(0);
        }
        acc += prod[k];
    }

    // 4. heads handed left: the lane's last segment gets what the lanes after it hold of its row
    const V handed = suffix_sum_to_stop(started ? head : acc, started, lane);
    const V after = __shfl_down_sync(FULL, handed, 1);
    if (started) y[row] = acc + (lane < OMEGA - 1 ? after : V(0));
    if (lane == 0 && t > 0) carry[t - 1] = handed;

    // 5. the empty rows of a dirty tile
    if (is_dirty) {
        for (int r = (t == 0 ? 0 : row0 + 1) + lane; r < row1; r += OMEGA) {
            if (__ldg(&indptr[r]) == __ldg(&indptr[r + 1])) y[r] = V(0);
        }
    }
}

// Preparation (kernels/csr5.py, once a matrix): three launches, no sort, no search but tile_ptr's.
//
// csr5_rows: a thread a row. A row that is not empty and begins at s inside the full tiles sets bit s % sigma
// of flags[s / sigma] (the word of the lane holding s; atomicOr: a lane's rows share its word). An empty row
// beginning at s marks dirty the tile t with t * tile < s <= (t + 1) * tile (tile 0 from s = 0): its row lies
// strictly between tile_ptr[t] and tile_ptr[t+1] (from row 0 for tile 0). flags and dirty start zeroed.
__global__ void csr5_rows(const int m, const int n_tiles, const int sigma, const int* __restrict__ indptr,
                          unsigned* __restrict__ flags, unsigned char* __restrict__ dirty)
{
    const long long r = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= m) return;
    const long long s = indptr[r];
    const long long tile = (long long)sigma * csr5_detail::OMEGA;
    if (indptr[r + 1] > s) {
        if (s < n_tiles * tile) atomicOr(&flags[s / sigma], 1u << (unsigned)(s % sigma));
    } else {
        const long long t = s == 0 ? 0 : (s - 1) / tile;
        if (t < n_tiles) dirty[t] = 1;
    }
}

// csr5_tiles: a thread a tile and one for the entries after the full tiles (t = n_tiles): tile_ptr[t], the
// row of entry t * tile (the last row whose start is at or before it: m past the last entry); where that row
// began before it (tile t, or the tail, starts inside a row), fixup[0] = 1 (zeroed first).
__global__ void csr5_tiles(const int m, const int n_tiles, const int sigma, const int* __restrict__ indptr,
                           int* __restrict__ tile_ptr, int* __restrict__ fixup)
{
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t > n_tiles) return;
    const int j = (int)(t * sigma * csr5_detail::OMEGA);  // at most nnz < 2^31
    const int row = csr5_detail::row_of(indptr, 0, m, j);
    tile_ptr[t] = row;
    if (t > 0 && indptr[row] < j) fixup[0] = 1;
}

// csr5_transpose<V>: a thread an entry of the full tiles (n of them), written transposed: destination
// t * tile + k * OMEGA + l holds entry t * tile + l * sigma + k.
template <typename V>
__global__ void csr5_transpose(const long long n, const int sigma, const int* __restrict__ indices,
                               const V* __restrict__ data, int* __restrict__ columns, V* __restrict__ values)
{
    const long long d = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= n) return;
    const long long tile = (long long)sigma * csr5_detail::OMEGA;
    const long long t = d / tile, within = d % tile;
    const long long src = t * tile + (within % csr5_detail::OMEGA) * sigma + within / csr5_detail::OMEGA;
    columns[d] = indices[src];
    values[d] = data[src];
}
