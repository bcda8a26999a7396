// suraa: SURAA (Muhammed et al., 2019). Rows are visited in the order `perm`
// (sorted by length) and y is written in the original row order: y[perm[pos]].
//
// grouping "segment" (the paper), three groups, each with its own kernel:
//   G3 (short rows)  suraa_scalar  one thread per row;
//   G2 (long rows)   suraa_vector  a group of `group` threads per row (a multiple
//                                  of 32), one launch per run of segments, on streams;
//   G1 (longest)     suraa_parent  one parent thread per row, each launching a
//                                  one-block child grid (dynamic parallelism) that
//                                  reduces the row and writes its own y element;
//                    or suraa_vector with one block per row (g1_mode "block").
//
// grouping "row": every row in ONE launch of suraa_rows<T, PARENT>, driven by a
// small table of bins (int4: first position, end position, threads per row,
// first block). The bins are contiguous runs of the sorted order whose rows get
// the same power-of-two count of threads `t`; with `width` = blockDim.x:
//   t <= 32        width / t rows per block, a sub-warp shuffle reduction;
//   32 < t <= width width / t rows per block, warp sums in shared memory;
//   t > width      t / width blocks per row ("pieces"), each summing a contiguous
//                  chunk of the row; the last piece to finish (atomicInc ticket)
//                  adds the pieces' partials in a fixed order and writes y, so
//                  the result is deterministic and needs no zeroed y.
// suraa_rows<T, true> (g1_mode "dynamic") starts with `parent_blocks` blocks of
// parent threads, one per G1 row (the positions below `first_pos`), each
// launching that row's blocks as a child grid suraa_row_child into the
// fire-and-forget stream; the host grid then skips the G1 rows' blocks.
//
// Layout: every kernel takes `sorted`. 0: the rows are read where they are in the
// matrix (row perm[pos]); 1 (layout "sorted"): the matrix arrays passed are a copy
// with the rows in the sorted order, so the row at sorted position pos is read at
// row pos of the copy (contiguous reads for a run of positions), and y is still
// written at perm[pos].
//
// Tunables are kernel arguments (and the PARENT switch a template argument), so
// one compilation per value type serves every config. Build with -rdc=true
// (relocatable device code, linked with cudadevrt).

#ifndef cudaStreamFireAndForget
#define cudaStreamFireAndForget ((cudaStream_t)0x4)
#endif

// Sum of v over the 32 lanes of a warp, valid in lane 0.
template <typename T>
__device__ __forceinline__ T suraa_warp_sum(T v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset);
    }
    return v;
}

// [begin, end) of the row at sorted position pos (row = perm[pos]) in the arrays passed (see Layout).
__device__ __forceinline__ int2 suraa_extent(const int* __restrict__ indptr, const int sorted,
                                             const long long pos, const int row)
{
    const long long r = sorted ? pos : (long long)row;
    return make_int2(indptr[r], indptr[r + 1]);
}

// Thread t of `group` threads sums the row's entries t, t + group, t + 2*group, ...
template <typename T>
__device__ __forceinline__ T suraa_row_partial(const int begin, const int end, const int t, const int group,
                                               const int* __restrict__ indices,
                                               const T* __restrict__ data,
                                               const T* __restrict__ x)
{
    T sum = 0;
#pragma unroll 4
    for (int j = begin + t; j < end; j += group) {
        sum += data[j] * __ldg(&x[indices[j]]);
    }
    return sum;
}

