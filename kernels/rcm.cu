// rcm: the two steps of the renumbering that run over the whole matrix (kernels/rcm.py runs the loop
// around them and keeps the same steps in NumPy as the reference).

// One breadth-first level of Cuthill-McKee: a warp for each vertex u of the level (`frontier`), its lanes
// over u's neighbours. A neighbour v not numbered yet takes the lowest number of the level's vertices that
// reach it (`parent`, the order Cuthill-McKee gives the next level: by that number, then by v) and is
// added to `next` once (`claimed`). The graph's row pointer is 64-bit: the bipartite graph of a
// rectangular matrix holds each entry twice.
__global__ void rcm_expand(const int count, const int* __restrict__ frontier,
                           const long long* __restrict__ indptr, const int* __restrict__ indices,
                           const int* __restrict__ number, int* __restrict__ parent, int* __restrict__ claimed,
                           int* __restrict__ next, int* __restrict__ next_count)
{
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= count) return;
    const int u = frontier[warp];
    const int r = number[u];
    for (long long e = indptr[u] + lane; e < indptr[u + 1]; e += 32) {
        const int v = indices[e];
        if (number[v] < 0) {
            atomicMin(&parent[v], r);
            if (claimed[v] == 0 && atomicExch(&claimed[v], 1) == 0) next[atomicAdd(next_count, 1)] = v;
        }
    }
}

// B = A[rows][:, cols]: a warp for each row of B copies the entries of A's row rows[i], in A's order, with
// their columns renumbered (new_col[j]: the new number of A's column j).
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
        out_indices[dst + j] = new_col[indices[src + j]];
        out_data[dst + j] = data[src + j];
    }
}
