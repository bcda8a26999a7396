// csr_vector: a group of TPR consecutive threads per row (baseline).
// Lane l of a group sums the row's nonzeros l, l+TPR, l+2*TPR, ... in that order; the group
// then reduces its TPR partial sums with warp shuffles (a halving tree).
// A lane loads a batch of its entries, 32 bytes of values (4 doubles, 8 floats), before it gathers their x
// and adds them up: several loads in flight a thread on short rows. On the H100, against one entry at a time:
// a random geometric graph (15 a row) 1.19x -> 1.24x cuSPARSE in float64 (4 threads a row), 1.10x -> 1.24x in
// float32 (2 a row) (bench/probe_unseen_configs.py B); batches of 4 floats gave 1.15x, of 8 doubles 1.26x.
// (Not with the streaming hint: a row's lanes come back to the lines of its values and columns batch after
// batch, and evict-first loads made every config slower.)
// NARROW: a row whose columns span fewer than 65,536 (base[row] >= 0) reads them as 16-bit offsets from
// base[row], its lowest column (narrow.cu writes them, a row a segment); a wider row (base[row] == -1) reads
// the CSR's int32 columns. Bytes an entry: 10 instead of 12 in float64, 6 instead of 8 in float32.
// ROWS (rcm, kernels/rcm.py; rowsort, kernels/rowsort.py): where not null, the sum of row `row` is y's entry
// rows[row] (B's row `row` is A's row rows[row]): y is written in A's order, without a copy of it in B's order
// and a launch to scatter that.
// Those writes land a value at a time at random, all through the product: each is stored with an L2 evict_last
// policy, so that a sector of y stays in the L2 until its values are all in rather than going back to DRAM in
// part, more than once (see kernels/rcm.py for the figures).
// Instantiated per value type, group size and columns: csr_vector<double, 8, true>.

// Lane `lane`'s sum of a row of n entries, values at `values`, the column of entry k column(k): batches of
// this lane's entries (the last one cut at the row's end), every load of a batch issued before the first
// gather of x, the sum in the entries' order. Offsets in the row, so that no index runs past the last
// nonzero (int32 up to 2^31 - 1). One loop a kind of column, so that no branch splits a batch's loads.
template <typename T, int TPR, typename Column>
__device__ __forceinline__ T lane_sum(const int lane, const int n, const T* __restrict__ values,
                                      const T* __restrict__ x, const Column column)
{
    constexpr int BATCH = 32 / sizeof(T);
    T sum = 0;
    for (int q = lane; q < n; q += BATCH * TPR) {
        int c[BATCH];
        T v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            const int k = q + u * TPR;
            c[u] = k < n ? column(k) : 0;
            v[u] = k < n ? values[k] : T(0);
        }
#pragma unroll
        for (int u = 0; u < BATCH; ++u) {
            if (q + u * TPR < n) sum += v[u] * __ldg(&x[c[u]]);
        }
    }
    return sum;
}

// *p = v, the line kept in the L2 before others (evict_last).
__device__ __forceinline__ void store_kept(double* p, const double v)
{
    asm volatile("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_last.b64 policy, 1.0;\n\t"
                 "st.global.L2::cache_hint.f64 [%0], %1, policy;\n\t}" :: "l"(p), "d"(v) : "memory");
}

__device__ __forceinline__ void store_kept(float* p, const float v)
{
    asm volatile("{\n\t.reg .b64 policy;\n\tcreatepolicy.fractional.L2::evict_last.b64 policy, 1.0;\n\t"
                 "st.global.L2::cache_hint.f32 [%0], %1, policy;\n\t}" :: "l"(p), "f"(v) : "memory");
}

template <typename T, int TPR, bool NARROW>
__global__ void csr_vector(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const int* __restrict__ base,
                           const unsigned short* __restrict__ offsets,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y,
                           const int* __restrict__ rows)
{
    static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "TPR must be a power of two <= 32");
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / TPR;
    const int lane = threadIdx.x & (TPR - 1);
    T sum = 0;
    if (row < m) {
        const int start = indptr[row];
        const int n = indptr[row + 1] - start;
        const int lowest = NARROW ? base[row] : -1;
        if (lowest >= 0) {
            const unsigned short* row_offsets = offsets + start;
            sum = lane_sum<T, TPR>(lane, n, data + start, x, [=](int k) { return lowest + __ldg(&row_offsets[k]); });
        } else {
            const int* row_indices = indices + start;
            sum = lane_sum<T, TPR>(lane, n, data + start, x, [=](int k) { return __ldg(&row_indices[k]); });
        }
    }
    // Every thread of the warp takes part in the shuffles (blockDim is a multiple of 32).
#pragma unroll
    for (int offset = TPR / 2; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset, TPR);
    }
    if (lane == 0 && row < m) {
        if (rows == nullptr) {
            y[row] = sum;
        } else {
            store_kept(&y[rows[row]], sum);
        }
    }
}
