// nut: non-uniform tiling SpMV (after Hong et al., 2018), one thread block per row panel.
//
// The structure is built by kernels/nut.py (on the GPU with CuPy, or in NumPy for
// the reference); every array below is described there. In short:
//
//   panel_ptr[p] .. panel_ptr[p+1]          the rows of panel p (at most max_rows of them)
//   item_order                               the work items in the order the blocks take them
//   item_panel[i]                            item i's panel p, or ~p when p has several items (its
//                                            slabs, or the pieces of a heavy panel): then the item adds
//                                            its sums to y atomically, Nut._run having cleared those rows
//   item_tile_ptr[i] .. item_tile_ptr[i+1]   item i's tiles (of one column slab of its panel; none
//                                            when the panel has no entry: the item stores its zeros)
//   tile_cols[tile_col_ptr[t] ..]            tile t's active columns (the indirection array)
//   tile_nnz[t], tile_ptr[t]                  tile t's entries and where its encoded block starts
//   enc_idx / enc_val                         the index and value matrices of every tile
//
// Tile t of e entries is split into w = ceil(e / s) stretches of s = ceil(e / blockDim.x)
// consecutive entries (in row-major order inside the tile); thread k takes stretch k.
// Item j of stretch k sits at tile_ptr[t] + j * w + k, so a warp reading its j-th items
// reads consecutive words. An index word >= 0 is the x slot (position in the tile's
// indirection array) of an entry in the same row as the previous item; a negative word
// w names its row: ~w = (local_row << 16) | slot. The first item of every stretch and
// the first entry of each row inside a stretch are negative, so no thread ever needs
// to know where its stretch began.
//
// The index and value matrices are read once per product, with the streaming hint
// (__ldcs, evict first), so they do not push x out of L2.
//
// Work items, column slabs and row bands (beyond the paper): a panel's tiles may be cut into several
// items (by column slab, and where one panel holds far more nonzeros than a block should take alone);
// the blocks take the items in item_order (band by band, slab by slab, heaviest first), so the blocks
// running at one time gather x from one slab, which can stay in L2.
//
// Tunables are runtime values (rows per panel and columns per tile set the dynamic
// shared memory, threads per tile = blockDim.x), so one compilation per value type
// serves every config: nut_spmv<float>, nut_spmv<double>.

#define NUT_BATCH 4  // entries (and x gathers) a thread has in flight at once

