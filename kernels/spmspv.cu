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
//                  touched, and that thread appends the row to `touched`. The host then
//                  sorts `touched`, and spmspv_collect reads acc at those rows and zeroes acc
//                  and mark there again, so every call costs O(active products), never O(m).
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

// counts[e + 1] = entries of column x_idx[e] (counts[0] is left 0 by the host; a scan follows).
__global__ void spmspv_counts(const int k, const int* __restrict__ x_idx, const long long* __restrict__ col_ptr,
                              long long* __restrict__ counts)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < k) counts[e + 1] = col_ptr[x_idx[e] + 1] - col_ptr[x_idx[e]];
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
