/*
 * CRC32C (Castagnoli) with run-time dispatch:
 *   - on x86-64 with VPCLMULQDQ and AVX2: carry-less multiplication folding fused with
 *     crc32 instructions for buffers of 256 bytes and more (below: as SSE4.2),
 *   - SSE4.2 crc32 instructions on x86-64,
 *   - ARMv8 CRC32 instructions on aarch64 and 32-bit ARMv8 (AArch32),
 *   - portable slicing-by-8 everywhere else.
 * The hardware paths run three interleaved streams over 3 x 8 KiB (then 3 x 256 B) blocks
 * and combine them with the zero-shift tables of crc32c_tables.h, so the CRC unit's
 * 3-cycle latency does not limit throughput.
 *
 * plog_crc32c_select(PLOG_CRC_SELECT_PORTABLE) forces the portable path and
 * plog_crc32c_select(PLOG_CRC_SELECT_NO_CLMUL) the crc32 instructions alone (pylog sets them
 * from the environment variables PYLOG_CRC32C_FORCE_PORTABLE and PYLOG_CRC32C_NO_CLMUL at
 * import), so each fallback is tested on CPUs that have the faster path.
 */
#define _FILE_OFFSET_BITS 64
#define _GNU_SOURCE
#include "pylog.h"
#include "endian.h"
#include "crc32c_tables.h"

#include <string.h>



/* ---- portable: slicing-by-8 ------------------------------------------------------------ */

