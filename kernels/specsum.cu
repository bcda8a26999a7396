// specsum: speculative segmented sum SpMV (Liu & Vinter, 2015), written for this project.
//
// The nonzeros are cut into tiles of W*T consecutive entries; a bunch of T
// threads (a warp, or half of one) walks S consecutive tiles, B bunches share a
// thread block. Stage 1 (specsum_tiles) is the speculative pass; stage 2 adds
// the synchronizer (specsum_sync) and, in the paper's mode, repairs the dirty
// tiles (specsum_fixup).
//
// Stage 1, per bunch:
//   1. the row of the bunch's first entry, by one search of the row pointer made
//      by the T lanes together (a T-ary search: about log_T(m) dependent rounds);
//      every further tile boundary is found by walking the row pointer (step 2),
//      which the descriptor reads anyway;
//   2. per tile: the values and columns (loaded one tile ahead, 16-byte vectors
//      where W allows) times x, transposed through shared memory so lane l holds
//      entries l*W .. l*W+W-1 (no transposition when W is the vector width);
//      values and columns are read once, so with the streaming hint (__ldcs,
//      evict first): they do not push x out of L2;
//      the walk over the rows after the tile's first row r0: a bit of the segment
//      descriptor for every row starting inside the tile, r1 (the row of the
//      next tile's first entry: the last row whose start is <= the tile's end),
//      and the dirty flag (an empty row in r0..r1; for tile 0 also rows before
//      its first row, all empty);
//   3. segmented sum: each lane sums its W entries sequentially, a segmented
//      suffix scan of warp shuffles completes the segments that cross lanes;
//   4. the writes. dirty = "fixup" (the paper's speculation): segment g of a tile
//      goes to y[r0 + g], right unless the tile is dirty. dirty = "search": in a
//      dirty tile segment g goes to its true row, which the walk recorded in
//      shared memory at the offset where that row starts (one entry a row, so no
//      search of the row pointer per segment), and the walk writes 0 to every
//      empty row it meets: stage 1 then writes every row of y and only the
//      synchronizer is left to add. In both modes the last segment, when its row
//      goes on into the next tile, is carried to the next tile of the bunch, or,
//      at the bunch's last tile, written to y[r1];
//   5. when the bunch starts inside a row, its partial sum of that row (carried
//      over its tiles) goes to the synchronizer (sync_row, sync_val), not to y.
//   The decomposition is recorded on the way: tile_row (n_tiles + 1 entries),
//   dirty (n_tiles bytes), sync_row (-1: the bunch starts at a row's first entry).
//
// Stage 2: specsum_sync adds y[sync_row[b]] += sync_val[b] (atomic: a long row can
// span several bunches); in search mode with few bunches the last block of stage 1 does
// it instead. specsum_fixup does that and re-scatters the dirty tiles
// of the paper's mode, one warp a dirty tile with its rows over the lanes: the
// k-th non-empty row strictly between r0 and r1 takes y[r0 + k], empty rows 0
// (for tile 0 also the rows before r0). The synchronizer's rows are tile_row
// values, never strictly inside a tile's row range, so one launch does both.
//
// Instantiated per value type, W, T and width (B, S and the mode are runtime arguments):
// specsum_tiles<double, 4, 32, false>, specsum_sync<double>, specsum_fixup<double>.

