// csr_vector: a group of TPR consecutive threads per row (baseline).
// Lane l of a group sums the row's nonzeros l, l+TPR, l+2*TPR, ...; the group
// then reduces its TPR partial sums with warp shuffles (a halving tree).
// Instantiated per value type and group size: csr_vector<double, 8>.

template <typename T, int TPR>
__global__ void csr_vector(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "TPR must be a power of two <= 32");
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long row = tid / TPR;
    const int lane = threadIdx.x & (TPR - 1);
    T sum = 0;
    if (row < m) {
        const int end = indptr[row + 1];
        for (int j = indptr[row] + lane; j < end; j += TPR) {
            sum += data[j] * __ldg(&x[indices[j]]);
        }
    }
    // Every thread of the warp takes part in the shuffles (blockDim is a multiple of 32).
#pragma unroll
    for (int offset = TPR / 2; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset, TPR);
    }
    if (lane == 0 && row < m) y[row] = sum;
}