static uint32_t crc_raw_portable(uint32_t c, const uint8_t *p, size_t len) {
    while (len && ((uintptr_t)p & 7)) {
        c = plog_crc32c_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t lo = plog_ld32(p) ^ c;
        uint32_t hi = plog_ld32(p + 4);
        c = plog_crc32c_table[7][lo & 0xff] ^ plog_crc32c_table[6][(lo >> 8) & 0xff] ^
            plog_crc32c_table[5][(lo >> 16) & 0xff] ^ plog_crc32c_table[4][lo >> 24] ^
            plog_crc32c_table[3][hi & 0xff] ^ plog_crc32c_table[2][(hi >> 8) & 0xff] ^
            plog_crc32c_table[1][(hi >> 16) & 0xff] ^ plog_crc32c_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) c = plog_crc32c_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

uint32_t plog_crc32c_portable(uint32_t crc, const uint8_t *buf, size_t len) {
    return ~crc_raw_portable(~crc, buf, len);
}

static inline uint32_t crc_shift(const uint32_t zeros[4][256], uint32_t c) {
    return zeros[0][c & 0xff] ^ zeros[1][(c >> 8) & 0xff] ^ zeros[2][(c >> 16) & 0xff] ^
           zeros[3][c >> 24];
}

/* ---- the interleaved hardware loop, instantiated once per instruction set ------------- */

#define PLOG_HW_BODY(CRC8, CRC64)                                                          \
    uint64_t c0 = (uint32_t)~crc, c1, c2;                                                  \
    const uint8_t *p = buf, *end;                                                          \
    while (len && ((uintptr_t)p & 7)) { c0 = CRC8((uint32_t)c0, *p++); len--; }            \
    while (len >= 3 * PLOG_CRC_LONG) {                                                     \
        c1 = 0; c2 = 0; end = p + PLOG_CRC_LONG;                                           \
        do {                                                                               \
            c0 = CRC64(c0, plog_ld64(p));                                                     \
            c1 = CRC64(c1, plog_ld64(p + PLOG_CRC_LONG));                                     \
            c2 = CRC64(c2, plog_ld64(p + 2 * PLOG_CRC_LONG));                                 \
            p += 8;                                                                        \
        } while (p < end);                                                                 \
        c0 = crc_shift(plog_crc32c_long, (uint32_t)c0) ^ (uint32_t)c1;                     \
        c0 = crc_shift(plog_crc32c_long, (uint32_t)c0) ^ (uint32_t)c2;                     \
        p += 2 * PLOG_CRC_LONG; len -= 3 * PLOG_CRC_LONG;                                  \
    }                                                                                      \
    while (len >= 3 * PLOG_CRC_SHORT) {                                                    \
        c1 = 0; c2 = 0; end = p + PLOG_CRC_SHORT;                                          \
        do {                                                                               \
            c0 = CRC64(c0, plog_ld64(p));                                                     \
            c1 = CRC64(c1, plog_ld64(p + PLOG_CRC_SHORT));                                    \
            c2 = CRC64(c2, plog_ld64(p + 2 * PLOG_CRC_SHORT));                                \
            p += 8;                                                                        \
        } while (p < end);                                                                 \
        c0 = crc_shift(plog_crc32c_short, (uint32_t)c0) ^ (uint32_t)c1;                    \
        c0 = crc_shift(plog_crc32c_short, (uint32_t)c0) ^ (uint32_t)c2;                    \
        p += 2 * PLOG_CRC_SHORT; len -= 3 * PLOG_CRC_SHORT;                                \
    }                                                                                      \
    while (len >= 8) { c0 = CRC64(c0, plog_ld64(p)); p += 8; len -= 8; }                      \
    while (len) { c0 = CRC8((uint32_t)c0, *p++); len--; }                                  \
    return ~(uint32_t)c0;

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
typedef void (*crc3_fn)(const uint32_t[3], const uint8_t *const[3], const size_t[3], uint32_t[3]);

/* Three CRCs one after the other: the portable path, and crc_hw3 where there is no hardware. */
static void crc_portable3(const uint32_t init[3], const uint8_t *const p[3], const size_t len[3],
                          uint32_t out[3]) {
    for (int i = 0; i < 3; i++) out[i] = plog_crc32c_portable(init[i], p[i], len[i]);
}

/* Three independent CRCs at once (three frames' bodies): one interleaved loop over their
 * common 8-byte-aligned length keeps three CRC instructions in flight, then each buffer's
 * rest goes through the single-buffer loop. Nothing needs combining. */
#define PLOG_HW3_BODY(CRC64, SINGLE)                                                         \
    size_t m = len[0] < len[1] ? len[0] : len[1];                                          \
    if (len[2] < m) m = len[2];                                                            \
    m &= ~(size_t)7;                                                                       \
    uint64_t a = ~init[0], b = ~init[1], c = ~init[2]; /* each from its init CRC */         \
    const uint8_t *pa = p[0], *pb = p[1], *pc = p[2];                                      \
    for (size_t i = 0; i < m; i += 8) {                                                    \
        a = CRC64(a, plog_ld64(pa + i));                                                   \
        b = CRC64(b, plog_ld64(pb + i));                                                   \
        c = CRC64(c, plog_ld64(pc + i));                                                   \
    }                                                                                      \
    out[0] = SINGLE(~(uint32_t)a, pa + m, len[0] - m);                                     \
    out[1] = SINGLE(~(uint32_t)b, pb + m, len[1] - m);                                     \
    out[2] = SINGLE(~(uint32_t)c, pc + m, len[2] - m);


#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PLOG_HW_NAME PLOG_CRC_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *buf,
                                                         size_t len) {
#define X86_CRC8(c, b) _mm_crc32_u8((c), (b))
#define X86_CRC64(c, v) _mm_crc32_u64((c), (v))
    PLOG_HW_BODY(X86_CRC8, X86_CRC64)
}
__attribute__((target("sse4.2"))) static void crc_hw3(const uint32_t init[3], const uint8_t *const p[3],
                                                      const size_t len[3], uint32_t out[3]) {
    PLOG_HW3_BODY(X86_CRC64, crc_hw)
}
static int hw_detect(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

/* ---- x86-64 with VPCLMULQDQ: folding by carry-less multiplication, fused with crc32 ----
 *
 * The message is a polynomial; its CRC depends only on it modulo P, so a 128-bit lane can be
 * replaced by its product with x^D mod P placed D bits further on ("folding", as in Intel's
 * paper "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"; the constants and
 * their derivation are in gen_tables.py). Four 256-bit registers fold 128 bytes a step; at
 * the end the eight lanes fold into one, whose CRC two crc32 instructions give.
 *
 * The carry-less multiplier and the crc32 unit are separate execution units, so large
 * buffers go through fused blocks: the first CLMUL_BLOCK bytes fold, while three crc32
 * streams run over the next 3 x PLOG_CRC_LONG bytes in the same loop; the four results
 * combine with the PLOG_CRC_LONG shift table. On the AMD Zen 3 this was tuned on, 1 MiB:
 * crc32 streams alone ~24 GB/s, folding alone ~25 GB/s, fused ~34 GB/s. */
#define CLMUL_STEPS (PLOG_CRC_LONG / 32) /* each step: 128 B folded, 32 B per crc32 stream */
#define CLMUL_BLOCK (CLMUL_STEPS * 128)
#define FUSED_BLOCK (CLMUL_BLOCK + 3 * PLOG_CRC_LONG)
#define CLMUL_MIN 256 /* below this the crc32 streams are as fast */
#define CLMUL_TARGET "sse4.2,pclmul,avx,avx2,vpclmulqdq"

__attribute__((target(CLMUL_TARGET))) static inline __m128i fold128(__m128i x) {
    const __m128i k = _mm_set_epi64x((long long)PLOG_CRC_FOLD_128_HI, (long long)PLOG_CRC_FOLD_128_LO);
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target(CLMUL_TARGET))) static inline __m256i fold1024(__m256i x) {
    const __m256i k = _mm256_set_epi64x((long long)PLOG_CRC_FOLD_1024_HI, (long long)PLOG_CRC_FOLD_1024_LO,
                                        (long long)PLOG_CRC_FOLD_1024_HI, (long long)PLOG_CRC_FOLD_1024_LO);
    return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00), _mm256_clmulepi64_epi128(x, k, 0x11));
}

