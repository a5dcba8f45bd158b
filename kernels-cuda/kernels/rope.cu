// Rotary position embedding (RoFormer, Su et al. 2021) on the first rot_dim dims of each head;
// the remaining dims are copied. x, y [N, H, hd] in T; positions [N] u32; inv_freq [rot_dim/2] f32.
// angle = positions[n] * inv_freq[i] (f32); cos/sin are scaled by mscale.
// style 0 = half-split (dim i pairs with i + rot/2), 1 = interleaved (2i pairs with 2i+1).
// grid.x = N tokens (grid-stride), grid.y = blocks sharing a token's elements (a decode step
// has too few tokens to fill the GPU with one block each), block = 256 threads.

// A second tensor xk [N, Hk, hd] (rope_pair: queries and keys in one launch) takes elements
// [H·hd, (H + Hk)·hd) of each token's loop; Hk = 0 for one tensor. Every element is computed
// alone, so the pair is bit-equal to two launches.
//
// With a paged cache (rope_write_kv: `kc` non-null) the rotated keys go straight to their
// cache rows k_cache[slots[t]] instead of `yk`, and the values v [N, Hk, hdv] are copied to
// v_cache[slots[t]] by a third range of each token's loop — bit-equal to rope_pair then
// write_kv (kv_cache.cu), without the second launch or the keys' round trip. Slots at or past
// num_slots (padding tokens) are skipped, as write_kv does.
struct RopeCache {
    const void* v;  // [N, Hk, hdv]
    void* kc;       // [blocks · bs, Hk, hd] or null (no cache write)
    void* vc;       // [blocks · bs, Hk, hdv]
    const u32* slots;
    u32 num_slots;
    u32 hdv;
};

template <typename T>
__device__ void rope_impl(const T* __restrict__ x, const u32* __restrict__ positions,
                          const float* __restrict__ inv_freq, T* __restrict__ y, u32 n, u32 h,
                          u32 hd, u32 rot, u32 style, float mscale, const T* __restrict__ xk,
                          T* __restrict__ yk, u32 hk, const RopeCache& cache) {
    grid_dep_wait();
    const u32 half = rot / 2;
    const u32 per_q = h * hd, per_k = hk * hd;
    T* kc = static_cast<T*>(cache.kc);
    const u32 per_v = kc ? hk * cache.hdv : 0;
    for (u32 t = blockIdx.x; t < n; t += gridDim.x) {
        const float pos = (float)positions[t];
        const u32 slot = kc ? cache.slots[t] : 0;
        T* krow = kc && slot < cache.num_slots ? kc + (u64)slot * per_k : nullptr;
        for (u32 f = blockIdx.y * blockDim.x + threadIdx.x; f < per_q + per_k + per_v;
             f += blockDim.x * gridDim.y) {
            if (f >= per_q + per_k) {
                const u32 e = f - per_q - per_k;
                if (krow)
                    static_cast<T*>(cache.vc)[(u64)slot * per_v + e] =
                        static_cast<const T*>(cache.v)[(u64)t * per_v + e];
                continue;
            }
            const bool q = f < per_q;
            const u32 e = q ? f : f - per_q;
            const T* xt = q ? x + (u64)t * per_q : xk + (u64)t * per_k;
            T* yt = q ? y + (u64)t * per_q : (kc ? krow : yk + (u64)t * per_k);
            if (!yt) continue;  // a padding token's key
            const u32 d = e % hd;
            const float xv = to_f(xt[e]);
            if (d >= rot) { yt[e] = xt[e]; continue; }
            u32 i, partner;
            float sign;
            if (style == 0) {
                if (d < half) { i = d; partner = e + half; sign = -1.f; }
                else { i = d - half; partner = e - half; sign = 1.f; }
            } else {
                i = d >> 1;
                if ((d & 1) == 0) { partner = e + 1; sign = -1.f; }
                else { partner = e - 1; sign = 1.f; }
            }
            float s, c;
            sincosf(pos * inv_freq[i], &s, &c);
            c *= mscale;
            s *= mscale;
            const float pv = to_f(xt[partner]);
            yt[e] = from_f<T>(xv * c + sign * pv * s);
        }
    }
}

#define ROPE(S, T)                                                                          \
    extern "C" __global__ void rope_##S(const T* x, const u32* positions, const float* inv_freq, \
                                        T* y, u32 n, u32 h, u32 hd, u32 rot, u32 style,     \
                                        float mscale, const T* xk, T* yk, u32 hk,           \
                                        RopeCache cache) {                                  \
        rope_impl<T>(x, positions, inv_freq, y, n, h, hd, rot, style, mscale, xk, yk, hk,   \
                     cache);                                                                \
    }
DAYONE_FOR_FLOAT_TYPES(ROPE)
