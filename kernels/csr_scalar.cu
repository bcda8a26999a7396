// csr_scalar: the textbook CSR kernel, one thread per row (baseline).
// Instantiated per value type and unroll: csr_scalar<double, 4>, ...
//
// UNROLL: the first UNROLL entries of a row are loaded (predicated) before the first x is gathered, so a
// thread has that many loads in flight where the plain loop has one entry's: on rows of a few entries the
// plain loop is bound by latency, not bandwidth (a 20 M x 20 K matrix of 1-4 entries a row, float64, on an
// H100: 83 % of the copy bandwidth with 1, 98 % with 4; bench/probe_csr_scalar_unroll.py). The sum runs in the
// same order either way.

template <typename T, int UNROLL>
__global__ void csr_scalar(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    int j = indptr[row];
    const int end = indptr[row + 1];
    T sum = 0;
    if (UNROLL > 1) {
        int col[UNROLL];
        T val[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const bool here = j + u < end;
            col[u] = here ? indices[j + u] : 0;
            val[u] = here ? data[j + u] : T(0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (j + u < end) sum += val[u] * __ldg(&x[col[u]]);
        }
        j += UNROLL;
    }
    for (; j < end; ++j) {
        sum += data[j] * __ldg(&x[indices[j]]);
    }
    y[row] = sum;
}