// Entries j0 .. j0 + NUT_BATCH - 1 of a stretch (those below count), read with the streaming hint.
template <typename T>
__device__ __forceinline__ void nut_load_batch(const int* idx, const T* val, const int w, const int j0,
                                               const int count, int (&words)[NUT_BATCH], T (&vals)[NUT_BATCH])
{
#pragma unroll
    for (int u = 0; u < NUT_BATCH; ++u) {
        if (j0 + u < count) {
            words[u] = __ldcs(idx + (long long)(j0 + u) * w);
            vals[u] = __ldcs(val + (long long)(j0 + u) * w);
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(1024, 2)  // 32 registers: two blocks of 1024 threads an SM (no spills)
nut_spmv(const int n_items,
         const int max_rows,
         const int* __restrict__ item_order,
         const int* __restrict__ item_panel,
         const int* __restrict__ item_tile_ptr,
         const int* __restrict__ panel_ptr,
         const int* __restrict__ tile_col_ptr,
         const int* __restrict__ tile_cols,
         const int* __restrict__ tile_nnz,
         const long long* __restrict__ tile_ptr,
         const int* __restrict__ enc_idx,
         const T* __restrict__ enc_val,
         const T* __restrict__ x,
         T* __restrict__ y)
{
    // Dynamic shared memory: the panel's output rows, then the tile's x values.
    extern __shared__ __align__(16) unsigned char nut_shared[];
    T* ys = reinterpret_cast<T*>(nut_shared);
    T* xs = ys + max_rows;
    const int nt = blockDim.x;
    const int k = threadIdx.x;

    for (int b = blockIdx.x; b < n_items; b += gridDim.x) {
        const int item = item_order[b];
        const int code = item_panel[item];
        const bool add = code < 0;
        const int p = add ? ~code : code;
        const int t_begin = item_tile_ptr[item];
        const int t_end = item_tile_ptr[item + 1];
        const int r0 = panel_ptr[p];
        const int nr = panel_ptr[p + 1] - r0;
        for (int i = k; i < nr; i += nt) ys[i] = T(0);
        for (int t = t_begin; t < t_end; ++t) {
            const int c0 = tile_col_ptr[t];
            const int nc = tile_col_ptr[t + 1] - c0;
            const int e = tile_nnz[t];
            const int s = (e + nt - 1) / nt;  // stretch length
            const int w = (e + s - 1) / s;    // stretches (threads at work) in this tile
            const int count = k < w ? min(s, e - k * s) : 0;
            const int* idx = enc_idx + tile_ptr[t] + k;
            const T* val = enc_val + tile_ptr[t] + k;
            // This thread's first NUT_BATCH entries do not depend on x: their loads are issued before
            // the gather, so the two wait on memory together.
            int words[NUT_BATCH];
            T vals[NUT_BATCH];
            nut_load_batch(idx, val, w, 0, count, words, vals);
            __syncthreads();  // ys is zeroed and the previous tile's readers of xs are done
            for (int i0 = k; i0 < nc; i0 += NUT_BATCH * nt) {  // NUT_BATCH gathers in flight a thread
                int cols[NUT_BATCH];
#pragma unroll
                for (int u = 0; u < NUT_BATCH; ++u) {
                    const int i = i0 + u * nt;
                    cols[u] = i < nc ? __ldcs(&tile_cols[c0 + i]) : 0;
                }
                T xv[NUT_BATCH];
#pragma unroll
                for (int u = 0; u < NUT_BATCH; ++u) xv[u] = i0 + u * nt < nc ? __ldg(&x[cols[u]]) : T(0);
#pragma unroll
                for (int u = 0; u < NUT_BATCH; ++u) {
                    if (i0 + u * nt < nc) xs[i0 + u * nt] = xv[u];
                }
            }
            __syncthreads();
            // The stretch, NUT_BATCH entries at a time. A negative word starts a row and ends the previous
            // one. The first row of a stretch may have begun in the previous stretch and the last may go on
            // in the next: those are added atomically. A row that starts and ends inside this stretch
            // belongs to this thread alone in this tile. (The first word of a stretch is always negative.)
            int row = -1;  // the current row of this thread's stretch and its sum; the last is added below
            T sum = T(0);
            bool owned = false;
            for (int j0 = 0; j0 < count; j0 += NUT_BATCH) {
                if (j0 > 0) nut_load_batch(idx, val, w, j0, count, words, vals);
#pragma unroll
                for (int u = 0; u < NUT_BATCH; ++u) {
                    if (j0 + u >= count) break;
                    const int word = words[u];
                    if (word < 0) {
                        if (row >= 0) {
                            if (owned) {
                                ys[row] += sum;
                            } else {
                                atomicAdd(&ys[row], sum);
                            }
                            owned = true;
                        }
                        const int code = ~word;
                        row = code >> 16;
                        sum = vals[u] * xs[code & 0xFFFF];
                    } else {
                        sum += vals[u] * xs[word];
                    }
                }
            }
            // The threads of a warp whose stretches end in the same row (a row longer than a stretch: they
            // are consecutive lanes) add their sums up first, and the lowest of them adds the total: a hub
            // row's tile sends one atomic a warp to ys, not one a thread.
            const int lane = k & 31;
            const unsigned peers = __match_any_sync(0xffffffffu, row);
            const int end = 32 - __clz(peers);  // one past the last lane ending in this row
            for (int d = 1; d < 32; d <<= 1) {
                const T o = __shfl_down_sync(0xffffffffu, sum, d);
                if (lane + d < end) sum += o;
            }
            if (row >= 0 && lane == __ffs(peers) - 1) atomicAdd(&ys[row], sum);
        }
        __syncthreads();  // every tile's sums are in ys
        if (add) {  // only the rows this item touched (other items add to the same rows)
            for (int i = k; i < nr; i += nt) {
                if (ys[i] != T(0)) atomicAdd(&y[r0 + i], ys[i]);
            }
        } else {
            for (int i = k; i < nr; i += nt) y[r0 + i] = ys[i];
        }
        // The next item (grid-stride) zeroes only the ys[i] this thread just read, and its
        // first tile starts with __syncthreads, so no barrier is needed here.
    }
}

// The structure's passes over the entries on the GPU (kernels/nut.py, _tiles_on_gpu): what the NumPy lines of
// build() compute in a dozen passes over nnz-long int64 arrays, in kernels around at most one sort and two
// scans. K is the (panel, column) key: int where n_panels * n fits, else long long.

// Each entry's row inside its panel and its key panel * n + column. A block takes per_thread * blockDim
// consecutive entries at a time: two of its threads find the rows of the first and the last by a search
// of all of indptr (a chain of dependent loads the rest of the block waits for, so the span is long), and
// every thread then searches only the rows between them (a few, in cache) for each of its entries. (A
// search of all of indptr from every entry took a tenth of NuT's preparation.) The panel: the last start
// at or before the row, by a search of panel_ptr.
__device__ __forceinline__ long long nut_last_le(const long long* __restrict__ a, long long lo, long long hi,
                                                 const long long v)
{  // the last i in [lo, hi] with a[i] <= v (a ascending, a[lo] <= v)
    while (lo < hi) {
        const long long mid = (lo + hi + 1) >> 1;
        if (a[mid] <= v) lo = mid; else hi = mid - 1;
    }
    return lo;
}

template <typename K>
__global__ void nut_keys(const long long nnz, const long long m, const long long* __restrict__ indptr,
                         const int* __restrict__ indices, const long long n_panels,
                         const long long* __restrict__ panel_ptr, const long long n, const long long per_thread,
                         int* __restrict__ local_row, K* __restrict__ key)
{
    __shared__ long long rows[2];  // the rows of the span's first and last entry
    const long long span = blockDim.x * per_thread;
    for (long long base = blockIdx.x * span; base < nnz; base += gridDim.x * span) {  // the same for the block
        const long long last = min(base + span, nnz) - 1;
        if (threadIdx.x < 2) rows[threadIdx.x] = nut_last_le(indptr, 0, m - 1, threadIdx.x ? last : base);
        __syncthreads();
        for (long long e = base + threadIdx.x; e <= last; e += blockDim.x) {
            const long long r = nut_last_le(indptr, rows[0], rows[1], e);
            const long long p = nut_last_le(panel_ptr, 0, n_panels - 1, r);
            local_row[e] = (int)(r - panel_ptr[p]);
            key[e] = (K)(p * n + indices[e]);
        }
        __syncthreads();  // rows[] is read before the next span's rows are written
    }
}

// 1 where the keys sorted by ``order`` start a run of equal keys (a new active column of a panel), else 0.
template <typename K>
__global__ void nut_runs(const long long nnz, const long long* __restrict__ order, const K* __restrict__ key,
                         int* __restrict__ starts)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nnz;
         e += (long long)gridDim.x * blockDim.x)
        starts[e] = (e == 0 || key[order[e]] != key[order[e - 1]]) ? 1 : 0;
}

// Each entry's active column (its run: runs[e] - 1, runs the inclusive sum of starts), and for each active
// column its group (panel * slabs + its column's slab) and its column.
template <typename K>
__global__ void nut_actives(const long long nnz, const long long* __restrict__ order, const K* __restrict__ key,
                            const int* __restrict__ starts, const int* __restrict__ runs, const long long n,
                            const long long slabs, int* __restrict__ entry_uid, int* __restrict__ active_group,
                            int* __restrict__ tile_cols)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nnz;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = order[e];
        const int u = runs[e] - 1;
        entry_uid[i] = u;
        if (starts[e]) {
            const long long k = key[i];
            const long long c = k % n;
            active_group[u] = (int)((k / n) * slabs + c * slabs / n);
            tile_cols[u] = (int)c;
        }
    }
}