#define LOAD256(q) _mm256_loadu_si256((const __m256i *)(const void *)(q))

/* The first 32 bytes of a folded region, with the raw CRC register c xored into its start
 * (the CRC of a message from c is the CRC from 0 of the message with c xored in front). */
__attribute__((target(CLMUL_TARGET))) static inline __m256i fold_first(const uint8_t *p, uint64_t c) {
    return _mm256_xor_si256(LOAD256(p), _mm256_set_epi64x(0, 0, 0, (long long)(uint32_t)c));
}

/* The raw CRC register after the 128-byte-aligned-in-length region that the four registers
 * folded (they were loaded with the register c already xored into the first bytes). */
__attribute__((target(CLMUL_TARGET))) static inline uint64_t fold_finish(__m256i y0, __m256i y1,
                                                                       __m256i y2, __m256i y3) {
    __m128i x = _mm256_castsi256_si128(y0);
    x = _mm_xor_si128(fold128(x), _mm256_extracti128_si256(y0, 1));
    x = _mm_xor_si128(fold128(x), _mm256_castsi256_si128(y1));
    x = _mm_xor_si128(fold128(x), _mm256_extracti128_si256(y1, 1));
    x = _mm_xor_si128(fold128(x), _mm256_castsi256_si128(y2));
    x = _mm_xor_si128(fold128(x), _mm256_extracti128_si256(y2, 1));
    x = _mm_xor_si128(fold128(x), _mm256_castsi256_si128(y3));
    x = _mm_xor_si128(fold128(x), _mm256_extracti128_si256(y3, 1));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    return _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
}

