/*
 * CRC32C (Castagnoli) with run-time dispatch:
 *   - SSE4.2 crc32 instructions on x86-64,
 *   - ARMv8 CRC32 instructions on aarch64 and 32-bit ARMv8 (AArch32),
 *   - portable slicing-by-8 everywhere else.
 * The hardware paths run three interleaved streams over 3 x 8 KiB (then 3 x 256 B) blocks
 * and combine them with the zero-shift tables of crc32c_tables.h, so the CRC unit's
 * 3-cycle latency does not limit throughput.
 *
 * plog_crc32c_select(1) forces the portable path (pylog sets it from the environment
 * variable PYLOG_CRC32C_FORCE_PORTABLE at import), so the fallback is tested on CPUs that
 * have the instructions.
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
typedef void (*crc3_fn)(const uint8_t *const[3], const size_t[3], uint32_t[3]);

/* Three CRCs one after the other: the portable path, and crc_hw3 where there is no hardware. */
static void crc_portable3(const uint8_t *const p[3], const size_t len[3], uint32_t out[3]) {
    for (int i = 0; i < 3; i++) out[i] = plog_crc32c_portable(0, p[i], len[i]);
}

/* Three independent CRCs at once (three frames' bodies): one interleaved loop over their
 * common 8-byte-aligned length keeps three CRC instructions in flight, then each buffer's
 * rest goes through the single-buffer loop. Nothing needs combining. */
#define PLOG_HW3_BODY(CRC64, SINGLE)                                                         \
    size_t m = len[0] < len[1] ? len[0] : len[1];                                          \
    if (len[2] < m) m = len[2];                                                            \
    m &= ~(size_t)7;                                                                       \
    uint64_t a = 0xffffffffu, b = 0xffffffffu, c = 0xffffffffu;                           \
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
#include <nmmintrin.h>
#define PLOG_HW_NAME PLOG_CRC_SSE42
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *buf,
                                                         size_t len) {
#define X86_CRC8(c, b) _mm_crc32_u8((c), (b))
#define X86_CRC64(c, v) _mm_crc32_u64((c), (v))
    PLOG_HW_BODY(X86_CRC8, X86_CRC64)
}
__attribute__((target("sse4.2"))) static void crc_hw3(const uint8_t *const p[3],
                                                      const size_t len[3], uint32_t out[3]) {
    PLOG_HW3_BODY(X86_CRC64, crc_hw)
}
static int hw_detect(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

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
__attribute__((target("+crc"))) static void crc_hw3(const uint8_t *const p[3],
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
static void crc_hw3(const uint8_t *const p[3], const size_t len[3], uint32_t out[3]) {
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

/* The chosen implementation. 0 = not chosen yet; chosen on first use or by select(). Both
 * candidates compute the same function, so a benign race on first use is harmless; the
 * atomics keep the compiler honest about it. */
static int chosen_impl = -1;
static crc_fn chosen_fn = 0;
static crc3_fn chosen_fn3 = 0;

void plog_crc32c_select(int force_portable) {
    int hw = !force_portable && hw_detect();
    /* fn3 first: a reader that sees the new fn also sees the matching fn3 */
    __atomic_store_n(&chosen_fn3, hw ? crc_hw3 : crc_portable3, __ATOMIC_RELEASE);
    __atomic_store_n(&chosen_fn, hw ? crc_hw : plog_crc32c_portable, __ATOMIC_RELEASE);
    __atomic_store_n(&chosen_impl, hw ? PLOG_HW_NAME : PLOG_CRC_PORTABLE, __ATOMIC_RELEASE);
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
    current();
    __atomic_load_n(&chosen_fn3, __ATOMIC_ACQUIRE)(bufs, lens, out);
}

uint32_t plog_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len) {
    return hw_detect() ? crc_hw(crc, buf, len) : plog_crc32c_portable(crc, buf, len);
}

int plog_crc32c_hw_available(void) { return hw_detect() && PLOG_HW_NAME != PLOG_CRC_PORTABLE; }

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
