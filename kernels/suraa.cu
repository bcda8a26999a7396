// suraa: SURAA (Muhammed et al., 2019). Rows are visited in the order `perm`
// (npr descending) and split into three groups, each with its own kernel:
//   G3 (short rows)  suraa_scalar  one thread per row;
//   G2 (long rows)   suraa_vector  a group of `group` threads per row (a multiple
//                                  of 32), one launch per run of segments, on streams;
//   G1 (longest)     suraa_parent  one parent thread per row, each launching a
//                                  one-block child grid (dynamic parallelism) that
//                                  reduces the row and writes its own y element;
//                    or suraa_vector with one block per row (g1_mode "block").
// y is written in the original row order: y[perm[pos]].
// Tunables are kernel arguments, so one compilation per value type serves every
// config; instantiated as suraa_scalar<T>, suraa_vector<T>, suraa_parent<T>.
// Build with -rdc=true (relocatable device code, linked with cudadevrt).

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

// Thread t of `group` threads sums the row's entries t, t + group, t + 2*group, ...
template <typename T>
__device__ __forceinline__ T suraa_row_partial(const int begin, const int end, const int t, const int group,
                                               const int* __restrict__ indices,
                                               const T* __restrict__ data,
                                               const T* __restrict__ x)
{
    T sum = 0;
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
                             const int* __restrict__ indptr,
                             const int* __restrict__ indices,
                             const T* __restrict__ data,
                             const T* __restrict__ x,
                             T* __restrict__ y)
{
    const long long pos = (long long)begin + (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= end) return;
    const int row = perm[pos];
    y[row] = suraa_row_partial(indptr[row], indptr[row + 1], 0, 1, indices, data, x);
}

// G2 (and G1 in "block" mode): `group` threads per row, blockDim.x / group rows
// per block, over the sorted positions [begin, end).
template <typename T>
__global__ void suraa_vector(const int begin, const int end, const int group,
                             const int* __restrict__ perm,
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
        sum = suraa_row_partial(indptr[row], indptr[row + 1], t, group, indices, data, x);
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
                             const int* __restrict__ indptr,
                             const int* __restrict__ indices,
                             const T* __restrict__ data,
                             const T* __restrict__ x,
                             T* __restrict__ y)
{
    const long long pos = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= end) return;
    const int row = perm[pos];
    const int begin = indptr[row];
    const int stop = indptr[row + 1];
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
