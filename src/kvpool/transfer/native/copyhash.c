/* kvpool's fused copy-and-checksum: copy n bytes and compute their XXH3-64 (seed 0) in one
 * pass over the memory (kvpool/transfer/native/__init__.py says why and how it is loaded).
 *
 * Written from the XXH3 specification for inputs longer than 240 bytes (the "long" path,
 * default secret, seed 0): eight 64-bit accumulators; every 64-byte stripe s of a 1024-byte
 * block adds, per lane i, data[i ^ 1] and lo32(k) * hi32(k) with k = data[i] ^ secret[8s + 8i];
 * after each full block the accumulators are scrambled; the last stripe of the input is
 * accumulated with the secret at 121; the accumulators are then merged and avalanched. The
 * tests compare every result with python-xxhash's xxh3_64 over many lengths and alignments.
 *
 * Every byte is hashed as it was stored into dst (the vector path hashes the very registers it
 * stores; the tail and the final stripe are read back from dst), so the checksum is always
 * the checksum of what dst holds, even when src changes during the copy (a torn read is then
 * caught by the caller's compare with the expected checksum).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvpool copyhash: little-endian targets only"
#endif

#define STRIPE 64
#define SECRET_SIZE 192
#define STRIPES_PER_BLOCK ((SECRET_SIZE - STRIPE) / 8) /* 16 */
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)             /* 1024 */
#define SCRAMBLE_AT (SECRET_SIZE - STRIPE)             /* 128 */
#define LAST_STRIPE_AT (SECRET_SIZE - STRIPE - 7)      /* 121 */
#define MERGE_AT 11

#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL

/* The default secret of XXH3 (a constant of the algorithm). */
static const uint8_t SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
    0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
    0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
    0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
    0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
    0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
    0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
    0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
    0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
    0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
    0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
    0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
    0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t rd64(const void *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Accumulate one stripe at `in` (scalar). */
static inline void stripe(uint64_t acc[8], const uint8_t *in, const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t v = rd64(in + 8 * i);
        uint64_t k = v ^ rd64(secret + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
    }
}

static inline void scramble(uint64_t acc[8], const uint8_t *secret) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= rd64(secret + 8 * i);
        a *= P32_1;
        acc[i] = a;
    }
}

/* Copy and accumulate the first `nb_blocks` full blocks and then `nb_stripes` stripes (scalar). */
static void body_scalar(uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t nb_blocks,
                        size_t nb_stripes) {
    uint64_t v[8];
    for (size_t b = 0; b <= nb_blocks; b++) {
        size_t stripes = b < nb_blocks ? STRIPES_PER_BLOCK : nb_stripes;
        for (size_t s = 0; s < stripes; s++) {
            size_t at = b * BLOCK + s * STRIPE;
            memcpy(v, src + at, STRIPE);
            memcpy(dst + at, v, STRIPE);
            stripe(acc, (const uint8_t *)v, SECRET + 8 * s);
        }
        if (b < nb_blocks) scramble(acc, SECRET + SCRAMBLE_AT);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

__attribute__((target("avx2"))) static inline __m256i acc_avx2(__m256i acc, __m256i d, __m256i key) {
    __m256i k = _mm256_xor_si256(d, key);
    __m256i prod = _mm256_mul_epu32(k, _mm256_srli_epi64(k, 32));
    __m256i swapped = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2)); /* data[i ^ 1] */
    return _mm256_add_epi64(acc, _mm256_add_epi64(prod, swapped));
}

__attribute__((target("avx2"))) static inline __m256i scramble_avx2(__m256i acc, __m256i key) {
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)), key);
    __m256i prime = _mm256_set1_epi32((int)P32_1);
    __m256i lo = _mm256_mul_epu32(x, prime);
    __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), prime);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

/* `stream`: store with non-temporal stores (dst 32-byte aligned), which write around the cache:
 * no read of each destination line before it is overwritten, and the cache keeps what the
 * caller uses next. For a put, whose bytes this process does not read again. */
