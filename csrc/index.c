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


int plog_index_lookup(const uint8_t *index, size_t n, uint32_t rel, size_t *slot) {
    /* largest i with entry[i].rel <= rel */
    size_t lo = 0, hi = n;
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
