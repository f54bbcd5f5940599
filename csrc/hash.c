/*
 * Kafka's partitioner hash: MurmurHash2, 32-bit, seed 0x9747b28c (Kafka Utils.murmur2).
 * pylog's Topic puts a key where Kafka would: (murmur2(key) & 0x7fffffff) % partitions.
 */
#define _FILE_OFFSET_BITS 64
#include "pylog.h"

uint32_t plog_murmur2(const uint8_t *data, size_t len) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = 0x9747b28cu ^ (uint32_t)len;
    size_t n4 = len & ~(size_t)3;
    for (size_t i = 0; i < n4; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 |
                     (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)data[n4 + 2] << 16; /* fall through */
    case 2:
        h ^= (uint32_t)data[n4 + 1] << 8; /* fall through */
    case 1:
        h ^= data[n4];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}
