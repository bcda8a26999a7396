// spmspv: the sparse mode of SpMSpV (after Hong et al., 2018): y = A·x for a sparse x,
// touching only the columns of A (in CSC) that x's nonzeros select.
//
// The k nonzeros of x select k columns of A; offsets[e] .. offsets[e+1] are the
// positions of column x_idx[e]'s entries in the list of all "active" products, so
// product p belongs to the x entry e with offsets[e] <= p < offsets[e+1] (a binary
// search), and is A[row, c] * x_val[e] with row = row_idx[col_ptr[c] + p - offsets[e]].
// One thread per product: the work is balanced by nonzeros whatever the column lengths
// (a hub column of a power-law graph is spread over many threads).
//
// Two ways to merge the products into y, picked by the host (kernels/spmspv.py):
//   spmspv_spa:    a sparse accumulator. acc (dense, length m, all zero between calls)
//                  receives atomicAdds; mark[row] flips 0 -> 1 the first time a row is
//                  touched, and that thread appends the row to `touched`. spmspv_collect_small
//                  (up to SMALL_SORT rows: one block sorts them in shared memory) or the host's
//                  sort and spmspv_collect then read acc at those rows and zero acc and mark there
//                  again, so every call costs O(active products), never O(m).
//
// Per-call launches are few on purpose (a BFS step on a small frontier costs a few microseconds
// of GPU time, so launches and host waits are most of it): for up to SCAN_BLOCK x entries one
// block computes the offsets (spmspv_offsets), and the host waits once, for y's size.
//   spmspv_gather: writes each product's row and value; the host sorts them by row and
//                  sums equal rows.

template <typename T>
__device__ __forceinline__ void product(const long long p, const int k, const long long* __restrict__ offsets,
                                        const int* __restrict__ x_idx, const T* __restrict__ x_val,
                                        const long long* __restrict__ col_ptr, const int* __restrict__ row_idx,
                                        const T* __restrict__ vals, int& row, T& value)
{
    int lo = 0, hi = k - 1;  // the last e with offsets[e] <= p
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (__ldg(&offsets[mid]) <= p) lo = mid; else hi = mid - 1;
    }
    const long long j = __ldg(&col_ptr[__ldg(&x_idx[lo])]) + (p - __ldg(&offsets[lo]));
    row = __ldg(&row_idx[j]);
    value = __ldg(&vals[j]) * __ldg(&x_val[lo]);
}

template <typename T>
__global__ void spmspv_spa(const int k, const long long* __restrict__ offsets,
                           const int* __restrict__ x_idx, const T* __restrict__ x_val,
                           const long long* __restrict__ col_ptr, const int* __restrict__ row_idx,
                           const T* __restrict__ vals, T* __restrict__ acc, int* __restrict__ mark,
                           int* __restrict__ touched, int* __restrict__ n_touched)
{
    const long long total = offsets[k];  // read here, so the host need not wait for the prefix sum
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < total; p += stride) {
        int row;
        T value;
        product(p, k, offsets, x_idx, x_val, col_ptr, row_idx, vals, row, value);
        atomicAdd(&acc[row], value);
        if (atomicExch(&mark[row], 1) == 0) touched[atomicAdd(n_touched, 1)] = row;
    }
}

// The accumulator's rows (sorted by the host) read into y and zeroed again for the next call;
// zeros counts the sums that came out exactly 0 (cancellation), so the host compacts only then.
template <typename T>
__global__ void spmspv_collect(const int n, const int* __restrict__ rows, T* __restrict__ acc,
                               int* __restrict__ mark, T* __restrict__ out, int* __restrict__ n_touched,
                               int* __restrict__ zeros)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) *n_touched = 0;
    if (i >= n) return;
    const int r = rows[i];
    const T v = acc[r];
    out[i] = v;
    acc[r] = T(0);
    mark[r] = 0;
    if (v == T(0)) atomicAdd(zeros, 1);
}

// counts[0] = 0, counts[e + 1] = entries of column x_idx[e] (a scan follows on the host).
__global__ void spmspv_counts(const int k, const int* __restrict__ x_idx, const long long* __restrict__ col_ptr,
                              long long* __restrict__ counts)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e == 0) counts[0] = 0;
    if (e < k) counts[e + 1] = col_ptr[x_idx[e] + 1] - col_ptr[x_idx[e]];
}