// Each active column's tile and slot: its rank in its group, cut into tiles of cols_per_tile.
__global__ void nut_slots(const long long n_active, const int* __restrict__ active_group,
                          const long long* __restrict__ group_active_ptr, const long long* __restrict__ group_tile_ptr,
                          const long long cols_per_tile, int* __restrict__ active_tile, int* __restrict__ active_slot)
{
    for (long long a = blockIdx.x * (long long)blockDim.x + threadIdx.x; a < n_active;
         a += (long long)gridDim.x * blockDim.x) {
        const int g = active_group[a];
        const long long rank = a - group_active_ptr[g];
        active_tile[a] = (int)(group_tile_ptr[g] + rank / cols_per_tile);
        active_slot[a] = (int)(rank % cols_per_tile);
    }
}

// The active columns without a sort, where a bit for every (panel, column) pair fits (kernels/nut.py,
// _actives_by_bitmap): each entry sets the bit of its key; an active column is a set bit, numbered by the set
// bits before it, which is the (panel, column) order the sort gives. Those before a bit: the count before its
// sector (8 words, 32 bytes; an exclusive scan of nut_bit_counts), then the words before it in its sector.
__device__ __forceinline__ long long nut_bits_before(const unsigned int* __restrict__ bits,
                                                     const long long* __restrict__ sector_before, const long long pos)
{
    const long long w = pos >> 5;
    long long r = sector_before[pos >> 8];
    for (long long v = w & ~7ll; v < w; ++v) r += __popc(bits[v]);
    return r + __popc(bits[w] & ((1u << (pos & 31)) - 1u));
}

