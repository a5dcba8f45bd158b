// Paged KV-cache writes: dst row slots[i] = src row i, for the key and the value cache.
// A cache row is one token's [Hkv, hd] block, contiguous in the [blocks, bs, Hkv, hd] layout,
// so the op is a byte-row scatter. Slots >= num_slots (padding tokens) are skipped.
// grid.x = N tokens (grid-stride), block = 256 threads.

__device__ __forceinline__ void scatter_row(const unsigned char* __restrict__ src,
                                            unsigned char* __restrict__ dst, u64 row_bytes) {
    if ((row_bytes & 15) == 0) {
        const uint4* s4 = reinterpret_cast<const uint4*>(src);
        uint4* d4 = reinterpret_cast<uint4*>(dst);
        for (u64 j = threadIdx.x; j < (row_bytes >> 4); j += blockDim.x) d4[j] = s4[j];
    } else {
        for (u64 j = threadIdx.x; j < row_bytes; j += blockDim.x) dst[j] = src[j];
    }
}

extern "C" __global__ void write_kv(const unsigned char* __restrict__ k,
                                    const unsigned char* __restrict__ v,
                                    unsigned char* __restrict__ k_cache,
                                    unsigned char* __restrict__ v_cache,
                                    const u32* __restrict__ slots, u32 n, u32 num_slots,
                                    u64 k_row_bytes, u64 v_row_bytes) {
    grid_dep_wait();
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        const u32 slot = slots[i];
        if (slot >= num_slots) continue;
        scatter_row(k + (u64)i * k_row_bytes, k_cache + (u64)slot * k_row_bytes, k_row_bytes);
        scatter_row(v + (u64)i * v_row_bytes, v_cache + (u64)slot * v_row_bytes, v_row_bytes);
    }
}
