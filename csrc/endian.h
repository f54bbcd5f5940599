/*
 * Little-endian loads and stores at any address (internal to the C core).
 *
 * Every multi-byte field of the format is little-endian and may sit at any alignment, so
 * it goes through memcpy (which compilers turn into one load on x86 and ARMv8, and which
 * never faults on ARMv7, where an unaligned LDRD does), byte-swapped on big-endian hosts.
 */
#ifndef PYLOG_ENDIAN_H
#define PYLOG_ENDIAN_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define PLOG_BIG_ENDIAN 1
#else
#define PLOG_BIG_ENDIAN 0
#endif

static inline uint32_t plog_ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return PLOG_BIG_ENDIAN ? __builtin_bswap32(v) : v;
}

static inline uint64_t plog_ld64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return PLOG_BIG_ENDIAN ? __builtin_bswap64(v) : v;
}

static inline void plog_st32(uint8_t *p, uint32_t v) {
    v = PLOG_BIG_ENDIAN ? __builtin_bswap32(v) : v;
    memcpy(p, &v, 4);
}

static inline void plog_st64(uint8_t *p, uint64_t v) {
    v = PLOG_BIG_ENDIAN ? __builtin_bswap64(v) : v;
    memcpy(p, &v, 8);
}

#endif
