/*
 * C-level self-test of pylog's core, built by scripts/test-arm.sh for x86-64 (under UBSan,
 * -fsanitize=alignment,undefined) and cross-built for aarch64 and armhf (run under
 * qemu-user on several CPU models, where an unaligned LDRD / VLDR / atomic faults).
 *
 *   - CRC32C: the check value, the RFC 3720 vectors, every start address 0..15 x every
 *     length 0..300 and random long buffers (through the 3-stream hardware loop) against a
 *     bit-at-a-time reference, for the dispatched, portable and hardware entry points;
 *     incremental use; the batch call.
 *   - store.c / index.c on buffers at odd addresses: headers, batch framing, recover, scan,
 *     find, index and time-index search and checks.
 *
 * PYLOG_CRC32C_FORCE_PORTABLE=1 forces the portable path (as pylog does at import);
 * PYLOG_EXPECT_CRC_IMPL=portable|armv8-crc|sse4.2 makes a different choice a failure.
 * Prints one line: "c-selftest: <machine> impl <name> hw <0|1>: N checks, M failed".
 */
#define _FILE_OFFSET_BITS 64
#define _GNU_SOURCE
#include "pylog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

/* 64-bit file offsets must reach every translation unit, 32-bit ARM included. */
_Static_assert(sizeof(off_t) == 8, "_FILE_OFFSET_BITS=64 did not take effect");

static unsigned long checks, failures;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        checks++;                                             \
        if (!(cond)) {                                        \
            if (failures++ < 20) {                            \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
                fprintf(stderr, __VA_ARGS__);                 \
                fputc('\n', stderr);                          \
            }                                                 \
        }                                                     \
    } while (0)

static uint32_t crc_ref(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* the x86-64 folding path's fused block: 32 KiB folded + 3 x 8 KiB crc32 streams */
#define FUSED (32768 + 3 * 8192)

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);
static const struct {
    const char *name;
    crc_fn fn;
} FNS[] = {{"dispatch", plog_crc32c},
           {"portable", plog_crc32c_portable},
           {"hw", plog_crc32c_hw},
           {"clmul", plog_crc32c_clmul}};
#define NFNS (sizeof FNS / sizeof FNS[0])

static void test_crc(void) {
    static uint8_t buf[3 * FUSED + 16];
    uint8_t v[32];
    for (size_t f = 0; f < NFNS; f++) {
        crc_fn fn = FNS[f].fn;
        CHECK(fn(0, (const uint8_t *)"123456789", 9) == 0xE3069283u, "%s check value", FNS[f].name);
        memset(v, 0, 32);
        CHECK(fn(0, v, 32) == 0x8A9136AAu, "%s 32 x 00", FNS[f].name);
        memset(v, 0xff, 32);
        CHECK(fn(0, v, 32) == 0x62A8AB43u, "%s 32 x FF", FNS[f].name);
        for (int i = 0; i < 32; i++) v[i] = (uint8_t)i;
        CHECK(fn(0, v, 32) == 0x46DD794Eu, "%s 00..1F", FNS[f].name);
        for (int i = 0; i < 32; i++) v[i] = (uint8_t)(31 - i);
        CHECK(fn(0, v, 32) == 0x113FDB5Cu, "%s 1F..00", FNS[f].name);
    }
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)rnd();
    for (size_t start = 0; start < 16; start++)
        for (size_t len = 0; len <= 300; len++) {
            uint32_t want = crc_ref(0, buf + start, len);
            for (size_t f = 0; f < NFNS; f++)
                CHECK(FNS[f].fn(0, buf + start, len) == want, "%s start %zu len %zu", FNS[f].name,
                      start, len);
        }
    /* Long buffers cross the 3 x 8 KiB and 3 x 256 B interleaved blocks, and the folding
     * path's 128-byte steps and fused blocks. */
    static const size_t lens[] = {767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 777, 70000,
                                  FUSED - 1, FUSED, FUSED + 1, FUSED + 255, FUSED + 256,
                                  FUSED + 383, 2 * FUSED + 129, 3 * FUSED};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t start = rnd() % 16;
        uint32_t want = crc_ref(0, buf + start, lens[i]);
        for (size_t f = 0; f < NFNS; f++)
            CHECK(FNS[f].fn(0, buf + start, lens[i]) == want, "%s long %zu", FNS[f].name, lens[i]);
        /* incremental: any split gives the same value */
        size_t cut = rnd() % lens[i];
        uint32_t c = plog_crc32c(plog_crc32c(0, buf + start, cut), buf + start + cut, lens[i] - cut);
        CHECK(c == want, "incremental split %zu of %zu", cut, lens[i]);
    }
    uint64_t pos[5] = {1, 3, 7, 100, 1001};
    uint32_t ln[5] = {0, 9, 64, 777, 4096}, out[5];
    CHECK(plog_crc32c_batch(buf, sizeof buf, pos, ln, 5, out) == PLOG_OK, "batch rc");
    for (int i = 0; i < 5; i++) CHECK(out[i] == crc_ref(0, buf + pos[i], ln[i]), "batch %d", i);
    ln[4] = (uint32_t)sizeof buf;
    CHECK(plog_crc32c_batch(buf, sizeof buf, pos, ln, 5, out) == PLOG_E_ARG, "batch bounds");
    /* three at once (batch framing's path): unequal lengths, odd addresses */
    for (int t = 0; t < 300; t++) {
        size_t l3[3];
        const uint8_t *p3[3];
        uint32_t o3[3];
        for (int i = 0; i < 3; i++) {
            l3[i] = t < 100 ? (size_t)(rnd() % 64) : (size_t)(rnd() % 5000);
            p3[i] = buf + rnd() % (sizeof buf - 5000);
        }
        plog_crc32c_3(p3, l3, o3);
        for (int i = 0; i < 3; i++)
            CHECK(o3[i] == crc_ref(0, p3[i], l3[i]), "crc32c_3 #%d len %zu", i, l3[i]);
    }
}