#ifndef SPECSUM_MAX_THREADS
#define SPECSUM_MAX_THREADS 256
#endif
// The wide instantiations (WIDE = true, for a launch whose bunches fit in one wave, where the dependent
// rounds of loads are what a bunch costs) load several row pointers a lane at once: SPECSUM_PROBES in each
// round of the first row search, and SPECSUM_WALK chunks of T rows in each later round of the walk (a tile
// spanning many rows, i.e. empty ones, then takes 1 + ceil(rest / (T * WALK)) rounds, not one per T rows).
// The narrow ones (many waves, where loads and registers are what it costs) load one of each.
#ifndef SPECSUM_PROBES
#define SPECSUM_PROBES 4
#endif
#ifndef SPECSUM_WALK
#define SPECSUM_WALK 8
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
    // Entries a lane loads at once: 16 bytes of values where W allows, else 8, else 1.
    static constexpr int vec = (16 / (int)sizeof(V) >= 4 && W % 4 == 0) ? 4 : (W % 2 == 0 ? 2 : 1);
    static constexpr bool direct = vec == W;  // the loads already give lane l its W consecutive entries
    // Tile position of a lane's k-th loaded entry (k < W).
    static __device__ __forceinline__ int pos(int k, int lane) { return ((k / vec) * T + lane) * vec + k % vec; }
};

template <typename V, int N> struct Vec;
template <> struct Vec<double, 2> { using type = double2; };
template <> struct Vec<float, 2> { using type = float2; };
template <> struct Vec<float, 4> { using type = float4; };
template <int N> struct IVec;
template <> struct IVec<2> { using type = int2; };
template <> struct IVec<4> { using type = int4; };

template <int N, typename S, typename D>
__device__ __forceinline__ void unpack(const S& s, D* d)
{
    d[0] = s.x;
    d[1] = s.y;
    if constexpr (N == 4) {
        d[2] = s.z;
        d[3] = s.w;
    }
}

// Values and columns of the tile starting at entry ts (len entries): lane's k-th at Layout::pos(k, lane).
// Entries past the tile's end are 0 (value) and 0 (column), never read from memory.
template <typename V, int W, int T>
__device__ __forceinline__ void load_tile(const V* __restrict__ val, const int* __restrict__ colidx,
                                          int ts, int len, int lane, V (&v)[W], int (&c)[W])
{
    constexpr int N = Layout<V, W, T>::vec;
#pragma unroll
    for (int j = 0; j < W / N; ++j) {
        const int p0 = (j * T + lane) * N;
        if constexpr (N > 1) {
            if (p0 + N <= len) {
                unpack<N>(__ldcs(reinterpret_cast<const typename Vec<V, N>::type*>(val + ts + p0)), v + j * N);
                unpack<N>(__ldcs(reinterpret_cast<const typename IVec<N>::type*>(colidx + ts + p0)), c + j * N);
                continue;
            }
        }
#pragma unroll
        for (int u = 0; u < N; ++u) {
            const bool in = p0 + u < len;
            v[j * N + u] = in ? __ldcs(&val[ts + p0 + u]) : V(0);
            c[j * N + u] = in ? __ldcs(&colidx[ts + p0 + u]) : 0;
        }
    }
}

// rowptr[r] where it exists (r <= m), else INT_MAX (past every entry).
__device__ __forceinline__ int row_start(const int* __restrict__ rowptr, int m, int r)
{
    return r <= m ? __ldg(&rowptr[r]) : 0x7fffffff;
}

// rowptr[r] and rowptr[r + 1], each INT_MAX where it does not exist.
__device__ __forceinline__ void load_rows(const int* __restrict__ rowptr, int m, int r, int& a, int& a_next)
{
    a = row_start(rowptr, m, r);
    a_next = row_start(rowptr, m, r + 1);
}

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

