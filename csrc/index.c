/*
 * Binary search over the sparse offset index and the time index.
 *
 * Offset index entry (8 bytes, little-endian):  u32 relative_offset | u32 position
 * Time index entry  (16 bytes, little-endian):  i64 timestamp_ms | u32 relative_offset | u32 position
 *
 * Entries are read with memcpy, so an index at any address is fine (a bytes slice handed
 * over from Python, a numpy view, a mapped file).
 */
#define _FILE_OFFSET_BITS 64
#include "pylog.h"
#include "endian.h"

#include <string.h>


#define REL(i) plog_ld32(index + (i) * PLOG_INDEX_ENTRY_SIZE)

int plog_index_lookup(const uint8_t *index, size_t n, uint32_t rel, size_t *slot) {
    /* largest i with entry[i].rel <= rel. Invariant: entries below lo are <= rel, entries
     * from hi on are > rel. Records of a log tend to be of similar size, so index entries
     * (one per interval of bytes) are close to evenly spaced in offset: a guess interpolated
     * between the ends lands at or next to the answer, and a random read of a big segment
     * touches two or three cache lines of the index instead of log2(n). Entries are strictly
     * increasing (plog_index_check), so each guess narrows [lo, hi); after three guesses a
     * plain bisection finishes, so skewed indexes cost at most three extra probes. */
    size_t lo = 0, hi = n;
    for (int round = 0; round < 3 && hi - lo > 8; round++) {
        uint32_t a = REL(lo), b = REL(hi - 1);
        if (rel < a) { hi = lo; break; }
        if (rel >= b) { lo = hi; break; }
        /* a <= rel < b, so lo <= g < hi - 1 */
        size_t g = lo + (size_t)((uint64_t)(rel - a) * (uint64_t)(hi - 1 - lo) / (uint64_t)(b - a));
        if (REL(g) <= rel) {
            lo = g + 1;
            if (REL(lo) > rel) { hi = lo; break; } /* the usual case: the guess was the answer */
        } else {
            hi = g;
        }
    }
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (plog_ld32(index + mid * PLOG_INDEX_ENTRY_SIZE) <= rel)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return PLOG_E_NOT_FOUND;
    *slot = lo - 1;
    return PLOG_OK;
}

int plog_timeindex_lookup(const uint8_t *tindex, size_t n, int64_t ts, size_t *slot) {
    /* last i with entry[i].timestamp < ts */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((int64_t)plog_ld64(tindex + mid * PLOG_TIMEINDEX_ENTRY_SIZE) < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0) return PLOG_E_NOT_FOUND;
    *slot = lo - 1;
    return PLOG_OK;
}

int plog_index_check(const uint8_t *index, size_t n, uint64_t store_len, size_t *bad_slot) {
    uint32_t prev_rel = 0, prev_pos = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = index + i * PLOG_INDEX_ENTRY_SIZE;
        uint32_t rel = plog_ld32(e), pos = plog_ld32(e + 4);
        if (pos < PLOG_FILE_HEADER_SIZE || (uint64_t)pos + PLOG_FRAME_HEADER_SIZE > store_len ||
            (i > 0 && (rel <= prev_rel || pos <= prev_pos))) {
            *bad_slot = i;
            return PLOG_E_OFFSET;
        }
        prev_rel = rel;
        prev_pos = pos;
    }
    return PLOG_OK;
}

int plog_timeindex_check(const uint8_t *tindex, size_t n, uint64_t store_len, size_t *bad_slot) {
    int64_t prev_ts = 0;
    uint32_t prev_rel = 0, prev_pos = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = tindex + i * PLOG_TIMEINDEX_ENTRY_SIZE;
        int64_t ts = (int64_t)plog_ld64(e);
        uint32_t rel = plog_ld32(e + 8), pos = plog_ld32(e + 12);
        if (pos < PLOG_FILE_HEADER_SIZE || (uint64_t)pos + PLOG_FRAME_HEADER_SIZE > store_len ||
            (i > 0 && (ts < prev_ts || rel <= prev_rel || pos <= prev_pos))) {
            *bad_slot = i;
            return PLOG_E_OFFSET;
        }
        prev_ts = ts;
        prev_rel = rel;
        prev_pos = pos;
    }
    return PLOG_OK;
}