/* Framing, recovery, scan, find and index search, every buffer at an odd address. */
static void test_store_unaligned(void) {
    static uint8_t store_mem[1 << 16], idx_mem[4096], tidx_mem[8192];
    uint8_t *store = store_mem + 1, *idx = idx_mem + 3, *tidx = tidx_mem + 5;
    const uint8_t magic[8] = {'P', 'Y', 'L', 'O', 'G', 'S', 'T', 'O'};
    enum { N = 200 };
    uint64_t base = 1000;

    CHECK(plog_header_encode(store, magic, base, 0) == PLOG_OK, "header encode");
    uint64_t got_base = 0;
    uint32_t flags = 9;
    CHECK(plog_header_check(store, PLOG_FILE_HEADER_SIZE, magic, &got_base, &flags) == PLOG_OK &&
              got_base == base && flags == 0, "header check");

    /* n records with values of varying length, keys on even records, one timestamp each */
    static uint8_t values[N * 40 + 1], keys[N * 4 + 1];
    static uint32_t vlens[N], klens[N];
    static int64_t ts[N];
    size_t vtot = 0, ktot = 0;
    for (int i = 0; i < N; i++) {
        vlens[i] = (uint32_t)(rnd() % 40);
        for (uint32_t j = 0; j < vlens[i]; j++) values[1 + vtot + j] = (uint8_t)rnd();
        vtot += vlens[i];
        klens[i] = (i % 2) ? (uint32_t)PLOG_NULL_LEN : 4;
        if (!(i % 2)) { memcpy(keys + 1 + ktot, &i, 4); ktot += 4; }
        ts[i] = 1700000000000LL + i * 7;
    }
    plog_appender st;
    memset(&st, 0, sizeof st);
    st.base_offset = st.next_offset = base;
    st.position = PLOG_FILE_HEADER_SIZE;
    st.max_position = sizeof store_mem - 1;
    st.max_timestamp = INT64_MIN;
    st.index_interval = 64;
    st.bytes_since_index = 64; /* a new segment indexes its first record */
    st.index = idx;
    st.index_cap = (sizeof idx_mem - 3) / PLOG_INDEX_ENTRY_SIZE;
    st.timeindex = tidx;
    st.timeindex_cap = (sizeof tidx_mem - 5) / PLOG_TIMEINDEX_ENTRY_SIZE;
    size_t n_done = 0, written = 0;
    int rc = plog_frame_batch(&st, store + PLOG_FILE_HEADER_SIZE,
                              sizeof store_mem - 1 - PLOG_FILE_HEADER_SIZE, values + 1, vlens,
                              keys + 1, klens, NULL, NULL, ts, 0, N, &n_done, &written);
    CHECK(rc == PLOG_OK && n_done == N, "frame_batch rc %d done %zu", rc, n_done);
    size_t len = PLOG_FILE_HEADER_SIZE + written;
    CHECK(st.position == len && st.next_offset == base + N, "appender state");

    /* the same records laid out with header gaps (at an odd address) and framed in place */
    static uint8_t laid_mem[1 << 16];
    uint8_t *laid = laid_mem + 3;
    size_t lp = 0, vo = 0, ko = 0;
    for (size_t i = 0; i < N; i++) {
        lp += PLOG_FRAME_HEADER_SIZE;
        if (klens[i] != (uint32_t)PLOG_NULL_LEN) {
            memcpy(laid + lp, keys + 1 + ko, klens[i]);
            lp += klens[i];
            ko += klens[i];
        }
        memcpy(laid + lp, values + 1 + vo, vlens[i]);
        lp += vlens[i];
        vo += vlens[i];
    }
    static uint8_t idx3_mem[4096], tidx3_mem[8192];
    plog_appender ip = st;
    ip.next_offset = base;
    ip.position = PLOG_FILE_HEADER_SIZE;
    ip.max_timestamp = INT64_MIN;
    ip.bytes_since_index = 64;
    ip.index = idx3_mem + 5;
    ip.timeindex = tidx3_mem + 1;
    ip.index_count = ip.timeindex_count = 0;
    ip.used = 0;
    CHECK(plog_frame_in_place(&ip, laid, lp - 1, vlens, klens, NULL, ts, 0, N, &n_done, &written) ==
              PLOG_E_ARG, "frame_in_place refuses a short buffer");
    rc = plog_frame_in_place(&ip, laid, lp, vlens, klens, NULL, ts, 0, N, &n_done, &written);
    CHECK(rc == PLOG_OK && n_done == N && written == lp && lp == len - PLOG_FILE_HEADER_SIZE,
          "frame_in_place rc %d done %zu", rc, n_done);
    CHECK(memcmp(laid, store + PLOG_FILE_HEADER_SIZE, lp) == 0, "in-place frames = copied frames");
    CHECK(ip.index_count == st.index_count &&
              memcmp(ip.index, idx, ip.index_count * PLOG_INDEX_ENTRY_SIZE) == 0, "in-place index");
    CHECK(ip.timeindex_count == st.timeindex_count &&
              memcmp(ip.timeindex, tidx, ip.timeindex_count * PLOG_TIMEINDEX_ENTRY_SIZE) == 0,
          "in-place time index");
    size_t nidx = (size_t)st.index_count;
    CHECK(nidx > 2 && st.timeindex_count == nidx, "index entries %zu", nidx);
    size_t bad = 0;
    CHECK(plog_index_check(idx, nidx, len, &bad) == PLOG_OK, "index check slot %zu", bad);
    CHECK(plog_timeindex_check(tidx, nidx, len, &bad) == PLOG_OK, "timeindex check slot %zu", bad);

    /* recover rebuilds the same index */
    static uint8_t idx2_mem[4096], tidx2_mem[8192];
    plog_appender r;
    memset(&r, 0, sizeof r);
    r.base_offset = r.next_offset = base;
    r.position = PLOG_FILE_HEADER_SIZE;
    r.max_position = st.max_position;
    r.max_timestamp = INT64_MIN;
    r.index_interval = 64;
    r.bytes_since_index = 64;
    r.index = idx2_mem + 1;
    r.index_cap = st.index_cap;
    r.timeindex = tidx2_mem + 7;
    r.timeindex_cap = st.timeindex_cap;
    uint64_t nf = 0;
    CHECK(plog_recover(store, len, &r, &nf) == PLOG_OK && nf == N, "recover %llu", (unsigned long long)nf);
    CHECK(r.index_count == nidx && memcmp(r.index, idx, nidx * PLOG_INDEX_ENTRY_SIZE) == 0 &&
              memcmp(r.timeindex, tidx, nidx * PLOG_TIMEINDEX_ENTRY_SIZE) == 0, "recovered index");

    /* scan everything; check each frame's fields */
    static plog_frame frames[N];
    size_t n_out = 0;
    uint64_t end = 0;
    rc = plog_scan(store, len, PLOG_FILE_HEADER_SIZE, base, 0, frames, N, UINT64_MAX, &n_out, &end);
    CHECK(rc == PLOG_OK && n_out == N && end == len, "scan rc %d n %zu", rc, n_out);
    size_t voff = 0;
    for (size_t i = 0; i < n_out; i++) {
        const plog_frame *f = &frames[i];
        CHECK(f->offset == base + i && f->timestamp == ts[i] && f->value_length == vlens[i],
              "frame %zu fields", i);
        const uint8_t *val = store + f->position + PLOG_FRAME_HEADER_SIZE + f->key_length;
        CHECK(memcmp(val, values + 1 + voff, vlens[i]) == 0, "frame %zu value", i);
        voff += vlens[i];
    }

    /* find every offset through the index, and by time */
    for (int i = 0; i < N; i++) {
        plog_frame f;
        rc = plog_find(store, len, idx, nidx, base, base + (uint64_t)i, 0, &f);
        CHECK(rc == PLOG_OK && f.offset == base + (uint64_t)i, "find %d rc %d", i, rc);
        rc = plog_find_time(store, len, tidx, nidx, ts[i], &f);
        CHECK(rc == PLOG_OK && f.offset == base + (uint64_t)i, "find_time %d rc %d", i, rc);
    }
    size_t slot = 0;
    CHECK(plog_index_lookup(idx, nidx, 0, &slot) == PLOG_OK && slot == 0, "lookup 0");
    CHECK(plog_timeindex_lookup(tidx, nidx, ts[0], &slot) == PLOG_E_NOT_FOUND, "tlookup first");

    /* a flipped byte is a CRC error, a cut tail is short */
    store[len - 3] ^= 0x40;
    rc = plog_scan(store, len, PLOG_FILE_HEADER_SIZE, base, 0, frames, N, UINT64_MAX, &n_out, &end);
    CHECK(rc == PLOG_E_CRC && n_out == N - 1, "flipped byte rc %d n %zu", rc, n_out);
    store[len - 3] ^= 0x40;
    rc = plog_scan(store, len - 1, PLOG_FILE_HEADER_SIZE, base, 0, frames, N, UINT64_MAX, &n_out, &end);
    CHECK(rc == PLOG_E_SHORT && n_out == N - 1, "torn tail rc %d", rc);
}