// Largest r in [0, m] with rowptr[r] <= e (the row holding entry e < nnz; m for e = nnz), found by
// the T lanes of a bunch together: each round the lanes probe P = T * PROBES evenly spaced rows of
// [lo, hi] (PROBES independent loads a lane, in flight at once) and keep the gap after
// the last probe that is <= e: about log_P(m) dependent rounds. Every lane returns the same row.
template <int T, int PROBES>
__device__ __forceinline__ int row_search(const int* __restrict__ rowptr, int m, int e, int lane, unsigned mask)
{
    constexpr int P = T * PROBES;
    int lo = 0, hi = m;  // rowptr[lo] <= e; the answer lies in [lo, hi]
    while (lo < hi) {
        const int step = (hi - lo + P - 1) / P;  // >= 1; the probes lo + step, ..., lo + P*step cover (lo, hi]
        bool le[PROBES];
#pragma unroll
        for (int k = 0; k < PROBES; ++k) {
            const int q = lo + step * (k * T + lane + 1);
            le[k] = q <= hi && __ldg(&rowptr[q]) <= e;
        }
        int below = 0;  // probes <= e: they are a prefix of the P probes, so their count says where
#pragma unroll
        for (int k = 0; k < PROBES; ++k) below += __popc(__ballot_sync(mask, le[k]) & mask);
        lo += step * below;
        hi = min(hi, lo + step - 1);  // the next probe was > e, or past hi
    }
    return lo;
}

}  // namespace specsum_detail

