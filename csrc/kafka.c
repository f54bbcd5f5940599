/*
 * Kafka RecordBatch v2 (magic 2): decode the records of a batch into columns, and build a
 * whole batch (header, records, CRC32C) from columns. The broker (pylog.serve) uses these
 * so that no per-record work happens in Python.
 *
 * Kafka's wire integers are big-endian; a record's fields are zigzag varints:
 *   length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
 *   keyLength varint (-1 null) | key | valueLength varint (-1 null) | value |
 *   headerCount varint | headers: (keyLength varint >= 0 | key | valueLength varint | value)*
 * A record's headers are kept as they are on the wire, from headerCount to the record's end:
 * that byte string is the record's pylog metadata (docs/format.md, "Kafka headers").
 * Every length is checked against the buffer before it is used; nothing is allocated.
 */
#define _FILE_OFFSET_BITS 64
#include <string.h>

#include "pylog.h"

/* a zigzag varint of at most `maxb` bytes at *p (< end): 0, or PLOG_E_LENGTH */
static int get_varint(const uint8_t **p, const uint8_t *end, int maxb, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    for (int i = 0; i < maxb; i++) {
        if (*p >= end)
            return PLOG_E_LENGTH;
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return PLOG_OK;
        }
        shift += 7;
    }
    return PLOG_E_LENGTH;
}

