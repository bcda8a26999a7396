// csr_scalar: the textbook CSR kernel, one thread per row (baseline).
// Instantiated per value type: csr_scalar<float>, csr_scalar<double>.

template <typename T>
__global__ void csr_scalar(const int m,
                           const int* __restrict__ indptr,
                           const int* __restrict__ indices,
                           const T* __restrict__ data,
                           const T* __restrict__ x,
                           T* __restrict__ y)
{
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m) return;
    const int end = indptr[row + 1];
    T sum = 0;
    for (int j = indptr[row]; j < end; ++j) {
        sum += data[j] * __ldg(&x[indices[j]]);
    }
    y[row] = sum;
}