// Stage 1 for the calling thread's bunch (steps 1-5 above); a bunch past the last returns at once.
template <typename V, int W, int T, bool WIDE>
__device__ __forceinline__ void
specsum_bunch(const int m,
              const int nnz,
              const int n_tiles,
              const int n_bunches,
              const int S,
              const int search,
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
    using L = Layout<V, W, T>;
    static_assert(T >= 2 && T <= 32 && (T & (T - 1)) == 0, "T must be a power of two <= 32");
    static_assert(W >= 1 && W <= 32, "W must be in 1..32 (one 32-bit descriptor word per lane)");
    static_assert(L::prods * sizeof(V) >= L::tile * sizeof(int), "the row table reuses the products' buffer");
    constexpr int TILE = L::tile;
    constexpr int PRODS = L::prods;
    constexpr int WALK = WIDE ? SPECSUM_WALK : 1;

    // Dynamic shared memory: [B][PRODS] values (in search mode, once the lanes hold their products,
    // also the tile's row table: s_tab[off] = the non-empty row starting at tile offset off), [B][T] words.
    extern __shared__ __align__(16) unsigned char specsum_smem[];
    const int B = blockDim.x / T;
    const int lane = threadIdx.x % T;
    const int local = threadIdx.x / T;
    V* s_prod = reinterpret_cast<V*>(specsum_smem) + local * PRODS;
    int* s_tab = reinterpret_cast<int*>(s_prod);
    unsigned* s_flag = reinterpret_cast<unsigned*>(reinterpret_cast<V*>(specsum_smem) + B * PRODS) + local * T;

    const long long bunch = (long long)blockIdx.x * B + local;
    if (bunch >= n_bunches) return;  // the whole bunch leaves together
    const unsigned mask = bunch_mask<T>();

    const int first = (int)(bunch * S);  // first tile of the bunch
    const int count = min(S, n_tiles - first);
    const int b0 = (int)((long long)first * TILE);  // the bunch's first entry (< nnz)

    s_flag[lane] = 0u;  // made visible to the bunch by the first __syncwarp of the tile loop

    // 1. the row of the bunch's first entry.
    int r0 = row_search<T, WIDE ? SPECSUM_PROBES : 1>(rowptr, m, b0, lane, mask);
    const int head_row = r0;
    const bool head_open = __ldg(&rowptr[head_row]) < b0;  // the bunch starts inside a row

    // One tile ahead: the first tile's values and columns, the first rows of its walk.
    V nv[W];
    int nc[W];
    load_tile<V, W, T>(val, colidx, b0, min(TILE, nnz - b0), lane, nv, nc);
    int na, na_next;
    load_rows(rowptr, m, r0 + 1 + lane, na, na_next);

    V carry = 0;         // partial sum of the row going on from the previous tile (same in every lane)
    V head_partial = 0;  // the bunch's partial sum of head_row when head_open (lane 0)

    for (int t = 0; t < count; ++t) {
        const int tile = first + t;
        const int ts = tile * TILE;  // < nnz
        const int len = min(TILE, nnz - ts);
        const int te = ts + len;

        // 2a. gather x for this tile, then issue the next tile's loads before using anything.
        V xv[W], cv[W];
#pragma unroll
        for (int k = 0; k < W; ++k) {
            cv[k] = nv[k];
            xv[k] = L::pos(k, lane) < len ? __ldg(&x[nc[k]]) : V(0);
        }
        int a = na, a_next = na_next;
        if (t + 1 < count) load_tile<V, W, T>(val, colidx, te, min(TILE, nnz - te), lane, nv, nc);

        __syncwarp(mask);  // the previous tile's readers of s_prod / s_tab are done
        V p[W];
        if constexpr (L::direct) {
#pragma unroll
            for (int k = 0; k < W; ++k) p[k] = cv[k] * xv[k];
        } else {
#pragma unroll
            for (int k = 0; k < W; ++k) s_prod[padded<V>(L::pos(k, lane))] = cv[k] * xv[k];
            __syncwarp(mask);
#pragma unroll
            for (int j = 0; j < W; ++j) p[j] = s_prod[padded<V>(lane * W + j)];
            __syncwarp(mask);  // s_prod is free for the row table from here on
        }

        // 2b. walk the rows after r0: descriptor bits, r1, empty rows (written 0 in search mode). Rows
        // r0+1 .. r0+T first (their row pointers were loaded one tile ahead), then WALK chunks of T rows a
        // round, loaded together, until a chunk ends the walk.
        bool empty_row = false;
        int r1 = r0;
        int empty_from = -1;  // the first of the empty rows after the last entry, where the walk saw them begin
        auto walk = [&](int base, int a, int a_next) -> bool {  // rows base .. base+T-1; whether to go on
            const int r = base + lane;
            const bool in = r <= m && a <= te;  // rows r0+1 .. r1, a prefix of the lanes
            const int n_in = __popc(__ballot_sync(mask, in) & mask);
            if (in && r < m) {
                const int off = a - ts;  // >= 1: rows after r0 start after ts
                if (off < len) {
                    atomicOr(&s_flag[off / W], 1u << (off % W));
                    if (search && a_next > a) s_tab[off] = r;
                }
                if (a == a_next) {
                    empty_row = true;
                    if (search) y[r] = V(0);
                }
            }
            r1 += n_in;
            if (n_in < T) return false;
            // Go on only if the next row starts by te too (lane T-1 holds its start as a_next): a range of
            // exactly T rows then takes one round of loads, not two.
            const int after = __shfl_sync(mask, a_next, T - 1, T);
            if (after == nnz && te == nnz) {  // the last tile, no entry left: every later row is empty
                empty_from = base + T;
                return false;
            }
            return after <= te;
        };
        bool more = walk(r0 + 1, a, a_next);
        for (int base = r0 + 1 + T; more; base += WALK * T) {
            // One start a lane a chunk, plus the start of the row after the last chunk; a row's end is the
            // next lane's start (the next chunk's first for lane T-1).
            int wa[WALK + 1];
#pragma unroll
            for (int u = 0; u < WALK; ++u) wa[u] = row_start(rowptr, m, base + u * T + lane);
            wa[WALK] = row_start(rowptr, m, base + WALK * T);
#pragma unroll
            for (int u = 0; u < WALK; ++u) {
                if (more) {  // the same in every lane of the bunch
                    const int following = u + 1 < WALK ? __shfl_sync(mask, wa[u + 1], 0, T) : wa[WALK];
                    const int a_next = __shfl_down_sync(mask, wa[u], 1, T);
                    more = walk(base + u * T, wa[u], lane == T - 1 ? following : a_next);
                }
            }
        }
        if (empty_from >= 0) {  // rows empty_from .. m-1: empty, r1 = m, known without loading their starts
            empty_row = empty_row || empty_from < m;
            if (search) {
                for (int r = empty_from + lane; r < m; r += T) y[r] = V(0);
            }
            r1 = m;
        }
        if (t + 1 < count) load_rows(rowptr, m, r1 + 1 + lane, na, na_next);  // the next tile's walk starts at r1
        if (search && tile == 0) {
            for (int r = lane; r < r0; r += T) y[r] = V(0);  // rows before the first entry: empty
        }
        const bool is_dirty = __any_sync(mask, empty_row) || (tile == 0 && r0 > 0);
        __syncwarp(mask);  // descriptor and row table complete

        unsigned f = s_flag[lane];
        s_flag[lane] = 0u;  // only this lane reads it; the next tile's bits come after a __syncwarp
        if (lane == 0) f |= 1u;  // the tile's first entry opens segment 0

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
        const int base = incl - c;                        // tile index of the lane's first segment
        const int n = __shfl_sync(mask, incl, T - 1, T);  // segments in the tile

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

        // 4. emit the segments: speculative or searched writes, carry, synchronizer.
        const bool head_starts = __ldg(&rowptr[r0]) == ts;
        const bool open_end = r1 < m && __ldg(&rowptr[r1]) < te;  // last segment's row goes on
        const bool last_in_bunch = t == count - 1;
        const bool sync_case = head_open && r0 == head_row;  // segment 0 belongs to the synchronizer
        const bool true_rows = search && is_dirty;
        V last_val = 0;
        auto emit = [&](int g, int q, V v) {  // segment g starts at tile offset q
            if (g == 0 && !head_starts) v += carry;
            if (g == n - 1) last_val = v;
            if (g == 0 && sync_case) {
                head_partial = v;
            } else if (g == n - 1 && open_end) {
                if (last_in_bunch) y[r1] = v;
            } else {
                y[true_rows ? (g == 0 ? r0 : s_tab[q]) : r0 + g] = v;
            }
        };
        V acc = 0;
        int g = base - 1;
        int q = 0;
        bool in_seg = false;
#pragma unroll
        for (int j = 0; j < W; ++j) {
            if ((f >> j) & 1u) {
                if (in_seg) emit(g, q, acc);
                ++g;
                q = lane * W + j;
                acc = 0;
                in_seg = true;
            }
            if (in_seg) acc += p[j];
        }
        if (in_seg) emit(g, q, acc + tail);

        // The lane holding the tile's last segment hands its value on as the next carry.
        const unsigned holders = __ballot_sync(mask, c > 0) & mask;  // never empty: lane 0 has c >= 1
        const int src = (31 - __clz(holders)) & (T - 1);
        carry = __shfl_sync(mask, last_val, src, T);

        if (lane == 0) {
            dirty[tile] = is_dirty ? 1 : 0;
            tile_row[tile] = r0;
            if (tile == n_tiles - 1) tile_row[n_tiles] = r1;
        }
        r0 = r1;
    }

    if (lane == 0) {
        sync_row[bunch] = head_open ? head_row : -1;
        sync_val[bunch] = head_open ? head_partial : V(0);
    }
}

