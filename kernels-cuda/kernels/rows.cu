// Whole-row gathers and scatters along dimension 0 (read_rows / write_rows of many rows):
// rows are moved as raw bytes in units of V (uint4 = 16 bytes, u32 = 4, unsigned char = 1),
// the widest unit that divides the row size and both base addresses (chosen on the host).
// scatter: dst row ids[r] = src row r; gather: dst row r = src row ids[r]. The host checks
// every id against the tensor's row count and, for scatters, that no id repeats.
// grid.x = chunks of a row (grid-stride over units), grid.y = rows (grid-stride), any block size.

template <typename V>
__device__ __forceinline__ void move_rows(const V* __restrict__ src, V* __restrict__ dst,
                                          const u32* __restrict__ ids, u32 n, u64 row_units,
                                          bool scatter) {
    grid_dep_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u32 r = blockIdx.y; r < n; r += gridDim.y) {
        const u64 id = ids[r];
        const V* s = src + (scatter ? (u64)r : id) * row_units;
        V* d = dst + (scatter ? id : (u64)r) * row_units;
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < row_units; j += stride) {
            d[j] = s[j];
        }
    }
}

#define ROWS_KERNELS(SFX, V)                                                                   \
    extern "C" __global__ void rows_scatter_##SFX(const V* __restrict__ src,                  \
                                                  V* __restrict__ dst,                        \
                                                  const u32* __restrict__ ids, u32 n,         \
                                                  u64 row_units) {                            \
        move_rows<V>(src, dst, ids, n, row_units, true);                                      \
    }                                                                                         \
    extern "C" __global__ void rows_gather_##SFX(const V* __restrict__ src,                   \
                                                 V* __restrict__ dst,                         \
                                                 const u32* __restrict__ ids, u32 n,          \
                                                 u64 row_units) {                             \
        move_rows<V>(src, dst, ids, n, row_units, false);                                     \
    }

ROWS_KERNELS(16, uint4)
ROWS_KERNELS(4, u32)
ROWS_KERNELS(1, unsigned char)

// Rows between a tensor and chunks of page-locked, device-mapped host memory (the host-memory
// tier; kernels-cuda/src/host_rows.rs): to_host: chunk ptrs[r] = row ids[r] of t; from_host:
// row ids[r] of t = chunk ptrs[r]. The kernel reads or writes host memory directly over the
// bus, so no staging buffer and no host copy is involved. Same grid as above.
template <typename V>
__device__ __forceinline__ void move_ptr_rows(V* __restrict__ t, const u32* __restrict__ ids,
                                              const u64* __restrict__ ptrs, u32 n, u64 row_units,
                                              bool to_host) {
    grid_dep_wait();
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u32 r = blockIdx.y; r < n; r += gridDim.y) {
        V* row = t + (u64)ids[r] * row_units;
        V* host = reinterpret_cast<V*>(ptrs[r]);
        const V* s = to_host ? row : host;
        V* d = to_host ? host : row;
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < row_units; j += stride) {
            d[j] = s[j];
        }
    }
}

#define PTR_ROWS_KERNELS(SFX, V)                                                               \
    extern "C" __global__ void rows_to_ptrs_##SFX(V* t, const u32* ids, const u64* ptrs, u32 n, \
                                                  u64 row_units) {                            \
        move_ptr_rows<V>(t, ids, ptrs, n, row_units, true);                                   \
    }                                                                                         \
    extern "C" __global__ void rows_from_ptrs_##SFX(V* t, const u32* ids, const u64* ptrs,     \
                                                    u32 n, u64 row_units) {                   \
        move_ptr_rows<V>(t, ids, ptrs, n, row_units, false);                                  \
    }

PTR_ROWS_KERNELS(16, uint4)
PTR_ROWS_KERNELS(4, u32)
PTR_ROWS_KERNELS(1, unsigned char)
