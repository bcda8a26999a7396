// ipcsr: improved PCSR (Gao, Qi & He, 2016), one thread block per row block.
//
// A row block is a run of consecutive rows whose nonzeros fit `shared_size`
// staged values (at most blockDim.x rows), or a single row longer than that.
// The host builds the block table (kernels/ipcsr.py): block_row_start[b] ..
// block_row_start[b+1] are the rows of block b, and block_tpr[b] is the number
// of threads per row the decision tree chose for it (a power of two: 1 is the
// scalar reduction, 2..32 a multiple-scalar one inside a warp, more spans warps,
// blockDim.x is the full-block reduction of a single row).
//
// Per block: stage data[j] * x[indices[j]] of the block's nonzeros in shared
// memory with coalesced loads, in chunks of `shared_size` (one chunk unless the
// block is a single long row), __syncthreads, then lane l of a row's group sums
// the staged entries l, l+g, l+2g, ... of its row in that chunk; the group then
// reduces its g partial sums with a halving tree (steps of 32 and more in shared
// memory, the last five with warp shuffles). Every row of the block gets a
// group, so empty rows are written as 0.
//
// Long rows cut into pieces (long_span > 0): a long row of more than long_span
// nonzeros has ceil(nnz / long_span) consecutive blocks, all with the row's start
// in block_row_start and piece numbers 0, 1, ... in block_piece; piece k sums the
// row's nonzeros [k * long_span, (k + 1) * long_span) like a long-row block, and
// stores its sum in partials[block]; the piece that draws the last ticket of
// counters[first block of the row] (atomicInc wraps it back to 0 for the next
// product) adds the pieces' sums in order 0, 1, ... and writes y, so the result is
// deterministic and y needs no zeroing.
//
// The matrix's values and columns are read once, with the streaming hint (__ldcs:
// evict first), so they do not push x, which is gathered again and again, out of L2.
//
// Dynamic shared memory: (shared_size + blockDim.x) * sizeof(T) bytes, the
// staging area followed by the cross-warp reduction area.
// Instantiated per value type: ipcsr<float>, ipcsr<double>; every tunable is a
// kernel argument or the launch shape, so one compilation serves every config.

template <typename T>
__global__ void ipcsr(const int* __restrict__ block_row_start,
                      const int* __restrict__ block_tpr,
                      const int* __restrict__ block_piece,
                      const int* __restrict__ indptr,
                      const int* __restrict__ indices,
                      const T* __restrict__ data,
                      const T* __restrict__ x,
                      T* __restrict__ y,
                      const int shared_size,
                      const int long_span,
                      unsigned int* __restrict__ counters,
                      T* __restrict__ partials)
{
    extern __shared__ __align__(16) unsigned char ipcsr_smem[];
    T* staged = reinterpret_cast<T*>(ipcsr_smem);
    T* partial = staged + shared_size;

    const int tid = threadIdx.x;
    const int nt = blockDim.x;
    const int row_first = block_row_start[blockIdx.x];
    const int next_start = block_row_start[blockIdx.x + 1];
    const int row_end = next_start > row_first ? next_start : row_first + 1;  // pieces share their row's start
    const int g = block_tpr[blockIdx.x];  // threads per row: a power of two, rows * g <= nt
    const int lane = tid & (g - 1);
    const int row = row_first + tid / g;
    const bool has_row = row < row_end;

    long long block_begin = indptr[row_first];
    long long block_end = indptr[row_end];
    int pieces = 1;
    const int piece = block_piece[blockIdx.x];
    if (long_span > 0 && g == nt) {  // a one-row block (g == nt only then): maybe a piece of a long row
        const long long len = block_end - block_begin;
        pieces = len > long_span ? (int)((len + long_span - 1) / long_span) : 1;
        block_begin += (long long)piece * long_span;
        if (block_end > block_begin + long_span) block_end = block_begin + long_span;
    }
    long long rs = 0, re = 0;
    if (has_row) {
        rs = indptr[row];
        re = indptr[row + 1];
    }

    T sum = 0;
    for (long long chunk = block_begin; chunk < block_end; chunk += shared_size) {
        const long long left = block_end - chunk;
        const int len = left < shared_size ? (int)left : shared_size;
        for (int k = tid; k < len; k += nt) {
            staged[k] = __ldcs(&data[chunk + k]) * __ldg(&x[__ldcs(&indices[chunk + k])]);
        }
        __syncthreads();
        if (has_row) {
            const long long lo = (rs > chunk ? rs : chunk) - chunk;
            const long long chunk_end = chunk + len;
            const long long hi = (re < chunk_end ? re : chunk_end) - chunk;
            for (long long p = lo + lane; p < hi; p += g) {
                sum += staged[p];
            }
        }
        __syncthreads();  // the next chunk overwrites the staging area
    }

    // Halving tree over the group's lanes: lane l adds lane l + off, off = g/2, ..., 1.
    // g is uniform over the block, so the barriers below are reached by every thread.
    if (g > 32) {
        partial[tid] = sum;
        __syncthreads();
        for (int off = g >> 1; off >= 32; off >>= 1) {
            if (lane < off) partial[tid] += partial[tid + off];
            __syncthreads();
        }
        sum = partial[tid];
    }
    // Every thread of every warp takes part (blockDim.x is a multiple of 32); a
    // lane l < off of a group of g <= 32 reads lane l + off of the same group.
    for (int off = (g < 32 ? g : 32) >> 1; off > 0; off >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, off);
    }
    if (pieces == 1) {
        if (has_row && lane == 0) y[row] = sum;
    } else if (tid == 0) {  // the block's one row (g == nt): thread 0 holds the piece's sum
        const int first = blockIdx.x - piece;
        partials[blockIdx.x] = sum;
        __threadfence();  // the sum is visible device-wide before the ticket is drawn
        if (atomicInc(&counters[first], (unsigned int)(pieces - 1)) == (unsigned int)(pieces - 1)) {
            __threadfence();
            T total = 0;
            for (int k = 0; k < pieces; ++k) total += __ldcg(&partials[first + k]);  // L2, never a stale L1 line
            y[row] = total;
        }
    }
}