// Stage 1; with a ticket (search mode, few bunches: see specsum.py), stage 2 too, in the last block to
// finish: every block makes its writes visible, takes a ticket (atomicInc wraps it back to 0 for the next
// run), and the block holding the last adds the synchronizer, as specsum_sync would, one launch fewer.
template <typename V, int W, int T, bool WIDE>
__global__ void __launch_bounds__(SPECSUM_MAX_THREADS)
specsum_tiles(const int m,
              const int nnz,
              const int n_tiles,
              const int n_bunches,
              const int S,
              const int search,
              const int* __restrict__ rowptr,
              const int* __restrict__ colidx,
              const V* __restrict__ val,
              const V* __restrict__ x,
              V* __restrict__ y,
              int* __restrict__ tile_row,
              unsigned char* __restrict__ dirty,
              int* __restrict__ sync_row,
              V* __restrict__ sync_val,
              unsigned* __restrict__ ticket)
{
    specsum_bunch<V, W, T, WIDE>(m, nnz, n_tiles, n_bunches, S, search, rowptr, colidx, val, x, y, tile_row,
                                 dirty, sync_row, sync_val);
    if (ticket == nullptr) return;
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicInc(ticket, gridDim.x - 1) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    constexpr int U = 4;  // loads in flight a thread before its atomics
    for (int b0 = threadIdx.x; b0 < n_bunches; b0 += U * blockDim.x) {
        int r[U];
        V v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * blockDim.x;
            r[u] = b < n_bunches ? __ldcg(&sync_row[b]) : -1;
            v[u] = b < n_bunches ? __ldcg(&sync_val[b]) : V(0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (r[u] >= 0) atomicAdd(&y[r[u]], v[u]);
        }
    }
}