// An atomic only where the bit is not set yet: the rows of a band or a block name the same columns again and
// again, and an atomic each on one word queued up (3.2 ms of an H200 on skyline's 31 M entries). A bit, once
// set, stays set, so a read that sees it set is right to skip; one that misses it (the other SM's atomic not
// seen yet) only costs the atomic.
template <typename K>
__global__ void nut_mark(const long long nnz, const K* __restrict__ key, unsigned int* __restrict__ bits)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nnz;
         e += (long long)gridDim.x * blockDim.x) {
        const long long k = key[e];
        const unsigned int bit = 1u << (k & 31);
        if (!(bits[k >> 5] & bit)) atomicOr(&bits[k >> 5], bit);
    }
}

// counts[g + 1] = the set bits of sector g (counts[0] is 0: the inclusive scan of counts is then exclusive).
__global__ void nut_bit_counts(const long long sectors, const uint4* __restrict__ bits, long long* __restrict__ counts)
{
    for (long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x; g < sectors;
         g += (long long)gridDim.x * blockDim.x) {
        const uint4 a = bits[2 * g], b = bits[2 * g + 1];
        counts[g + 1] = __popc(a.x) + __popc(a.y) + __popc(a.z) + __popc(a.w)
                      + __popc(b.x) + __popc(b.y) + __popc(b.z) + __popc(b.w);
    }
}

// The set bits before each of ``positions`` (where each group of a panel's columns starts, then the end).
__global__ void nut_bit_ranks(const long long count, const long long* __restrict__ positions,
                              const unsigned int* __restrict__ bits, const long long* __restrict__ sector_before,
                              long long* __restrict__ ranks)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x)
        ranks[i] = nut_bits_before(bits, sector_before, positions[i]);
}

// Each entry's active column: the set bits before its key's.
template <typename K>
__global__ void nut_uids(const long long nnz, const K* __restrict__ key, const unsigned int* __restrict__ bits,
                         const long long* __restrict__ sector_before, int* __restrict__ entry_uid)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nnz;
         e += (long long)gridDim.x * blockDim.x)
        entry_uid[e] = (int)nut_bits_before(bits, sector_before, key[e]);
}

// Each active column's group and column (what nut_actives writes). A warp takes 32 words (4 sectors) at a time,
// a word a lane: the set bits before its word are those before the first sector and the lanes' before it (a
// warp's scan), not a walk of its group's words for each.
__global__ void nut_bit_list(const long long words, const unsigned int* __restrict__ bits,
                             const long long* __restrict__ sector_before, const long long n, const long long slabs,
                             int* __restrict__ active_group, int* __restrict__ tile_cols)
{
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long w0 = ((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5) << 5; w0 < words; w0 += warps << 5) {
        const long long w = w0 + lane;  // words is a multiple of 8, w0 of 32: sector w0 >> 3 exists
        unsigned int v = w < words ? bits[w] : 0u;
        if (!__ballot_sync(0xffffffffu, v != 0u)) continue;  // the same for the whole warp
        const int count = __popc(v);
        int below = count;  // inclusive scan of the lanes' counts
        for (int offset = 1; offset < 32; offset <<= 1) {
            const int other = __shfl_up_sync(0xffffffffu, below, offset);
            if (lane >= offset) below += other;
        }
        // The word's first bit's panel and column: one 64-bit division a word, not two a bit.
        const long long panel = (w << 5) / n, first = (w << 5) - panel * n;
        for (long long a = sector_before[w0 >> 3] + below - count; v; v &= v - 1, ++a) {
            long long p = panel, c = first + __ffs(v) - 1;
            while (c >= n) { c -= n; ++p; }  // a bit past the panel's last column (a word may span panels)
            active_group[a] = (int)(p * slabs + (slabs == 1 ? 0 : c * slabs / n));
            tile_cols[a] = (int)c;
        }
    }
}