__attribute__((target("avx2"), always_inline)) static inline void body_avx2_impl(
    uint64_t acc[8], uint8_t *dst, const uint8_t *src, size_t nb_blocks, size_t nb_stripes,
    const int stream) {
    __m256i a0 = _mm256_loadu_si256((const __m256i *)acc);
    __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + 4));
    for (size_t b = 0; b <= nb_blocks; b++) {
        size_t stripes = b < nb_blocks ? STRIPES_PER_BLOCK : nb_stripes;
        const uint8_t *in = src + b * BLOCK;
        uint8_t *out = dst + b * BLOCK;
        for (size_t s = 0; s < stripes; s++) {
            __m256i d0 = _mm256_loadu_si256((const __m256i *)(in + s * STRIPE));
            __m256i d1 = _mm256_loadu_si256((const __m256i *)(in + s * STRIPE + 32));
            if (stream) {
                _mm256_stream_si256((__m256i *)(out + s * STRIPE), d0);
                _mm256_stream_si256((__m256i *)(out + s * STRIPE + 32), d1);
            } else {
                _mm256_storeu_si256((__m256i *)(out + s * STRIPE), d0);
                _mm256_storeu_si256((__m256i *)(out + s * STRIPE + 32), d1);
            }
            a0 = acc_avx2(a0, d0, _mm256_loadu_si256((const __m256i *)(SECRET + 8 * s)));
            a1 = acc_avx2(a1, d1, _mm256_loadu_si256((const __m256i *)(SECRET + 8 * s + 32)));
        }
        if (b < nb_blocks) {
            a0 = scramble_avx2(a0, _mm256_loadu_si256((const __m256i *)(SECRET + SCRAMBLE_AT)));
            a1 = scramble_avx2(a1, _mm256_loadu_si256((const __m256i *)(SECRET + SCRAMBLE_AT + 32)));
        }
    }
    if (stream) _mm_sfence(); /* the streamed bytes are visible before anything stored next */
    _mm256_storeu_si256((__m256i *)acc, a0);
    _mm256_storeu_si256((__m256i *)(acc + 4), a1);
}

__attribute__((target("avx2"))) static void body_avx2(uint64_t acc[8], uint8_t *dst,
                                                      const uint8_t *src, size_t nb_blocks,
                                                      size_t nb_stripes) {
    body_avx2_impl(acc, dst, src, nb_blocks, nb_stripes, 0);
}

__attribute__((target("avx2"))) static void body_avx2_stream(uint64_t acc[8], uint8_t *dst,
                                                             const uint8_t *src, size_t nb_blocks,
                                                             size_t nb_stripes) {
    body_avx2_impl(acc, dst, src, nb_blocks, nb_stripes, 1);
}
#endif

static inline uint64_t mul128_fold64(uint64_t a, uint64_t b) {
    __uint128_t p = (__uint128_t)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

static uint64_t merge(const uint64_t acc[8], const uint8_t *secret, uint64_t start) {
    uint64_t h = start;
    for (int i = 0; i < 4; i++)
        h += mul128_fold64(acc[2 * i] ^ rd64(secret + 16 * i), acc[2 * i + 1] ^ rd64(secret + 16 * i + 8));
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    h ^= h >> 32;
    return h;
}

/* The version of this file's interface; the loader refuses a library of another. */
int kv_copyhash_version(void) { return 3; }

static int use_avx2 = -1;

/* Which path kv_copy_xxh3 takes: 2 = AVX2, 1 = scalar. */
int kv_copyhash_path(void) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2 < 0) {
        __builtin_cpu_init();
        use_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return use_avx2 ? 2 : 1;
#else
    return 1;
#endif
}

/* Take the scalar path (1) or the best this CPU has (0) from now on (the tests run both);
 * returns the path now taken. */
int kv_copyhash_use(int path) {
    use_avx2 = path == 1 ? 0 : -1;
    return kv_copyhash_path();
}

/* Copy n bytes from src to dst (which must not overlap) and return the XXH3-64 (seed 0) of
 * the bytes now in dst. n must be at least 256: shorter inputs take other XXH3 paths; for them
 * nothing is copied and 0 is returned (the caller checks n first). `stream` non-zero: write
 * dst with non-temporal stores when dst is 32-byte aligned (the AVX2 path), for bytes this
 * process will not read again soon (a put); they are visible to other cores on return. */
uint64_t kv_copy_xxh3(void *dst_, const void *src_, size_t n, int stream) {
    uint8_t *dst = (uint8_t *)dst_;
    const uint8_t *src = (const uint8_t *)src_;
    if (n < 256) return 0;
    uint64_t acc[8] = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1};
    size_t nb_blocks = (n - 1) / BLOCK;
    size_t nb_stripes = ((n - 1) - BLOCK * nb_blocks) / STRIPE;
#ifdef HAVE_AVX2_PATH
    if (kv_copyhash_path() == 2) {
        if (stream && ((uintptr_t)dst & 31) == 0)
            body_avx2_stream(acc, dst, src, nb_blocks, nb_stripes);
        else
            body_avx2(acc, dst, src, nb_blocks, nb_stripes);
    } else
#endif
        body_scalar(acc, dst, src, nb_blocks, nb_stripes);
    size_t done = nb_blocks * BLOCK + nb_stripes * STRIPE;
    memcpy(dst + done, src + done, n - done); /* 1..64 bytes */
    stripe(acc, dst + n - STRIPE, SECRET + LAST_STRIPE_AT);
    return merge(acc, SECRET + MERGE_AT, (uint64_t)n * P64_1);
}
