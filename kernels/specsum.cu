// specsum: speculative segmented sum SpMV (Liu & Vinter, 2015), written for this project.
//
// The nonzeros are cut into tiles of W*T consecutive entries; a bunch of T
// threads (a warp, or half of one) walks S consecutive tiles, B bunches share a
// thread block. Stage 1 (specsum_tiles) is the speculative pass; stage 2
// (specsum_fixup) adds the synchronizer and repairs the dirty tiles.
//
// Stage 1, per bunch:
//   1. binary search of the row pointer for the row of the first entry of each of
//      its S tiles and of the entry just past them (S+1 searches, in this kernel);
//   2. per tile: products a_e * x[col_e] loaded coalesced and transposed through
//      shared memory so lane l holds entries l*W .. l*W+W-1; the segment
//      descriptor (one bit per entry that starts a row) built in shared memory
//      from the row pointer; the tile is dirty when its row range holds an empty
//      row (for tile 0 also when rows before its first row exist: all empty);
//   3. segmented sum: each lane sums its W entries sequentially, a segmented
//      suffix scan of warp shuffles completes the segments that cross lanes;
//   4. speculative compacted writes: segment g of a tile whose first entry lies
//      in row r0 goes to y[r0 + g] (right when no row of the tile is empty);
//      the last segment, when its row goes on into the next tile, is carried to
//      the next tile of the bunch instead, or, at the bunch's last tile, written
//      to y[r1] (r1: the row of the next tile's first entry, known from the search);
//   5. when the bunch starts inside a row, its partial sum of that row (carried
//      over its tiles) goes to the synchronizer (sync_row, sync_val), not to y.
//   The decomposition is recorded on the way: tile_row (n_tiles + 1 entries),
//   dirty (n_tiles bytes), sync_row (-1: the bunch starts at a row's first entry).
//
// Stage 2 (GPU fix-up): y[sync_row[b]] += sync_val[b] (atomic: a long row can
// span several bunches), and for each dirty tile every row strictly between its
// first row and the next tile's first row (those rows lie wholly inside the
// tile; for tile 0 also the rows before its first row) is recomputed by a
// per-row pass. The two touch disjoint rows, so one launch does both.
//
// Instantiated per value type, W and T (B and S are runtime arguments):
// specsum_tiles<double, 4, 32>, specsum_fixup<double>.

#ifndef SPECSUM_MAX_THREADS
#define SPECSUM_MAX_THREADS 256
#endif

namespace specsum_detail {

// Padded shared-memory index of tile entry p: one skipped slot every 128 bytes
// of values, so lanes reading W consecutive entries each hit distinct banks.
template <typename V>
__device__ __forceinline__ int padded(int p)
{
    return p + p / (128 / (int)sizeof(V));
}

template <typename V, int W, int T>
struct Layout {
    static constexpr int tile = W * T;
    static constexpr int prods = tile + tile / (128 / (int)sizeof(V)) + 1;  // padded values per bunch
};

// Lanes of the calling thread's bunch inside its warp (T = 32: the warp, T < 32: a slice).
template <int T>
__device__ __forceinline__ unsigned bunch_mask()
{
    if constexpr (T == 32) {
        return 0xffffffffu;
    } else {
        const unsigned lane = threadIdx.x & 31u;
        return ((1u << T) - 1u) << (lane & ~(unsigned)(T - 1));
    }
}

// Largest r in [0, m] with rowptr[r] <= e: the row holding entry e (e < nnz), or m for e = nnz.
__device__ __forceinline__ int row_of(const int* __restrict__ rowptr, int m, int e)
{
    int lo = 0, hi = m;  // rowptr[0] = 0 <= e
    while (lo < hi) {
        const int mid = lo + (int)(((unsigned)(hi - lo) + 1u) >> 1);
        if (__ldg(&rowptr[mid]) <= e) lo = mid; else hi = mid - 1;
    }
    return lo;
}

}  // namespace specsum_detail

