// rcm: the steps of the renumbering that run over the whole matrix (kernels/rcm.py runs the loop around
// them and keeps the same steps in NumPy as the reference).

// One breadth-first level of Cuthill-McKee in three kernels, a warp for each vertex u of the level
// (`frontier`, in the order numbered), its lanes over u's neighbours, which a canonical CSR row holds in
// increasing order. The next level is numbered by the lowest number of the level's vertices that reach a
// vertex (its `parent`), then by vertex: rcm_reach finds each one's parent; rcm_count counts the vertices
// whose parent u is; after a scan of the counts (offsets: where u's children start), rcm_write writes them
// in the order of u's row. No sort, and the same order on every run. The graph's row pointer is 64-bit:
// the bipartite graph of a rectangular matrix holds each entry twice.
#define RCM_LEVEL_ARGS const int count, const int* __restrict__ frontier, const long long* __restrict__ indptr, \
                       const int* __restrict__ indices, const int* __restrict__ number
#define RCM_WARP_OF_U \
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; \
    const int lane = threadIdx.x & 31; \
    if (warp >= count) return; \
    const int u = frontier[warp]; \
    const int r = number[u];

__global__ void rcm_reach(RCM_LEVEL_ARGS, int* __restrict__ parent)
{
    RCM_WARP_OF_U
    for (long long e = indptr[u] + lane; e < indptr[u + 1]; e += 32) {
        const int v = indices[e];
        if (number[v] < 0) atomicMin(&parent[v], r);
    }
}

__global__ void rcm_count(RCM_LEVEL_ARGS, const int* __restrict__ parent, int* __restrict__ children)
{
    RCM_WARP_OF_U
    int n = 0;
    for (long long e = indptr[u] + lane; e < indptr[u + 1]; e += 32) {
        const int v = indices[e];
        n += number[v] < 0 && parent[v] == r;
    }
    for (int k = 16; k; k >>= 1) n += __shfl_xor_sync(0xffffffffu, n, k);
    if (lane == 0) children[warp] = n;
}

__global__ void rcm_write(RCM_LEVEL_ARGS, const int* __restrict__ parent, const int* __restrict__ ends,
                          int* __restrict__ next, int* __restrict__ next_parent)
{
    RCM_WARP_OF_U
    int at = warp ? ends[warp - 1] : 0;
    for (long long base = indptr[u]; base < indptr[u + 1]; base += 32) {
        const long long e = base + lane;
        const int v = e < indptr[u + 1] ? indices[e] : 0;
        const bool mine = e < indptr[u + 1] && number[v] < 0 && parent[v] == r;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (mine) {
            const int k = at + __popc(ballot & ((1u << lane) - 1));
            next[k] = v;
            next_parent[k] = r;
        }
        at += __popc(ballot);
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