static size_t varint_size(int64_t x) {
    uint64_t v = ((uint64_t)x << 1) ^ (uint64_t)(x >> 63);
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static uint8_t *put_varint(uint8_t *p, int64_t x) {
    uint64_t v = ((uint64_t)x << 1) ^ (uint64_t)(x >> 63);
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static void put_be(uint8_t *p, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* a length-prefixed field (varint; -1 = null when nullable) of the record ending at end */
static int get_bytes(const uint8_t **p, const uint8_t *end, int nullable, const uint8_t **data,
                     int64_t *n) {
    int rc = get_varint(p, end, 5, n);
    if (rc)
        return rc;
    if (*n == -1 && nullable) {
        *data = NULL;
        return PLOG_OK;
    }
    if (*n < 0 || *n > end - *p)
        return PLOG_E_LENGTH;
    *data = *p;
    *p += *n;
    return PLOG_OK;
}

int plog_kafka_headers_check(const uint8_t *buf, size_t len) {
    const uint8_t *p = buf, *end = buf + len, *d;
    int64_t count, n;
    if (get_varint(&p, end, 5, &count) || count < 0)
        return PLOG_E_LENGTH;
    for (int64_t i = 0; i < count; i++) {
        if (get_bytes(&p, end, 0, &d, &n) || get_bytes(&p, end, 1, &d, &n))
            return PLOG_E_LENGTH;
    }
    return p == end ? PLOG_OK : PLOG_E_LENGTH;
}

int plog_kafka_decode(const uint8_t *src, size_t len, uint32_t count, int64_t *ts_delta,
                      int64_t *offset_delta, uint8_t *keys, uint32_t *key_lens, uint8_t *values,
                      uint32_t *value_lens, uint8_t *headers, uint32_t *header_lens,
                      uint64_t used[3]) {
    const uint8_t *p = src, *end = src + len;
    uint64_t ku = 0, vu = 0, hu = 0;
    for (uint32_t i = 0; i < count; i++) {
        int64_t rlen, n, hcount;
        const uint8_t *d;
        if (get_varint(&p, end, 5, &rlen))
            return PLOG_E_SHORT;
        if (rlen < 1 || rlen > end - p)
            return rlen > end - p ? PLOG_E_SHORT : PLOG_E_LENGTH;
        const uint8_t *rend = p + rlen;
        p++; /* attributes: unused by v2 records */
        if (get_varint(&p, rend, 10, &ts_delta[i]) || get_varint(&p, rend, 5, &offset_delta[i]))
            return PLOG_E_LENGTH;
        if (get_bytes(&p, rend, 1, &d, &n))
            return PLOG_E_LENGTH;
        if (d) {
            memcpy(keys + ku, d, (size_t)n);
            ku += (uint64_t)n;
            key_lens[i] = (uint32_t)n;
        } else {
            key_lens[i] = PLOG_NULL_LEN;
        }
        if (get_bytes(&p, rend, 1, &d, &n))
            return PLOG_E_LENGTH;
        if (d) {
            memcpy(values + vu, d, (size_t)n);
            vu += (uint64_t)n;
            value_lens[i] = (uint32_t)n;
        } else {
            value_lens[i] = PLOG_NULL_LEN;
        }
        const uint8_t *hstart = p;
        if (get_varint(&p, rend, 5, &hcount) || hcount < 0)
            return PLOG_E_LENGTH;
        for (int64_t h = 0; h < hcount; h++) {
            if (get_bytes(&p, rend, 0, &d, &n) || get_bytes(&p, rend, 1, &d, &n))
                return PLOG_E_LENGTH;
        }
        if (p != rend)
            return PLOG_E_LENGTH;
        if (hcount == 0) {
            header_lens[i] = PLOG_NULL_LEN;
        } else {
            size_t hl = (size_t)(rend - hstart);
            memcpy(headers + hu, hstart, hl);
            hu += hl;
            header_lens[i] = (uint32_t)hl;
        }
    }
    if (p != end)
        return PLOG_E_LENGTH;
    used[0] = ku;
    used[1] = vu;
    used[2] = hu;
    return PLOG_OK;
}

/* the key of the one header that carries metadata not in Kafka's header encoding */
static const char META_HEADER[] = "pylog.metadata";
#define META_HEADER_LEN (sizeof(META_HEADER) - 1)

static size_t headers_size(const uint8_t *m, uint32_t mlen, int *raw) {
    *raw = 0;
    if (mlen == PLOG_NULL_LEN)
        return 1;
    if (plog_kafka_headers_check(m, mlen) == PLOG_OK)
        return mlen;
    *raw = 1;
    return 1 + varint_size(META_HEADER_LEN) + META_HEADER_LEN + varint_size(mlen) + mlen;
}

int plog_kafka_encode(uint8_t *dst, size_t cap, uint32_t n, const int64_t *offsets,
                      const int64_t *timestamps, const uint8_t *keys, const uint32_t *key_lens,
                      const uint8_t *values, const uint32_t *value_lens, const uint8_t *meta,
                      const uint32_t *meta_lens, size_t *written) {
    if (n == 0)
        return PLOG_E_ARG;
    if (cap < PLOG_KAFKA_BATCH_HEADER_SIZE)
        return PLOG_E_SPACE;
    int64_t base = offsets[0], base_ts = timestamps[0], max_ts = timestamps[0];
    uint8_t *p = dst + PLOG_KAFKA_BATCH_HEADER_SIZE, *end = dst + cap;
    const uint8_t *k = keys, *v = values, *m = meta;
    for (uint32_t i = 0; i < n; i++) {
        int raw;
        uint32_t kl = key_lens[i], vl = value_lens[i], ml = meta_lens ? meta_lens[i] : PLOG_NULL_LEN;
        int64_t kn = kl == PLOG_NULL_LEN ? -1 : (int64_t)kl, vn = vl == PLOG_NULL_LEN ? -1 : (int64_t)vl;
        int64_t td = timestamps[i] - base_ts, od = offsets[i] - base;
        if (timestamps[i] > max_ts)
            max_ts = timestamps[i];
        if (od < 0 || od > INT32_MAX)
            return PLOG_E_OFFSET;
        size_t hs = headers_size(m, ml, &raw);
        size_t body = 1 + varint_size(td) + varint_size(od) + varint_size(kn) + (kn > 0 ? (size_t)kn : 0) +
                      varint_size(vn) + (vn > 0 ? (size_t)vn : 0) + hs;
        if ((size_t)(end - p) < varint_size((int64_t)body) + body)
            return PLOG_E_SPACE;
        p = put_varint(p, (int64_t)body);
        *p++ = 0;
        p = put_varint(p, td);
        p = put_varint(p, od);
        p = put_varint(p, kn);
        if (kn > 0) {
            memcpy(p, k, (size_t)kn);
            p += kn;
            k += kn;
        }
        p = put_varint(p, vn);
        if (vn > 0) {
            memcpy(p, v, (size_t)vn);
            p += vn;
            v += vn;
        }
        if (ml == PLOG_NULL_LEN) {
            *p++ = 0;
        } else if (!raw) {
            memcpy(p, m, ml);
            p += ml;
            m += ml;
        } else {
            p = put_varint(p, 1);
            p = put_varint(p, (int64_t)META_HEADER_LEN);
            memcpy(p, META_HEADER, META_HEADER_LEN);
            p += META_HEADER_LEN;
            p = put_varint(p, (int64_t)ml);
            memcpy(p, m, ml);
            p += ml;
            m += ml;
        }
    }
    size_t total = (size_t)(p - dst);
    if (total - 12 > INT32_MAX)
        return PLOG_E_LENGTH;
    put_be(dst, (uint64_t)base, 8);                       /* baseOffset */
    put_be(dst + 8, (uint64_t)(total - 12), 4);           /* batchLength */
    put_be(dst + 12, 0, 4);                               /* partitionLeaderEpoch */
    dst[16] = 2;                                          /* magic */
    put_be(dst + 21, 0, 2);                               /* attributes: no compression */
    put_be(dst + 23, (uint64_t)(offsets[n - 1] - base), 4); /* lastOffsetDelta */
    put_be(dst + 27, (uint64_t)base_ts, 8);
    put_be(dst + 35, (uint64_t)max_ts, 8);
    put_be(dst + 43, UINT64_MAX, 8);                      /* producerId -1 */
    put_be(dst + 51, 0xffff, 2);                          /* producerEpoch -1 */
    put_be(dst + 53, 0xffffffffu, 4);                     /* baseSequence -1 */
    put_be(dst + 57, n, 4);                               /* records count */
    put_be(dst + 17, plog_crc32c(0, dst + 21, total - 21), 4);
    *written = total;
    return PLOG_OK;
}