template <typename V, int W, int T>
__global__ void __launch_bounds__(SPECSUM_MAX_THREADS)
specsum_tiles(const int m,
              const int nnz,
              const int n_tiles,
              const int n_bunches,
              const int S,
              const int* __restrict__ rowptr,
              const int* __restrict__ colidx,
              const V* __restrict__ val,
              const V* __restrict__ x,
              V* __restrict__ y,
              int* __restrict__ tile_row,
              unsigned char* __restrict__ dirty,
              int* __restrict__ sync_row,
              V* __restrict__ sync_val)
{
    using namespace specsum_detail;
    static_assert(T >= 2 && T <= 32 && (T & (T - 1)) == 0, "T must be a power of two <= 32");
    static_assert(W >= 1 && W <= 32, "W must be in 1..32 (one 32-bit descriptor word per lane)");
    constexpr int TILE = Layout<V, W, T>::tile;
    constexpr int PRODS = Layout<V, W, T>::prods;

    // Dynamic shared memory: [B][PRODS] values, [B][T] descriptor words, [B][S+1] rows.
    extern __shared__ __align__(16) unsigned char specsum_smem[];
    const int B = blockDim.x / T;
    const int lane = threadIdx.x % T;
    const int local = threadIdx.x / T;
    V* s_prod = reinterpret_cast<V*>(specsum_smem) + local * PRODS;
    unsigned* s_flag = reinterpret_cast<unsigned*>(reinterpret_cast<V*>(specsum_smem) + B * PRODS) + local * T;
    int* s_row = reinterpret_cast<int*>(reinterpret_cast<unsigned*>(reinterpret_cast<V*>(specsum_smem) + B * PRODS)
                                        + B * T) + local * (S + 1);

    const long long bunch = (long long)blockIdx.x * B + local;
    if (bunch >= n_bunches) return;  // the whole bunch leaves together
    const unsigned mask = bunch_mask<T>();

    const int first = (int)(bunch * S);  // first tile of the bunch
    const int count = min(S, n_tiles - first);

    // 1. tile boundaries: rows of the first entries of the bunch's tiles and of the next tile.
    for (int j = lane; j <= count; j += T) {
        const long long e = (long long)(first + j) * TILE;
        s_row[j] = row_of(rowptr, m, e < nnz ? (int)e : nnz);
    }
    __syncwarp(mask);
    for (int j = lane; j < count; j += T) tile_row[first + j] = s_row[j];
    if (first + count == n_tiles && lane == 0) tile_row[n_tiles] = s_row[count];

    const int head_row = s_row[0];
    const bool head_open = __ldg(&rowptr[head_row]) < first * TILE;  // the bunch starts inside a row
    V carry = 0;         // partial sum of the row going on from the previous tile (same in every lane)
    V head_partial = 0;  // the bunch's partial sum of head_row when head_open (lane 0)

    for (int t = 0; t < count; ++t) {
        const int tile = first + t;
        const int ts = tile * TILE;  // < nnz
        const int len = min(TILE, nnz - ts);
        const int te = ts + len;
        const int r0 = s_row[t];
        const int r1 = s_row[t + 1];

        // 2a. products, loaded coalesced, stored so that lane l reads its W consecutive ones.
#pragma unroll
        for (int j = 0; j < W; ++j) {
            const int p = j * T + lane;
            V prod = 0;
            if (p < len) prod = __ldg(&val[ts + p]) * __ldg(&x[__ldg(&colidx[ts + p])]);
            s_prod[padded<V>(p)] = prod;
        }
        s_flag[lane] = 0u;
        __syncwarp(mask);

        // 2b. segment descriptor: a bit for every row starting inside the tile; empty rows make it dirty.
        bool empty_row = false;
        const int rlast = min(r1, m - 1);
        for (int r = r0 + 1 + lane; r <= rlast; r += T) {
            const int a = __ldg(&rowptr[r]);
            const int off = a - ts;  // >= 1: rows after r0 start after ts
            if (off < len) atomicOr(&s_flag[off / W], 1u << (off % W));
            if (a == __ldg(&rowptr[r + 1])) empty_row = true;
        }
        const bool is_dirty = __any_sync(mask, empty_row) || (tile == 0 && r0 > 0);
        __syncwarp(mask);

        unsigned f = s_flag[lane];
        if (lane == 0) f |= 1u;  // the tile's first entry opens segment 0
        V p[W];
#pragma unroll
        for (int j = 0; j < W; ++j) p[j] = s_prod[padded<V>(lane * W + j)];
        __syncwarp(mask);  // shared buffers are free for the next tile from here on

        // 3a. per lane: the lead (entries before the lane's first segment start) and the count of starts.
        V lead = 0;
        bool started = false;
#pragma unroll
        for (int j = 0; j < W; ++j) {
            started = started || ((f >> j) & 1u);
            if (!started) lead += p[j];
        }
        const int c = __popc(f);

        // 3b. segment numbering: exclusive prefix of the starts over the lanes.
        int incl = c;
#pragma unroll
        for (int d = 1; d < T; d <<= 1) {
            const int o = __shfl_up_sync(mask, incl, d, T);
            if (lane >= d) incl += o;
        }
        const int base = incl - c;                           // global index of the lane's first segment
        const int n = __shfl_sync(mask, incl, T - 1, T);     // segments in the tile

        // 3c. segmented suffix scan of the leads: what the lanes after this one add to its last segment.
        V u = lead;
        int stop = c > 0;
#pragma unroll
        for (int d = 1; d < T; d <<= 1) {
            const V ou = __shfl_down_sync(mask, u, d, T);
            const int os = __shfl_down_sync(mask, stop, d, T);
            if (lane + d < T && !stop) {
                u += ou;
                stop = os;
            }
        }
        V tail = __shfl_down_sync(mask, u, 1, T);
        if (lane == T - 1) tail = 0;

        // 4. emit the segments: speculative compacted writes, carry, synchronizer.
        const bool head_starts = __ldg(&rowptr[r0]) == ts;
        const bool open_end = r1 < m && __ldg(&rowptr[r1]) < te;  // last segment's row goes on
        const bool last_in_bunch = t == count - 1;
        const bool sync_case = head_open && r0 == head_row;    // segment 0 belongs to the synchronizer
        V last_val = 0;
        auto emit = [&](int g, V v) {
            if (g == 0 && !head_starts) v += carry;
            if (g == n - 1) last_val = v;
            if (g == 0 && sync_case) {
                head_partial = v;
            } else if (g == n - 1 && open_end) {
                if (last_in_bunch) y[r1] = v;
            } else {
                y[r0 + g] = v;
            }
        };
        V acc = 0;
        int g = base - 1;
        bool in_seg = false;
#pragma unroll
        for (int j = 0; j < W; ++j) {
            if ((f >> j) & 1u) {
                if (in_seg) emit(g, acc);
                ++g;
                acc = 0;
                in_seg = true;
            }
            if (in_seg) acc += p[j];
        }
        if (in_seg) emit(g, acc + tail);

        // The lane holding the tile's last segment hands its value on as the next carry.
        const unsigned holders = __ballot_sync(mask, c > 0);  // never empty: lane 0 has c >= 1
        const int src = (31 - __clz(holders)) & (T - 1);
        carry = __shfl_sync(mask, last_val, src, T);

        if (lane == 0) dirty[tile] = is_dirty ? 1 : 0;
    }

    if (lane == 0) {
        sync_row[bunch] = head_open ? head_row : -1;
        sync_val[bunch] = head_open ? head_partial : V(0);
    }
}

