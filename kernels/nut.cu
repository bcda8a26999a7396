// nut: non-uniform tiling SpMV (after Hong et al., 2018), one thread block per row panel.
//
// The structure is built by kernels/nut.py (on the GPU with CuPy, or in NumPy for
// the reference); every array below is described there. In short:
//
//   panel_ptr[p] .. panel_ptr[p+1]          the rows of panel p (at most max_rows of them)
//   item_order                               the work items in the order the blocks take them
//   item_panel[i]                            item i's panel p, or ~p when p has several items (or
//                                            with slabs, groups): then the item adds its sums to y
//                                            atomically, and Nut._run cleared those rows first
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

template <typename T>
__global__ void nut_spmv(const int n_items,
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
            __syncthreads();  // ys is zeroed and the previous tile's readers of xs are done
            for (int i = k; i < nc; i += nt) xs[i] = __ldg(&x[__ldg(&tile_cols[c0 + i])]);
            __syncthreads();
            const int e = tile_nnz[t];
            const int s = (e + nt - 1) / nt;  // stretch length
            const int w = (e + s - 1) / s;    // stretches (threads at work) in this tile
            int row = -1;  // the last row of this thread's stretch and its sum, added below
            T sum = T(0);
            if (k < w) {
                const int count = min(s, e - k * s);
                const int* idx = enc_idx + tile_ptr[t] + k;
                const T* val = enc_val + tile_ptr[t] + k;
                int code = ~__ldcs(idx);  // a stretch always starts with a negative word
                row = code >> 16;
                sum = __ldcs(val) * xs[code & 0xFFFF];
                // The first row of a stretch may have begun in the previous stretch and the
                // last may go on in the next: those are added atomically. A row that starts
                // and ends inside this stretch belongs to this thread alone in this tile.
                bool owned = false;
                for (int j = 1; j < count; ++j) {
                    const int word = __ldcs(idx + (long long)j * w);
                    const T v = __ldcs(val + (long long)j * w);
                    if (word < 0) {
                        if (owned) {
                            ys[row] += sum;
                        } else {
                            atomicAdd(&ys[row], sum);
                        }
                        owned = true;
                        code = ~word;
                        row = code >> 16;
                        sum = v * xs[code & 0xFFFF];
                    } else {
                        sum += v * xs[word];
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
