// Row gather: out[i] = table[ids[i]] (token embeddings, picking logit rows).
// Dtype-agnostic: rows are copied as bytes, 16 at a time when the row size allows.
// grid.x = N rows (grid-stride over rows), block = 256 threads. ids >= V give a zero row.

extern "C" __global__ void embedding_rows(const unsigned char* __restrict__ table,
                                          const u32* __restrict__ ids,
                                          unsigned char* __restrict__ out,
                                          u32 n, u32 v, u64 row_bytes) {
    grid_dep_wait();
    for (u32 i = blockIdx.x; i < n; i += gridDim.x) {
        const u32 id = ids[i];
        unsigned char* o = out + (u64)i * row_bytes;
        if ((row_bytes & 15) == 0) {
            uint4* o4 = reinterpret_cast<uint4*>(o);
            const u64 n4 = row_bytes >> 4;
            if (id >= v) {
                for (u64 j = threadIdx.x; j < n4; j += blockDim.x) o4[j] = make_uint4(0u, 0u, 0u, 0u);
            } else {
                const uint4* src = reinterpret_cast<const uint4*>(table + (u64)id * row_bytes);
                for (u64 j = threadIdx.x; j < n4; j += blockDim.x) o4[j] = src[j];
            }
        } else {
            const unsigned char* src = table + (u64)id * row_bytes;
            for (u64 j = threadIdx.x; j < row_bytes; j += blockDim.x) o[j] = id >= v ? 0 : src[j];
        }
    }
}