template <typename V>
__global__ void __launch_bounds__(256)
specsum_fixup(const int m,
              const int n_tiles,
              const int n_bunches,
              const int* __restrict__ rowptr,
              const int* __restrict__ colidx,
              const V* __restrict__ val,
              const V* __restrict__ x,
              V* __restrict__ y,
              const int* __restrict__ tile_row,
              const unsigned char* __restrict__ dirty,
              const int* __restrict__ sync_row,
              const V* __restrict__ sync_val)
{
    // blockDim.x is a multiple of 32, so every warp is full and the tile loop is warp-uniform.
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n_threads = (long long)gridDim.x * blockDim.x;

    // The synchronizer: a bunch's partial sum of the row it starts in.
    for (long long b = tid; b < n_bunches; b += n_threads) {
        const int r = sync_row[b];
        if (r >= 0) atomicAdd(&y[r], sync_val[b]);
    }

    // Dirty tiles: a warp takes 32 tiles at a time and repairs the dirty ones together.
    const int lane = threadIdx.x & 31;
    const long long warp = tid >> 5;
    const long long n_warps = n_threads >> 5;
    for (long long g = warp * 32; g < n_tiles; g += n_warps * 32) {
        const long long mine = g + lane;
        unsigned todo = __ballot_sync(0xffffffffu, mine < n_tiles && dirty[mine]);
        while (todo) {
            const int k = __ffs(todo) - 1;
            todo &= todo - 1;
            const long long tile = g + k;
            const int r0 = tile_row[tile];
            const int r1 = tile_row[tile + 1];
            const int lo = tile == 0 ? 0 : r0 + 1;
            for (int r = lo + lane; r < r1; r += 32) {
                if (r == r0) continue;  // tile 0: its first row is right already
                const int end = __ldg(&rowptr[r + 1]);
                V sum = 0;
                for (int e = __ldg(&rowptr[r]); e < end; ++e) sum += __ldg(&val[e]) * __ldg(&x[__ldg(&colidx[e])]);
                y[r] = sum;
            }
        }
    }
}