__attribute__((target(CLMUL_TARGET))) static uint32_t crc_clmul(uint32_t crc, const uint8_t *p,
                                                                size_t len) {
    if (len < CLMUL_MIN) return crc_hw(crc, p, len);
    uint64_t c = (uint32_t)~crc; /* the raw register */
    while (len >= FUSED_BLOCK) {
        const uint8_t *q = p + CLMUL_BLOCK;
        __m256i y0 = fold_first(p, c), y1 = LOAD256(p + 32), y2 = LOAD256(p + 64), y3 = LOAD256(p + 96);
        uint64_t c1 = 0, c2 = 0, c3 = 0;
        for (size_t i = 0; i < CLMUL_STEPS; i++) {
            const uint8_t *v = p + 128 * i, *s = q + 32 * i;
            if (i) {
                y0 = _mm256_xor_si256(fold1024(y0), LOAD256(v));
                y1 = _mm256_xor_si256(fold1024(y1), LOAD256(v + 32));
                y2 = _mm256_xor_si256(fold1024(y2), LOAD256(v + 64));
                y3 = _mm256_xor_si256(fold1024(y3), LOAD256(v + 96));
            }
            for (int j = 0; j < 32; j += 8) {
                c1 = _mm_crc32_u64(c1, plog_ld64(s + j));
                c2 = _mm_crc32_u64(c2, plog_ld64(s + PLOG_CRC_LONG + j));
                c3 = _mm_crc32_u64(c3, plog_ld64(s + 2 * PLOG_CRC_LONG + j));
            }
        }
        c = fold_finish(y0, y1, y2, y3);
        c = crc_shift(plog_crc32c_long, (uint32_t)c) ^ (uint32_t)c1;
        c = crc_shift(plog_crc32c_long, (uint32_t)c) ^ (uint32_t)c2;
        c = crc_shift(plog_crc32c_long, (uint32_t)c) ^ (uint32_t)c3;
        p += FUSED_BLOCK;
        len -= FUSED_BLOCK;
    }
    if (len >= CLMUL_MIN) { /* fold alone over the rest's multiple of 128 bytes */
        __m256i y0 = fold_first(p, c), y1 = LOAD256(p + 32), y2 = LOAD256(p + 64), y3 = LOAD256(p + 96);
        for (p += 128, len -= 128; len >= 128; p += 128, len -= 128) {
            y0 = _mm256_xor_si256(fold1024(y0), LOAD256(p));
            y1 = _mm256_xor_si256(fold1024(y1), LOAD256(p + 32));
            y2 = _mm256_xor_si256(fold1024(y2), LOAD256(p + 64));
            y3 = _mm256_xor_si256(fold1024(y3), LOAD256(p + 96));
        }
        c = fold_finish(y0, y1, y2, y3);
    }
    return crc_hw(~(uint32_t)c, p, len);
}

static int clmul_detect(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq");
}
#define PLOG_HAVE_CLMUL 1

