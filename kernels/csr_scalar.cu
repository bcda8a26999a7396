// csr_scalar: the textbook CSR kernel, one thread per row (baseline).
// Instantiated per value type, unroll, columns and rows a thread: csr_scalar<double, 4, true, 1>, ...
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

// The sums of ROWS rows, row r's entries start[r] .. end[r] - 1, the column of its entry k column(r, k): the
// first UNROLL entries of every row loaded before the first x is gathered, then each row's others in order.
// One call a kind of column, so that no branch splits the loads of the unrolled first entries.
template <typename T, int UNROLL, int ROWS, typename Column>
__device__ __forceinline__ void row_sums(const int (&start)[ROWS], const int (&end)[ROWS],
                                         const T* __restrict__ data, const T* __restrict__ x, const Column column,
                                         T (&sum)[ROWS])
{
    int col[ROWS][UNROLL];
    T val[ROWS][UNROLL];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = start[r] + u;
            const bool here = k < end[r];
            col[r][u] = here ? column(r, k) : 0;
            val[r][u] = here ? data[k] : T(0);
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        sum[r] = 0;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (start[r] + u < end[r]) sum[r] += val[r][u] * __ldg(&x[col[r][u]]);
        }
        for (int k = start[r] + UNROLL; k < end[r]; ++k) {
            sum[r] += data[k] * __ldg(&x[column(r, k)]);
        }
    }
}

// ROWS: a thread sums rows first, first + blockDim.x, ..., first + (ROWS-1) * blockDim.x (a block's rows stay
// contiguous, its loads coalesced), their first entries all in flight at once: on an H200, whose bandwidth needs
// more bytes in flight than a thread of one short row has, with every thread of an SM resident already.
// A thread whose rows mix narrow and int32 columns sums them a row at a time.
template <typename T, int UNROLL, bool NARROW, int ROWS>
__global__ void csr_scalar(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const int* __restrict__ base,
                           const unsigned short* __restrict__ offsets,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    const long long first = (long long)blockIdx.x * blockDim.x * ROWS + threadIdx.x;
    int start[ROWS], end[ROWS], lowest[ROWS];
    bool narrow = NARROW, wide = true;  // every row narrow (or past the end: no entries); every row int32
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const long long row = first + (long long)r * blockDim.x;
        const bool in = row < m;
        start[r] = in ? indptr[row] : 0;
        end[r] = in ? indptr[row + 1] : 0;
        lowest[r] = !NARROW ? -1 : in ? base[row] : 0;
        narrow = narrow && lowest[r] >= 0;
        wide = wide && lowest[r] < 0;
    }
    T sum[ROWS];
    if (NARROW && narrow) {
        row_sums<T, UNROLL, ROWS>(start, end, data, x, [&](int r, int k) { return lowest[r] + (int)offsets[k]; },
                                  sum);
    } else if (wide) {
        row_sums<T, UNROLL, ROWS>(start, end, data, x, [&](int, int k) { return indices[k]; }, sum);
    } else {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int s[1] = {start[r]}, e[1] = {end[r]};
            T one[1];
            const int low = lowest[r];
            if (low >= 0) {
                row_sums<T, UNROLL, 1>(s, e, data, x, [=](int, int k) { return low + (int)offsets[k]; }, one);
            } else {
                row_sums<T, UNROLL, 1>(s, e, data, x, [=](int, int k) { return indices[k]; }, one);
            }
            sum[r] = one[0];
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const long long row = first + (long long)r * blockDim.x;
        if (row < m) y[row] = sum[r];
    }
}