// Stage 2 of search mode: y[sync_row[b]] += sync_val[b] for every bunch that starts inside a row.
template <typename V>
__global__ void __launch_bounds__(256)
specsum_sync(const int n_bunches, V* __restrict__ y, const int* __restrict__ sync_row, const V* __restrict__ sync_val)
{
    const long long n_threads = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < n_bunches; b += n_threads) {
        const int r = sync_row[b];
        if (r >= 0) atomicAdd(&y[r], sync_val[b]);
    }
}

// Stage 2 of the paper's mode: the synchronizer, and the dirty tiles' compacted sums re-scattered.
template <typename V>
__global__ void __launch_bounds__(256)
specsum_fixup(const int m,
              const int n_tiles,
              const int n_bunches,
              const int* __restrict__ rowptr,
              V* __restrict__ y,
              const int* __restrict__ tile_row,
              const unsigned char* __restrict__ dirty,
              const int* __restrict__ sync_row,
              const V* __restrict__ sync_val)
{
    // blockDim.x is a multiple of 32, so every warp is full and the tile loop is warp-uniform.
    const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n_threads = (long long)gridDim.x * blockDim.x;

    // The synchronizer: a bunch's partial sum of the row it starts in (rows no tile repairs).
    for (long long b = tid; b < n_bunches; b += n_threads) {
        const int r = sync_row[b];
        if (r >= 0) atomicAdd(&y[r], sync_val[b]);
    }

    // Dirty tiles, one warp each. Row r0 + k of a dirty tile holds the sum of the k-th non-empty row
    // after r0 (k >= 1), which lies at or after r0 + k: rows are rewritten from the last 32 down, each
    // group reading all its sources before writing, so no source is overwritten before it is read.
    const int lane = threadIdx.x & 31;
    const long long n_warps = n_threads >> 5;
    for (long long tile = tid >> 5; tile < n_tiles; tile += n_warps) {
        if (!dirty[tile]) continue;
        const int r0 = tile_row[tile];
        const int hi = tile_row[tile + 1];  // rows r0+1 .. hi-1 lie wholly inside the tile
        int total = 0;                       // non-empty rows among them
        for (int base = r0 + 1; base < hi; base += 32) {
            const int r = base + lane;
            total += __popc(__ballot_sync(0xffffffffu, r < hi && __ldg(&rowptr[r + 1]) > __ldg(&rowptr[r])));
        }
        int after = 0;  // non-empty rows after the current group
        for (int base = r0 + 1 + ((hi - r0 - 2) / 32) * 32; base > r0 && base < hi; base -= 32) {
            const int r = base + lane;
            const bool filled = r < hi && __ldg(&rowptr[r + 1]) > __ldg(&rowptr[r]);
            const unsigned ballot = __ballot_sync(0xffffffffu, filled);
            const int rank = total - after - __popc(ballot >> lane) + 1;  // k of row r when filled
            const V v = filled ? y[r0 + rank] : V(0);
            __syncwarp();
            if (r < hi) y[r] = v;
            after += __popc(ballot);
        }
        if (tile == 0) {
            for (int r = lane; r < r0; r += 32) y[r] = V(0);  // rows before the first entry: empty
        }
    }
}