// Sum of `sum` over each run of `group` consecutive threads (group a multiple of
// 32 dividing blockDim.x <= 1024): warp shuffles, then the groups' warp sums in
// shared memory, reduced by each group's first warp. Valid in the group's first
// thread. Every thread of the block must call it (it has a __syncthreads()).
template <typename T>
__device__ __forceinline__ T suraa_group_sum(T sum, const int group)
{
    __shared__ T warp_sums[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    sum = suraa_warp_sum(sum);
    if (group == 32) return sum;  // uniform over the block: group is a kernel argument
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    const int warps_per_group = group >> 5;
    const int first_warp = (warp / warps_per_group) * warps_per_group;
    if (warp == first_warp) {
        sum = lane < warps_per_group ? warp_sums[first_warp + lane] : T(0);
        sum = suraa_warp_sum(sum);
    }
    return sum;
}

// G3: one thread per row, over the sorted positions [begin, end).
template <typename T>
__global__ void suraa_scalar(const int begin, const int end,
                             const int* __restrict__ perm,
                             const int sorted,
                             const int* __restrict__ indptr,
                             const int* __restrict__ indices,
                             const T* __restrict__ data,
                             const T* __restrict__ x,
                             T* __restrict__ y)
{
    const long long pos = (long long)begin + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= end) return;
    const int row = perm[pos];
    const int2 e = suraa_extent(indptr, sorted, pos, row);
    y[row] = suraa_row_partial(e.x, e.y, 0, 1, indices, data, x);
}

// G2 (and G1 in "block" mode): `group` threads per row, blockDim.x / group rows
// per block, over the sorted positions [begin, end).
template <typename T>
__global__ void suraa_vector(const int begin, const int end, const int group,
                             const int* __restrict__ perm,
                             const int sorted,
                             const int* __restrict__ indptr,
                             const int* __restrict__ indices,
                             const T* __restrict__ data,
                             const T* __restrict__ x,
                             T* __restrict__ y)
{
    const int rows_per_block = blockDim.x / group;
    const int g = threadIdx.x / group;
    const int t = threadIdx.x - g * group;
    const long long pos = (long long)begin + (long long)blockIdx.x * rows_per_block + g;
    const bool active = pos < end;
    int row = 0;
    T sum = 0;
    if (active) {
        row = perm[pos];
        const int2 e = suraa_extent(indptr, sorted, pos, row);
        sum = suraa_row_partial(e.x, e.y, t, group, indices, data, x);
    }
    sum = suraa_group_sum(sum, group);  // all threads, active or not
    if (active && t == 0) y[row] = sum;
}

// G1 child: one block of blockDim.x threads (a multiple of 32) reduces one row.
template <typename T>
__global__ void suraa_child(const int row, const int begin, const int end,
                            const int* __restrict__ indices,
                            const T* __restrict__ data,
                            const T* __restrict__ x,
                            T* __restrict__ y)
{
    T sum = suraa_row_partial(begin, end, (int)threadIdx.x, (int)blockDim.x, indices, data, x);
    sum = suraa_group_sum(sum, (int)blockDim.x);
    if (threadIdx.x == 0) y[row] = sum;
}

// G1 parent: thread `pos` in [0, end) launches the child grid of row perm[pos]
// with min(cap, 32 * ceil(npr / 32)) threads into the fire-and-forget stream.
// CUDA 12+ has no device-side synchronisation: the child writes y itself, and the
// parent grid completes (for the host's stream) only when its children have.
// Should a launch be refused (e.g. the pending-launch pool is full), the parent
// thread sums the row itself, so y is right either way, and counts the refusal in
// *fallbacks (never reset here: the host reads it to see whether children ran).
template <typename T>
__global__ void suraa_parent(const int end, const int cap,
                             unsigned int* __restrict__ fallbacks,
                             const int* __restrict__ perm,
                             const int sorted,
                             const int* __restrict__ indptr,
                             const int* __restrict__ indices,
                             const T* __restrict__ data,
                             const T* __restrict__ x,
                             T* __restrict__ y)
{
    const long long pos = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= end) return;
    const int row = perm[pos];
    const int2 e = suraa_extent(indptr, sorted, pos, row);
    const int begin = e.x;
    const int stop = e.y;
    const int npr = stop - begin;
    if (npr == 0) {
        y[row] = T(0);
        return;
    }
    const int threads = npr >= cap ? cap : ((npr + 31) & ~31);
    suraa_child<T><<<1, threads, 0, cudaStreamFireAndForget>>>(row, begin, stop, indices, data, x, y);
    if (cudaGetLastError() != cudaSuccess) {
        y[row] = suraa_row_partial(begin, stop, 0, 1, indices, data, x);
        atomicAdd(fallbacks, 1u);
    }
}

