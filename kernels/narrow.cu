// narrow_offsets: a segment's columns as 16-bit offsets from its lowest (kernels/_narrow.py).
// A group of `lanes` threads a segment (entries ptr[s] .. ptr[s+1]-1; lanes a power of 2 up to 32, the
// caller's pick for the mean segment): its lowest and highest column; where they are fewer than 65,536 apart
// (or the segment is empty), base[s] = the lowest (0 for an empty one) and offsets[j] = indices[j] - base[s]
// for its entries; otherwise base[s] = -1 and its offsets are left unwritten (never read). A segment's columns
// need not be sorted; one of more than 65,536 entries is wide, unread. narrow_entries (zeroed by the caller; null
// where the caller knows the count) gets the entries of the narrow segments: whether the offsets pay is then one
// read-back. With gate (not null) the kernel
// writes only where a config picked on the GPU before the host knows it takes the offsets: gate[gate_at] (a double)
// names it (-1: none), and takes has a nonzero byte for each config that does (plan(effort="predict") queues it
// behind its ranking kernel); elsewhere every thread returns at once.

__global__ void narrow_offsets(const int segments,
                               const int lanes,
                               const int* __restrict__ ptr,
                               const int* __restrict__ indices,
                               int* __restrict__ base,
                               unsigned short* __restrict__ offsets,
                               unsigned long long* __restrict__ narrow_entries,
                               const double* __restrict__ gate,
                               const long long gate_at,
                               const unsigned char* __restrict__ takes)
{
    if (gate != nullptr) {  // the same answer in every thread: none reaches the barrier below where it returns
        const double picked = gate[gate_at];
        if (!(picked >= 0) || !takes[(long long)picked]) return;
    }
    // The groups stride over the segments (blockDim is a multiple of 32); what a block found narrow is added
    // to narrow_entries once: an atomic a segment on that one counter took 1.6 M of them in turn on a matrix
    // of 1.6 M rows, longer than the rest of the kernel. (A warp a segment, as before, spent 2.8 ms on the 20 M
    // rows of 2 entries of an incidence matrix: a segment's few loads and five shuffles, one after another.)
    __shared__ unsigned long long block_entries;
    if (threadIdx.x == 0) block_entries = 0;
    __syncthreads();
    const int lane = threadIdx.x & (lanes - 1);
    const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1) << ((threadIdx.x & 31) & ~(lanes - 1));
    const long long groups = (long long)gridDim.x * blockDim.x / lanes;
    unsigned long long found = 0;
    for (long long s = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / lanes; s < segments; s += groups) {
        const int start = ptr[s], end = ptr[s + 1];
        int lo = 0x7fffffff, hi = -1;  // (NVRTC has no <climits>)
        // A segment of more than 65,536 entries is wide unread (its distinct columns span at least that many);
        // a thread stops reading one once its own columns span 65,536 (then so do the group's): one row of
        // 4 M entries amid rows of 6 kept two threads 160 ms in one segment's loads, one after another.
        for (int j = end - start > 65536 ? end : start + lane; j < end && (long long)hi - lo < 65536; j += lanes) {
            lo = min(lo, indices[j]);
            hi = max(hi, indices[j]);
        }
        for (int o = lanes / 2; o > 0; o >>= 1) {
            lo = min(lo, __shfl_xor_sync(group, lo, o, lanes));
            hi = max(hi, __shfl_xor_sync(group, hi, o, lanes));
        }
        const bool fits = start == end || (end - start <= 65536 && (long long)hi - lo < 65536);
        const int lowest = start == end ? 0 : lo;
        if (lane == 0) {
            base[s] = fits ? lowest : -1;
            if (fits) found += (unsigned long long)(end - start);
        }
        if (fits) {
            for (int j = start + lane; j < end; j += lanes) offsets[j] = (unsigned short)(indices[j] - lowest);
        }
    }
    if (found) atomicAdd(&block_entries, found);
    __syncthreads();
    if (threadIdx.x == 0 && block_entries && narrow_entries) atomicAdd(narrow_entries, block_entries);
}