// The same counts scanned by one block (blockDim.x a multiple of 32, at most 1024), chunk by chunk:
// offsets[0] = 0, offsets[e + 1] = offsets[e] + entries of column x_idx[e]. Also zeroes the call's
// counters (rows touched, sums cancelled to zero) before spmspv_spa runs.
__global__ void spmspv_offsets(const int k, const int* __restrict__ x_idx, const long long* __restrict__ col_ptr,
                               long long* __restrict__ offsets, int* __restrict__ counters)
{
    __shared__ long long warp_sums[32];
    __shared__ long long carry;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    if (t == 0) {
        carry = 0;
        offsets[0] = 0;
        counters[0] = 0;
        counters[1] = 0;
    }
    __syncthreads();
    for (int base = 0; base < k; base += blockDim.x) {
        const int e = base + t;
        long long v = 0;
        if (e < k) {
            const int c = x_idx[e];
            v = col_ptr[c + 1] - col_ptr[c];
        }
        for (int d = 1; d < 32; d <<= 1) {  // inclusive scan in the warp
            const long long u = __shfl_up_sync(0xffffffffu, v, d);
            if (lane >= d) v += u;
        }
        if (lane == 31) warp_sums[warp] = v;
        __syncthreads();
        if (warp == 0) {  // inclusive scan of the warps' sums
            long long w = lane < warps ? warp_sums[lane] : 0;
            for (int d = 1; d < 32; d <<= 1) {
                const long long u = __shfl_up_sync(0xffffffffu, w, d);
                if (lane >= d) w += u;
            }
            warp_sums[lane] = w;
        }
        __syncthreads();
        const long long mine = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + v;
        if (e < k) offsets[e + 1] = mine;
        __syncthreads();  // every thread has read carry
        if (t == blockDim.x - 1) carry = mine;
        __syncthreads();
    }
}

#define SMALL_SORT 4096

// spmspv_collect for up to SMALL_SORT touched rows, in one block: the rows bitonic-sorted in shared memory,
// then read from acc into rows_out / out and zeroed again. counters[0] (the rows touched) stays for the host
// to read; with more rows this does nothing and the host sorts instead.
template <typename T>
__global__ void spmspv_collect_small(const int* __restrict__ touched, T* __restrict__ acc, int* __restrict__ mark,
                                     int* __restrict__ rows_out, T* __restrict__ out, int* __restrict__ counters)
{
    __shared__ int keys[SMALL_SORT];
    const int n = counters[0];
    if (n > SMALL_SORT) return;
    int size = 1;
    while (size < n) size <<= 1;
    for (int i = threadIdx.x; i < size; i += blockDim.x) keys[i] = i < n ? touched[i] : 0x7fffffff;
    __syncthreads();
    for (int span = 2; span <= size; span <<= 1) {
        for (int j = span >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < size; i += blockDim.x) {
                const int partner = i ^ j;
                if (partner > i) {
                    const int a = keys[i], b = keys[partner];
                    if ((a > b) == ((i & span) == 0)) {
                        keys[i] = b;
                        keys[partner] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int r = keys[i];
        const T v = acc[r];
        rows_out[i] = r;
        out[i] = v;
        acc[r] = T(0);
        mark[r] = 0;
        if (v == T(0)) atomicAdd(&counters[1], 1);
    }
}

// x[idx[e]] = val[e], or 0 with clear: the dense mode's zero-filled x, at O(nnz(x)).
template <typename T>
__global__ void spmspv_scatter(const int k, const int* __restrict__ idx, const T* __restrict__ val,
                               const bool clear, T* __restrict__ x)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < k) x[idx[e]] = clear ? T(0) : val[e];
}

template <typename T>
__global__ void spmspv_gather(const int k, const long long* __restrict__ offsets,
                              const int* __restrict__ x_idx, const T* __restrict__ x_val,
                              const long long* __restrict__ col_ptr, const int* __restrict__ row_idx,
                              const T* __restrict__ vals, int* __restrict__ rows, T* __restrict__ values)
{
    const long long total = offsets[k];
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x; p < total; p += stride) {
        product(p, k, offsets, x_idx, x_val, col_ptr, row_idx, vals, rows[p], values[p]);
    }
}