// The entries in tile order without a sort (kernels/nut.py, _chunk_ranks): a row's entries are in column
// order, so in tile order, and an entry's place in its tile is the count of its tile's entries in the rows
// before it. A warp takes one chunk of a panel's entries (chunk_size[p] of them, the panel's last fewer), in
// CSR order, 32 at a time: each entry's rank among the chunk's earlier entries of its tile (the lanes of one
// tile found by __match_any_sync), and the chunk's count of each tile in table[tile_chunk_base[t] + k + 1]
// (chunk k of the panel; no other warp writes there). The inclusive scan of table then gives, at
// tile_chunk_base[t] + k, the entries before chunk k's of tile t in tile order.
__global__ void nut_chunk_ranks(const long long n_chunks, const long long* __restrict__ chunk_panel,
                                const long long* __restrict__ panel_chunk_ptr,
                                const long long* __restrict__ panel_entry_ptr,
                                const long long* __restrict__ chunk_size, const int* __restrict__ entry_uid,
                                const int* __restrict__ active_tile, const long long* __restrict__ tile_chunk_base,
                                int* __restrict__ table, int* __restrict__ rank)
{
    const int lane = threadIdx.x & 31;
    const unsigned int lower = (1u << lane) - 1u;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long c = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; c < n_chunks; c += warps) {
        const long long p = chunk_panel[c];
        const long long k = c - panel_chunk_ptr[p];
        const long long start = panel_entry_ptr[p] + k * chunk_size[p];
        const long long end = min(start + chunk_size[p], panel_entry_ptr[p + 1]);
        for (long long e0 = start; e0 < end; e0 += 32) {  // the same for the whole warp
            const long long e = e0 + lane;
            const bool valid = e < end;
            const int t = valid ? active_tile[entry_uid[e]] : -1;
            const unsigned int peers = __match_any_sync(0xffffffffu, t);
            const int leader = __ffs(peers) - 1;
            int before = 0;
            if (valid && lane == leader) {
                int* count = table + tile_chunk_base[t] + k + 1;
                before = *count;
                *count = before + __popc(peers);
            }
            before = __shfl_sync(0xffffffffu, before, leader);
            if (valid) rank[e] = before + __popc(peers & lower);
        }
    }
}

// The tile encoding, an entry a thread in CSR order (kernels/nut.py's build does the same in NumPy for the
// reference, from the entries sorted by tile): entry e of tile t is q of its tile (the entries of t in the
// chunks before its own, then its rank in its chunk), item j = q % s of stretch q / s, stored at tile_ptr[t]
// + j * w + q / s. Its word is its x slot, or ~(local_row << 16 | slot) where it starts a stretch or a row of
// the tile (the entry before it in the tile is then not the one before it in the CSR).
template <typename T>
__global__ void nut_encode(const long long nnz, const int* __restrict__ entry_uid, const int* __restrict__ active_tile,
                           const int* __restrict__ active_slot, const long long* __restrict__ tile_panel,
                           const long long* __restrict__ panel_entry_ptr, const long long* __restrict__ chunk_size,
                           const long long* __restrict__ tile_chunk_base, const int* __restrict__ before,
                           const int* __restrict__ rank, const long long* __restrict__ stretch,
                           const long long* __restrict__ width, const long long* __restrict__ tile_ptr,
                           const int* __restrict__ local_row, const T* __restrict__ data,
                           int* __restrict__ enc_idx, T* __restrict__ enc_val)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < nnz;
         e += (long long)gridDim.x * blockDim.x) {
        const int u = entry_uid[e];
        const int t = active_tile[u];
        const long long p = tile_panel[t];
        const long long base = tile_chunk_base[t];
        // below 2^31 (nnz is): 32-bit divisions, a fraction of 64-bit ones' instructions
        const int k = (int)(e - panel_entry_ptr[p]) / (int)chunk_size[p];
        const int q = before[base + k] - before[base] + rank[e];
        const int s = (int)stretch[t];
        const int j = q % s;
        const long long pos = tile_ptr[t] + (long long)j * width[t] + q / s;
        const long long row = local_row[e];
        const bool starts = j == 0 || e == 0 || local_row[e - 1] != row || active_tile[entry_uid[e - 1]] != t;
        const long long slot = active_slot[u];
        enc_idx[pos] = (int)(starts ? ~((row << 16) | slot) : slot);
        enc_val[pos] = data[e];
    }
}