// ---------------------------------------------------------------------------------
// grouping "row"

// Sum of v over each run of `width` consecutive lanes (a power of two <= 32), valid
// in the run's first lane. Every lane of the warp must call it (full-mask shuffles).
template <typename T>
__device__ __forceinline__ T suraa_subwarp_sum(T v, const int width)
{
    for (int offset = width >> 1; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffffu, v, offset, width);
    }
    return v;
}

// The whole block (blockDim.x a multiple of 32) sums piece `piece` of `pieces`
// contiguous chunks of the row at sorted position `pos`. One piece: writes y. More:
// stores its partial in partials[slot + piece]; the piece that draws the last ticket
// of counters[pos] (atomicInc wraps it back to 0 for the next run) adds the partials
// in order 0..pieces-1 and writes y. Every thread of the block must call it.
template <typename T>
__device__ __forceinline__ void suraa_row_piece(const int pos, const int row, const int begin, const int end,
                                                const int piece, const int pieces, const int slot,
                                                unsigned int* __restrict__ counters,
                                                T* __restrict__ partials,
                                                const int* __restrict__ indices,
                                                const T* __restrict__ data,
                                                const T* __restrict__ x,
                                                T* __restrict__ y)
{
    __shared__ unsigned int ticket;
    // In unsigned 32-bit: npr < 2^31 and piece * chunk < npr + chunk < 2^32.
    const unsigned int npr = (unsigned int)(end - begin);
    const unsigned int chunk = (npr + (unsigned int)pieces - 1u) / (unsigned int)pieces;
    const unsigned int skip = (unsigned int)piece * chunk;
    const int lo = begin + (int)(skip < npr ? skip : npr);
    const int hi = begin + (int)(skip + chunk < npr ? skip + chunk : npr);
    T sum = suraa_row_partial(lo, hi, (int)threadIdx.x, (int)blockDim.x, indices, data, x);
    sum = suraa_group_sum(sum, (int)blockDim.x);
    if (pieces == 1) {
        if (threadIdx.x == 0) y[row] = sum;
        return;
    }
    if (threadIdx.x == 0) {
        partials[slot + piece] = sum;
        __threadfence();  // the partial is visible device-wide before the ticket is drawn
        ticket = atomicInc(&counters[pos], (unsigned int)(pieces - 1));
    }
    __syncthreads();  // also orders the first suraa_group_sum's shared reads before the second's writes
    if (ticket != (unsigned int)(pieces - 1)) return;  // uniform over the block
    __threadfence();
    T total = 0;
    for (int k = threadIdx.x; k < pieces; k += blockDim.x) {
        total += __ldcg(&partials[slot + k]);  // L2, never a stale L1 line
    }
    total = suraa_group_sum(total, (int)blockDim.x);
    if (threadIdx.x == 0) y[row] = total;
}

// G1 child ("row", g1_mode "dynamic"): the row's pieces, one block each.
template <typename T>
__global__ void suraa_row_child(const int pos, const int row, const int begin, const int end,
                                const int pieces, const int slot,
                                unsigned int* __restrict__ counters,
                                T* __restrict__ partials,
                                const int* __restrict__ indices,
                                const T* __restrict__ data,
                                const T* __restrict__ x,
                                T* __restrict__ y)
{
    suraa_row_piece(pos, row, begin, end, (int)blockIdx.x, pieces, slot, counters, partials, indices, data, x, y);
}