#elif defined(__aarch64__)
#include <sys/auxv.h>
#include <arm_acle.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define PLOG_HW_NAME PLOG_CRC_ARMV8
__attribute__((target("+crc"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *buf,
                                                       size_t len) {
#define A64_CRC8(c, b) __crc32cb((c), (b))
#define A64_CRC64(c, v) __crc32cd((uint32_t)(c), (v))
    PLOG_HW_BODY(A64_CRC8, A64_CRC64)
}
__attribute__((target("+crc"))) static void crc_hw3(const uint32_t init[3], const uint8_t *const p[3],
                                                    const size_t len[3], uint32_t out[3]) {
    PLOG_HW3_BODY(A64_CRC64, crc_hw)
}
static int hw_detect(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }

#elif defined(__arm__) && defined(__GNUC__) && !defined(__clang__) && \
    (__ARM_ARCH >= 7) && defined(__ARM_FP)
/* 32-bit ARM: GCC's arm_acle.h declares the CRC intrinsics only when the target has
 * them when it is included, so the include and the function share one pragma region. */
#include <sys/auxv.h>
#ifndef HWCAP2_CRC32
#define HWCAP2_CRC32 (1 << 4)
#endif
#define PLOG_HW_NAME PLOG_CRC_ARMV8
#pragma GCC push_options
#pragma GCC target("arch=armv8-a+crc+simd")
#include <arm_acle.h>
static uint32_t crc_hw(uint32_t crc, const uint8_t *buf, size_t len) {
#define A32_CRC8(c, b) __crc32cb((c), (b))
#define A32_CRC64(c, v) __crc32cw(__crc32cw((uint32_t)(c), (uint32_t)(v)), (uint32_t)((v) >> 32))
    PLOG_HW_BODY(A32_CRC8, A32_CRC64)
}
static void crc_hw3(const uint32_t init[3], const uint8_t *const p[3], const size_t len[3],
                    uint32_t out[3]) {
    PLOG_HW3_BODY(A32_CRC64, crc_hw)
}
#pragma GCC pop_options
static int hw_detect(void) { return (getauxval(AT_HWCAP2) & HWCAP2_CRC32) != 0; }

#else
#define PLOG_HW_NAME PLOG_CRC_PORTABLE
static uint32_t crc_hw(uint32_t crc, const uint8_t *buf, size_t len) {
    return plog_crc32c_portable(crc, buf, len);
}
#define crc_hw3 crc_portable3
static int hw_detect(void) { return 0; }
#endif

#ifndef PLOG_HAVE_CLMUL
#define crc_clmul crc_hw
static int clmul_detect(void) { return 0; }
#endif

/* The chosen implementation: chosen_fn is null until the first use or select() picks one.
 * Every candidate computes the same function, so a race on first use is harmless; the
 * atomics keep the compiler honest about it. chosen_fn is published last, so a thread that
 * sees it also sees the matching chosen_fn3 and chosen_impl. (Two select() calls with
 * different modes at once may mix the three: pylog calls select() once, at import.) */
static int chosen_impl = PLOG_CRC_PORTABLE;
static crc_fn chosen_fn = 0;
static crc3_fn chosen_fn3 = 0;

void plog_crc32c_select(int mode) {
    int hw = mode != PLOG_CRC_SELECT_PORTABLE && hw_detect() && PLOG_HW_NAME != PLOG_CRC_PORTABLE;
    int clmul = hw && mode == PLOG_CRC_SELECT_BEST && clmul_detect();
    /* (the three-buffer loop is the crc32 instruction's in both hardware cases: frames are
     * short) */
    __atomic_store_n(&chosen_fn3, hw ? crc_hw3 : crc_portable3, __ATOMIC_RELEASE);
    __atomic_store_n(&chosen_impl, clmul ? PLOG_CRC_SSE42_CLMUL : hw ? PLOG_HW_NAME : PLOG_CRC_PORTABLE,
                     __ATOMIC_RELEASE);
    __atomic_store_n(&chosen_fn, clmul ? crc_clmul : hw ? crc_hw : plog_crc32c_portable, __ATOMIC_RELEASE);
}

static inline crc_fn current(void) {
    crc_fn f = __atomic_load_n(&chosen_fn, __ATOMIC_ACQUIRE);
    if (!f) {
        plog_crc32c_select(0);
        f = __atomic_load_n(&chosen_fn, __ATOMIC_ACQUIRE);
    }
    return f;
}

uint32_t plog_crc32c(uint32_t crc, const uint8_t *buf, size_t len) {
    return current()(crc, buf, len);
}

void plog_crc32c_3(const uint8_t *const bufs[3], const size_t lens[3], uint32_t out[3]) {
    static const uint32_t zero[3] = {0, 0, 0};
    current();
    __atomic_load_n(&chosen_fn3, __ATOMIC_ACQUIRE)(zero, bufs, lens, out);
}

void plog_crc32c_3_from(const uint32_t init[3], const uint8_t *const bufs[3], const size_t lens[3],
                        uint32_t out[3]) {
    current();
    __atomic_load_n(&chosen_fn3, __ATOMIC_ACQUIRE)(init, bufs, lens, out);
}

uint32_t plog_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len) {
    return hw_detect() ? crc_hw(crc, buf, len) : plog_crc32c_portable(crc, buf, len);
}

int plog_crc32c_hw_available(void) { return hw_detect() && PLOG_HW_NAME != PLOG_CRC_PORTABLE; }

uint32_t plog_crc32c_clmul(uint32_t crc, const uint8_t *buf, size_t len) {
    return clmul_detect() ? crc_clmul(crc, buf, len) : plog_crc32c_hw(crc, buf, len);
}

int plog_crc32c_clmul_available(void) { return clmul_detect(); }

int plog_crc32c_impl(void) {
    current();
    return __atomic_load_n(&chosen_impl, __ATOMIC_ACQUIRE);
}

int plog_crc32c_batch(const uint8_t *buf, size_t len, const uint64_t *positions,
                      const uint32_t *lengths, size_t n, uint32_t *out) {
    crc_fn f = current();
    for (size_t i = 0; i < n; i++) {
        if (positions[i] > len || lengths[i] > len - positions[i]) return PLOG_E_ARG;
        out[i] = f(0, buf + positions[i], lengths[i]);
    }
    return PLOG_OK;
}
