// reference_spmv: y = A·x and scale = |A|·|x| in float64, in one pass over A (tuner/measure/verify.py: the
// reference every kernel's y is checked against on the GPU). A's values and x stay in their own dtype and
// every product is formed and summed in double, so no float64 copy of A is made.
//
// Balanced by entries, whatever the row lengths: thread t sums entries t*entries .. (t+1)*entries - 1,
// finds the row of its first by a binary search of ptr, and adds each row's partial sums to y and scale
// (zeroed by the caller) with atomicAdd as it leaves the row. The row it ends in is added once a warp where
// every lane of the warp ends in it (a shuffle sum first): a row of millions of entries then takes one
// atomic per 32 * entries entries. A row split between threads is summed in another order than a
// sequential sum (within float64 rounding); rows are never read out of order otherwise.

template <typename T>
__global__ void reference_spmv(const int rows,
                               const long long nnz,
                               const int entries,
                               const int* __restrict__ ptr,
                               const int* __restrict__ indices,
                               const T* __restrict__ data,
                               const T* __restrict__ x,
                               double* __restrict__ y,
                               double* __restrict__ scale)
{
    const long long begin = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * entries;
    int row = -1;  // no entries: takes no part in the warp's sum
    double sum = 0.0, mag = 0.0;
    if (begin < nnz) {
        int lo = 0, hi = rows - 1;  // the last row r with ptr[r] <= begin: the (non-empty) row of entry begin
        while (lo < hi) {
            const int mid = lo + (hi - lo + 1) / 2;
            if (ptr[mid] <= begin) lo = mid; else hi = mid - 1;
        }
        row = lo;
        long long next = ptr[row + 1];
        const long long end = min(begin + (long long)entries, nnz);
        for (long long e = begin; e < end; ++e) {
            if (e >= next) {  // the row is done: what this thread summed of it goes out; empty rows are passed
                atomicAdd(y + row, sum);
                atomicAdd(scale + row, mag);
                sum = mag = 0.0;
                do { next = ptr[++row + 1]; } while (e >= next);
            }
            const double p = (double)data[e] * (double)x[indices[e]];
            sum += p;
            mag += fabs(p);
        }
    }
    const unsigned peers = __match_any_sync(0xffffffffu, row);  // blockDim is a multiple of 32
    if (peers == 0xffffffffu) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_down_sync(0xffffffffu, sum, o);
            mag += __shfl_down_sync(0xffffffffu, mag, o);
        }
        if ((threadIdx.x & 31) == 0 && row >= 0) {
            atomicAdd(y + row, sum);
            atomicAdd(scale + row, mag);
        }
    } else if (row >= 0) {
        atomicAdd(y + row, sum);
        atomicAdd(scale + row, mag);
    }
}

// rel_error_max: the largest relative error of a kernel's y against the reference (Reference.check in
// verify.py): |y - ref| less the absolute tolerance, over |A|·|x|, infinite where y (or the reference) is not a
// finite number; the maximum over the rows in one pass, a warp's maximum then one atomicMax a warp on the bits
// of a non-negative double (whose bits order as its values do) in *worst, zeroed by the caller.
template <typename T>
__global__ void rel_error_max(const int rows,
                              const T* __restrict__ y,
                              const double* __restrict__ ref,
                              const double* __restrict__ scale,
                              const double atol,
                              unsigned long long* __restrict__ worst)
{
    const double inf = __longlong_as_double(0x7ff0000000000000LL);
    double w = 0.0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
        const double v = (double)y[i];
        double r = isfinite(v) ? fmax(fabs(v - ref[i]) - atol, 0.0) / fmax(scale[i], 2.2250738585072014e-308) : inf;
        w = fmax(w, r == r ? r : inf);  // NaN (inf / inf: a reference that is not finite) fails
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w = fmax(w, __shfl_down_sync(0xffffffffu, w, o));
    if ((threadIdx.x & 31) == 0) atomicMax(worst, (unsigned long long)__double_as_longlong(w));
}