// G1 parent thread for sorted position blockIdx.x * blockDim.x + threadIdx.x < g1_end:
// launches the row's blocks (the same geometry as in the host grid: `pieces` blocks of
// blockDim.x threads for t > blockDim.x, else one block of t threads) into the
// fire-and-forget stream. A refused launch is summed by the thread itself (counted
// in *fallbacks, never reset here).
template <typename T>
__device__ __forceinline__ void suraa_rows_parent(const int4* __restrict__ bins, const int n_bins,
                                                  const int g1_end,
                                                  unsigned int* __restrict__ counters,
                                                  T* __restrict__ partials,
                                                  unsigned int* __restrict__ fallbacks,
                                                  const int* __restrict__ perm,
                                                  const int sorted,
                                                  const int* __restrict__ indptr,
                                                  const int* __restrict__ indices,
                                                  const T* __restrict__ data,
                                                  const T* __restrict__ x,
                                                  T* __restrict__ y)
{
    const long long pos_ll = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos_ll >= g1_end) return;
    const int pos = (int)pos_ll;
    int k = 0;
    while (k + 1 < n_bins && __ldg(&bins[k]).y <= pos) ++k;  // G1 lies in the leading bins
    const int4 bin = __ldg(&bins[k]);
    const int width = (int)blockDim.x;
    const int pieces = bin.z > width ? bin.z / width : 1;
    const int child_width = bin.z > width ? width : bin.z;
    const int slot = bin.w + (pos - bin.x) * pieces;
    const int row = perm[pos];
    const int2 e = suraa_extent(indptr, sorted, pos, row);
    const int begin = e.x;
    const int end = e.y;
    suraa_row_child<T><<<pieces, child_width, 0, cudaStreamFireAndForget>>>(
        pos, row, begin, end, pieces, slot, counters, partials, indices, data, x, y);
    if (cudaGetLastError() != cudaSuccess) {
        y[row] = suraa_row_partial(begin, end, 0, 1, indices, data, x);
        atomicAdd(fallbacks, 1u);
    }
}

// Every row of grouping "row" in one launch (see the top of the file). Block
// blockIdx.x >= parent_blocks is block b = blockIdx.x - parent_blocks + skip_blocks
// of the bins' block layout; rows at positions below first_pos are left to the
// children (g1_mode "dynamic"; first_pos = skip_blocks = parent_blocks = 0 otherwise).
template <typename T, bool PARENT>
__global__ void __launch_bounds__(512, 4) suraa_rows(const int4* __restrict__ bins, const int n_bins,
                           const int parent_blocks, const int first_pos, const int skip_blocks,
                           unsigned int* __restrict__ counters,
                           T* __restrict__ partials,
                           unsigned int* __restrict__ fallbacks,
                           const int* __restrict__ perm,
                           const int sorted,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    if constexpr (PARENT) {
        if ((int)blockIdx.x < parent_blocks) {
            suraa_rows_parent(bins, n_bins, first_pos, counters, partials, fallbacks,
                              perm, sorted, indptr, indices, data, x, y);
            return;
        }
    }
    const int width = (int)blockDim.x;
    const int b = (int)blockIdx.x - parent_blocks + skip_blocks;
    int k = n_bins - 1;  // most blocks belong to the last (short-row) bins: search from the end
    while (k > 0 && __ldg(&bins[k]).w > b) --k;
    const int4 bin = __ldg(&bins[k]);
    const int threads = bin.z;
    if (threads > width) {  // several blocks per row
        const int pieces = threads / width;
        const int rel = b - bin.w;
        const int pos = bin.x + rel / pieces;
        if (pos >= bin.y || pos < first_pos) return;  // uniform over the block
        const int piece = rel - (pos - bin.x) * pieces;
        const int row = perm[pos];
        const int2 e = suraa_extent(indptr, sorted, pos, row);
        suraa_row_piece(pos, row, e.x, e.y, piece, pieces, b - piece,
                        counters, partials, indices, data, x, y);
        return;
    }
    const int rows_per_block = width / threads;
    const int g = (int)threadIdx.x / threads;
    const int t = (int)threadIdx.x - g * threads;
    const long long pos = (long long)bin.x + (long long)(b - bin.w) * rows_per_block + g;
    const bool active = pos < bin.y && pos >= first_pos;
    int row = 0;
    T sum = 0;
    if (active) {
        row = perm[pos];
        const int2 e = suraa_extent(indptr, sorted, pos, row);
        sum = suraa_row_partial(e.x, e.y, t, threads, indices, data, x);
    }
    if (threads <= 32) {  // uniform over the block: one bin per block
        sum = suraa_subwarp_sum(sum, threads);
    } else {
        sum = suraa_group_sum(sum, threads);
    }
    if (active && t == 0) y[row] = sum;
}
