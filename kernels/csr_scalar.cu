// csr_scalar: the textbook CSR kernel, one thread per row (baseline).
// Instantiated per value type, unroll and columns: csr_scalar<double, 4, true>, ...
//
// UNROLL: the first UNROLL entries of a row are loaded (predicated) before the first x is gathered, so a
// thread has that many loads in flight where the plain loop has one entry's: on rows of a few entries the
// plain loop is bound by latency, not bandwidth (a 20 M x 20 K matrix of 1-4 entries a row, float64, on an
// H100: 83 % of the copy bandwidth with 1, 98 % with 4; bench/probe_csr_scalar_unroll.py). The sum runs in the
// same order either way.
// NARROW: a row whose columns span fewer than 65,536 (base[row] >= 0) reads them as 16-bit offsets from
// base[row], its lowest column (narrow.cu writes them, a row a segment, as for csr_vector); a wider row
// (base[row] == -1) reads the CSR's int32 columns. Bytes an entry: 10 instead of 12 in float64, 6 instead of
// 8 in float32, and 4 more a row.

// The sum of entries j .. end - 1, the column of entry k column(k). One call a kind of column, so that no
// branch splits the loads of the unrolled first entries.
template <typename T, int UNROLL, typename Column>
__device__ __forceinline__ T row_sum(int j, const int end, const T* __restrict__ data, const T* __restrict__ x,
                                     const Column column)
{
    T sum = 0;
    if (UNROLL > 1) {
        int col[UNROLL];
        T val[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const bool here = j + u < end;
            col[u] = here ? column(j + u) : 0;
            val[u] = here ? data[j + u] : T(0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (j + u < end) sum += val[u] * __ldg(&x[col[u]]);
        }
        j += UNROLL;
    }
    for (; j < end; ++j) {
        sum += data[j] * __ldg(&x[column(j)]);
    }
    return sum;
}

template <typename T, int UNROLL, bool NARROW>
__global__ void csr_scalar(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const int* __restrict__ base,
                           const unsigned short* __restrict__ offsets,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const int start = indptr[row];
    const int end = indptr[row + 1];
    const int lowest = NARROW ? base[row] : -1;
    if (lowest >= 0) {
        y[row] = row_sum<T, UNROLL>(start, end, data, x, [=](int k) { return lowest + (int)offsets[k]; });
    } else {
        y[row] = row_sum<T, UNROLL>(start, end, data, x, [=](int k) { return indices[k]; });
    }
}