int main(void) {
    const char *force = getenv("PYLOG_CRC32C_FORCE_PORTABLE"), *no_clmul = getenv("PYLOG_CRC32C_NO_CLMUL");
    plog_crc32c_select(force && strcmp(force, "1") == 0           ? PLOG_CRC_SELECT_PORTABLE
                       : no_clmul && strcmp(no_clmul, "1") == 0 ? PLOG_CRC_SELECT_NO_CLMUL
                                                                : PLOG_CRC_SELECT_BEST);
    int impl = plog_crc32c_impl();
    const char *name = impl == PLOG_CRC_ARMV8          ? "armv8-crc"
                       : impl == PLOG_CRC_SSE42_CLMUL ? "sse4.2+vpclmulqdq"
                       : impl == PLOG_CRC_SSE42       ? "sse4.2"
                                                      : "portable";
    test_crc();
    test_store_unaligned();
    const char *expect = getenv("PYLOG_EXPECT_CRC_IMPL");
    if (expect && *expect) CHECK(strcmp(expect, name) == 0, "impl %s, expected %s", name, expect);
#if defined(__aarch64__)
    const char *machine = "aarch64";
#elif defined(__arm__)
    const char *machine = "armv7";
#elif defined(__x86_64__)
    const char *machine = "x86_64";
#else
    const char *machine = "other";
#endif
    printf("c-selftest: %s impl %s hw %d clmul %d: %lu checks, %lu failed\n", machine, name,
           plog_crc32c_hw_available(), plog_crc32c_clmul_available(), checks, failures);
    return failures != 0;
}
