// rcm: the steps of the renumbering that run over the whole matrix (kernels/rcm.py starts each search and keeps
// the same steps in NumPy as the reference).

// The whole breadth-first search of Cuthill-McKee in one cooperative launch (every block resident at once, so a
// grid-wide barrier cannot deadlock), from a level already numbered (order[level .. level + count)) until a level
// is empty, holds more than `wide` vertices, or `deep` levels are numbered (the last one not searched): no
// read-back a level, three grid-wide barriers a level. The next level is numbered by the lowest number of the
// level's vertices that reach a vertex (its `parent`), then by vertex. A warp a vertex u of the level (in the
// order numbered, so u's number is level + its place), its lanes over u's neighbours, which a canonical CSR row
// holds in increasing order:
//   reach (every warp of the grid): each unnumbered neighbour takes the lowest number that reaches it
//          (atomicMin on `parent`);
//   count (each block a slice of the level): how many of u's neighbours are u's children, and the slice's scan of
//          those counts; the blocks' totals cross the barrier;
//   write (the same slices): u's children numbered in the order of u's row, right after the level (order,
//          number, and the root of u's search: root is indexed by number), from the totals of the slices before.
// No sort, and the same order on every run. `parent` holds INT_MAX for a vertex never reached (a reached vertex
// is numbered in the next level, so its parent is never read again). The graph's row pointer is 64-bit: the
// bipartite graph of a rectangular matrix holds each entry twice. result: [vertices numbered in all, the size
// of the level that was too wide (0: none), 1 where the search stopped at `deep` levels (else 0)]. Blocks of up
// to 1024 threads.

// Every block of the grid waits here until all have arrived; what each wrote before is seen by all after (the
// barrier cooperative groups' grid.sync() is: a counter of arrivals and a generation the last one moves on).
__device__ __forceinline__ void rcm_grid_sync(unsigned int* barrier)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* generation = barrier + 1;
        const unsigned int seen = *generation;
        __threadfence();
        if (atomicAdd(barrier, 1u) == gridDim.x - 1) {
            atomicExch(barrier, 0u);
            __threadfence();
            atomicAdd(barrier + 1, 1u);
        } else {
            while (*generation == seen) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// Exclusive scan of one value a thread over the block; *total gets the block's sum. `shared`: 32 ints.
__device__ __forceinline__ int rcm_block_scan(const int value, int* total, int* shared)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int x = value;
    for (int k = 1; k < 32; k <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, k);
        if (lane >= k) x += y;
    }
    __syncthreads();  // `shared` may still be read from the last scan
    if (lane == 31) shared[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < warps ? shared[lane] : 0;
        for (int k = 1; k < 32; k <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, k);
            if (lane >= k) s += y;
        }
        shared[lane] = s;
    }
    __syncthreads();
    *total = shared[warps - 1];
    return x - value + (warp ? shared[warp - 1] : 0);
}

extern "C" __global__ void __launch_bounds__(1024)
rcm_search(const long long* __restrict__ indptr, const int* __restrict__ indices, int* number, int* order,
           int* root, int* parent, int* children, int* block_sums, unsigned int* barrier, int* result, int level,
           int count, const int wide, const int deep)
{
    __shared__ int shared[32];
    const int lane = threadIdx.x & 31, warps_here = blockDim.x >> 5;
    const long long warps = (long long)gridDim.x * warps_here;
    const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int too_wide = 0, levels = 0;
    while (count > 0 && levels < deep) {
        for (long long w = first; w < count; w += warps) {  // reach: every warp of the grid
            const int u = order[level + w], r = level + (int)w;
            for (long long e = indptr[u] + lane; e < indptr[u + 1]; e += 32) {
                const int v = indices[e];
                if (number[v] < 0) atomicMin(&parent[v], r);
            }
        }
        rcm_grid_sync(barrier);
        // count, then scan: each block a slice of the level, so only the blocks' totals cross a barrier
        const long long slice = (count + gridDim.x - 1) / gridDim.x;
        const long long lo = min((long long)blockIdx.x * slice, (long long)count), hi = min(lo + slice, (long long)count);
        for (long long w = lo + (threadIdx.x >> 5); w < hi; w += warps_here) {
            const int u = order[level + w], r = level + (int)w;
            int n = 0;
            for (long long e = indptr[u] + lane; e < indptr[u + 1]; e += 32) {
                const int v = indices[e];
                n += number[v] < 0 && parent[v] == r;
            }
            for (int k = 16; k; k >>= 1) n += __shfl_xor_sync(0xffffffffu, n, k);
            if (lane == 0) children[w] = n;
        }
        __syncthreads();
        const long long run = (hi - lo + blockDim.x - 1) / blockDim.x;  // a thread a run of the slice
        const long long a = min(lo + threadIdx.x * run, hi), b = min(a + run, hi);
        int sum = 0;
        for (long long i = a; i < b; ++i) sum += children[i];
        int block_total;
        int at = rcm_block_scan(sum, &block_total, shared);
        for (long long i = a; i < b; ++i) {  // the slice's own inclusive scan
            at += children[i];
            children[i] = at;
        }
        if (threadIdx.x == 0) block_sums[blockIdx.x] = block_total;
        rcm_grid_sync(barrier);
        int earlier = 0, all = 0;
        for (int j = threadIdx.x; j < (int)gridDim.x; j += blockDim.x) {
            all += block_sums[j];
            if (j < (int)blockIdx.x) earlier += block_sums[j];
        }
        int offset, next;
        rcm_block_scan(earlier, &offset, shared);
        rcm_block_scan(all, &next, shared);
        if (next > wide) {
            too_wide = next;
            break;
        }
        const int start = level + count;
        for (long long w = lo + (threadIdx.x >> 5); w < hi; w += warps_here) {  // write
            const int u = order[level + w], r = level + (int)w;
            int k0 = start + offset + (w > lo ? children[w - 1] : 0);
            const long long end = indptr[u + 1];
            for (long long base = indptr[u]; base < end; base += 32) {
                const long long e = base + lane;
                const int v = e < end ? indices[e] : 0;
                const bool mine = e < end && number[v] < 0 && parent[v] == r;
                const unsigned ballot = __ballot_sync(0xffffffffu, mine);
                if (mine) {
                    const int k = k0 + __popc(ballot & ((1u << lane) - 1));
                    order[k] = v;
                    number[v] = k;
                    root[k] = root[r];
                }
                k0 += __popc(ballot);
            }
        }
        rcm_grid_sync(barrier);
        level = start;
        count = next;
        ++levels;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        result[0] = level + count;
        result[1] = too_wide;
        result[2] = !too_wide && count > 0;
    }
}

// B = A[rows][:, cols]: a warp for each row of B copies the entries of A's row rows[i], in A's order, with
// their columns renumbered (new_col[j]: the new number of A's column j; null: columns kept, B = A[rows]).
template <typename T>
__global__ void rcm_renumber(const int m, const int* __restrict__ rows, const int* __restrict__ new_indptr,
                             const int* __restrict__ indptr, const int* __restrict__ indices,
                             const T* __restrict__ data, const int* __restrict__ new_col,
                             int* __restrict__ out_indices, T* __restrict__ out_data)
{
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= m) return;
    const int src = indptr[rows[warp]];
    const int dst = new_indptr[warp];
    const int n = new_indptr[warp + 1] - dst;
    for (int j = lane; j < n; j += 32) {
        const int col = indices[src + j];
        out_indices[dst + j] = new_col == nullptr ? col : new_col[col];
        out_data[dst + j] = data[src + j];
    }
}
