/*
 * Record frames: encode a batch, validate / scan / recover a buffer, find one offset.
 *
 * Frame (docs/format.md, all little-endian):
 *   0  u32 length            bytes after the crc field: 28 + key + metadata + value
 *   4  u32 crc32c            CRC32C of those `length` bytes
 *   8  u64 offset
 *   16 i64 timestamp_ms
 *   24 u32 attributes        bit 0 null key, bit 1 null metadata, bit 2 null value,
 *                            bit 3 the write unit goes on after this frame
 *   28 u32 key_length
 *   32 u32 metadata_length
 *   36 key | metadata | value
 *
 * Readers never trust a length field: every frame is checked against the end of the
 * buffer before anything past its prefix is read, and nothing is ever allocated.
 */
#define _FILE_OFFSET_BITS 64
#include "pylog.h"
#include "endian.h"

#include <string.h>

#define BODY_FIXED (PLOG_FRAME_HEADER_SIZE - PLOG_FRAME_PREFIX_SIZE) /* 28 */
#define MAX_BODY 0x7fffffffu


/* ---- file headers ----------------------------------------------------------------------- */

int plog_header_encode(uint8_t *dst, const uint8_t *magic, uint64_t base_offset, uint32_t flags) {
    memcpy(dst, magic, 8);
    dst[8] = PLOG_VERSION & 0xff;
    dst[9] = (PLOG_VERSION >> 8) & 0xff;
    dst[10] = PLOG_FILE_HEADER_SIZE;
    dst[11] = 0;
    plog_st32(dst + 12, flags);
    plog_st64(dst + 16, base_offset);
    plog_st32(dst + 24, 0);
    plog_st32(dst + 28, plog_crc32c(0, dst, 28));
    return PLOG_OK;
}

int plog_header_check(const uint8_t *src, size_t len, const uint8_t *magic, uint64_t *base_offset,
                      uint32_t *flags) {
    if (len < PLOG_FILE_HEADER_SIZE) return PLOG_E_SHORT;
    if (memcmp(src, magic, 8) != 0) return PLOG_E_ARG;
    if (plog_ld32(src + 28) != plog_crc32c(0, src, 28)) return PLOG_E_CRC;
    if ((src[8] | (src[9] << 8)) != PLOG_VERSION) return PLOG_E_ATTRIBUTES;
    if ((src[10] | (src[11] << 8)) != PLOG_FILE_HEADER_SIZE) return PLOG_E_LENGTH;
    if (plog_ld32(src + 12) & ~(uint32_t)PLOG_HEADER_COMPACTED) return PLOG_E_ATTRIBUTES;
    *base_offset = plog_ld64(src + 16);
    *flags = plog_ld32(src + 12);
    return PLOG_OK;
}

/* ---- validation of one frame ----------------------------------------------------------- */

/* Check the frame at pos; fill *f. Does not check the offset against an expectation. */
static int frame_decode(const uint8_t *buf, size_t len, uint64_t pos, int check_crc,
                        plog_frame *f) {
    if (pos > len || len - pos < PLOG_FRAME_PREFIX_SIZE) return PLOG_E_SHORT;
    const uint8_t *p = buf + pos;
    uint32_t body = plog_ld32(p);
    if (body < BODY_FIXED || body > MAX_BODY) return PLOG_E_LENGTH;
    if ((uint64_t)body > len - pos - PLOG_FRAME_PREFIX_SIZE) return PLOG_E_SHORT;
    uint32_t crc = plog_ld32(p + 4);
    if (check_crc && plog_crc32c(0, p + PLOG_FRAME_PREFIX_SIZE, body) != crc) return PLOG_E_CRC;
    uint32_t attrs = plog_ld32(p + 24);
    uint32_t klen = plog_ld32(p + 28), mlen = plog_ld32(p + 32);
    if (attrs & ~(uint32_t)PLOG_ATTR_KNOWN) return PLOG_E_ATTRIBUTES;
    if ((uint64_t)klen + mlen > body - BODY_FIXED) return PLOG_E_LENGTH;
    uint32_t vlen = body - BODY_FIXED - klen - mlen;
    if (((attrs & PLOG_ATTR_NULL_KEY) && klen) || ((attrs & PLOG_ATTR_NULL_METADATA) && mlen) ||
        ((attrs & PLOG_ATTR_NULL_VALUE) && vlen))
        return PLOG_E_ATTRIBUTES;
    f->position = pos;
    f->offset = plog_ld64(p + 8);
    f->timestamp = (int64_t)plog_ld64(p + 16);
    f->frame_size = body + PLOG_FRAME_PREFIX_SIZE;
    f->attributes = attrs;
    f->key_length = klen;
    f->metadata_length = mlen;
    f->value_length = vlen;
    f->crc = crc;
    return PLOG_OK;
}

/* ---- encoding --------------------------------------------------------------------------- */

static inline void index_add(plog_appender *st, uint64_t pos, int64_t ts) {
    uint32_t rel = (uint32_t)(st->next_offset - st->base_offset);
    if (st->index) {
        uint8_t *e = st->index + st->index_count * PLOG_INDEX_ENTRY_SIZE;
        plog_st32(e, rel);
        plog_st32(e + 4, (uint32_t)pos);
        st->index_count++;
    }
    if (st->timeindex) {
        uint8_t *e = st->timeindex + st->timeindex_count * PLOG_TIMEINDEX_ENTRY_SIZE;
        plog_st64(e, (uint64_t)ts);
        plog_st32(e + 8, rel);
        plog_st32(e + 12, (uint32_t)pos);
        st->timeindex_count++;
    }
    st->bytes_since_index = 0;
}

/* May a frame of `size` bytes go next? Returns PLOG_OK or why not. */
static inline int room_for(const plog_appender *st, uint64_t size, int *need_index) {
    if (st->next_offset - st->base_offset >= 0xffffffffu) return PLOG_E_SEGMENT_FULL;
    if (st->position > PLOG_FILE_HEADER_SIZE && st->position + size > st->max_position)
        return PLOG_E_SEGMENT_FULL;
    if (st->position + size > 0xffffffffu) return PLOG_E_SEGMENT_FULL; /* u32 positions */
    *need_index = st->bytes_since_index >= st->index_interval;
    if (*need_index) {
        if (st->index && st->index_count >= st->index_cap) return PLOG_E_INDEX_FULL;
        if (st->timeindex && st->timeindex_count >= st->timeindex_cap) return PLOG_E_INDEX_FULL;
    }
    return PLOG_OK;
}

/* Fill in the header of a frame whose key, metadata and value already follow it at d:
 * everything but the CRC. Returns the length the CRC covers. */
static inline uint32_t frame_fields(uint8_t *d, uint64_t offset, int64_t ts, uint32_t attrs,
                                    uint32_t klen, uint32_t mlen, uint32_t vlen) {
    uint32_t body = BODY_FIXED + klen + mlen + vlen;
    plog_st32(d, body);
    plog_st64(d + 8, offset);
    plog_st64(d + 16, (uint64_t)ts);
    plog_st32(d + 24, attrs);
    plog_st32(d + 28, klen);
    plog_st32(d + 32, mlen);
    return body;
}

static inline void copy_body(uint8_t *d, const uint8_t *key, uint32_t klen, const uint8_t *meta,
                             uint32_t mlen, const uint8_t *value, uint32_t vlen) {
    uint8_t *q = d + PLOG_FRAME_HEADER_SIZE;
    if (klen) memcpy(q, key, klen);
    q += klen;
    if (mlen) memcpy(q, meta, mlen);
    q += mlen;
    if (vlen) memcpy(q, value, vlen);
}

static inline void write_frame(uint8_t *d, uint64_t offset, int64_t ts, uint32_t attrs,
                               const uint8_t *key, uint32_t klen, const uint8_t *meta,
                               uint32_t mlen, const uint8_t *value, uint32_t vlen) {
    copy_body(d, key, klen, meta, mlen, value, vlen);
    uint32_t body = frame_fields(d, offset, ts, attrs, klen, mlen, vlen);
    plog_st32(d + 4, plog_crc32c(0, d + PLOG_FRAME_PREFIX_SIZE, body));
}

/* Frames whose CRC is still to be stored, three at a time (plog_crc32c_3_from): each
 * continues from init over len bytes at buf and goes into its frame's crc field. */
typedef struct {
    uint32_t init[3];
    const uint8_t *buf[3];
    size_t len[3];
    uint8_t *frame[3];
    int n;
} crc_queue;

static inline void crc_flush(crc_queue *q) {
    if (q->n == 3) {
        uint32_t out[3];
        plog_crc32c_3_from(q->init, q->buf, q->len, out);
        for (int i = 0; i < 3; i++) plog_st32(q->frame[i] + 4, out[i]);
    } else {
        for (int i = 0; i < q->n; i++) plog_st32(q->frame[i] + 4, plog_crc32c(q->init[i], q->buf[i], q->len[i]));
    }
    q->n = 0;
}

/* A frame whose CRC continues from init over len bytes at buf (its body, or the rest of it
 * where that lies apart from the frame). */
static inline void crc_push_from(crc_queue *q, uint8_t *frame, uint32_t init, const uint8_t *buf, size_t len) {
    q->init[q->n] = init;
    q->buf[q->n] = buf;
    q->len[q->n] = len;
    q->frame[q->n] = frame;
    if (++q->n == 3) crc_flush(q);
}

/* A frame whose body (body bytes) follows its header. */
static inline void crc_push(crc_queue *q, uint8_t *frame, uint32_t body) {
    crc_push_from(q, frame, 0, frame + PLOG_FRAME_PREFIX_SIZE, body);
}

int64_t plog_frame_one(plog_appender *st, uint8_t *dst, size_t cap, const uint8_t *key,
                       uint32_t key_len, const uint8_t *metadata, uint32_t metadata_len,
                       const uint8_t *value, uint32_t value_len, uint32_t attributes,
                       int64_t timestamp, int clamp_timestamp) {
    if (attributes & ~(uint32_t)PLOG_ATTR_KNOWN) return PLOG_E_ATTRIBUTES;
    if (((attributes & PLOG_ATTR_NULL_KEY) && key_len) ||
        ((attributes & PLOG_ATTR_NULL_METADATA) && metadata_len) ||
        ((attributes & PLOG_ATTR_NULL_VALUE) && value_len))
        return PLOG_E_ARG;
    uint64_t body = (uint64_t)BODY_FIXED + key_len + metadata_len + value_len;
    if (body > MAX_BODY) return PLOG_E_LENGTH;
    uint64_t size = body + PLOG_FRAME_PREFIX_SIZE;
    if (timestamp < st->max_timestamp) {
        if (clamp_timestamp)
            timestamp = st->max_timestamp;
        else if (!(st->flags & PLOG_AS_GIVEN))
            return PLOG_E_TIMESTAMP;
    }
    int64_t run = timestamp > st->max_timestamp ? timestamp : st->max_timestamp;
    int need_index;
    int rc = room_for(st, size, &need_index);
    if (rc) return rc;
    uint64_t used = st->used;
    if (used > cap || cap - used < size) return PLOG_E_SPACE;
    write_frame(dst + used, st->next_offset, timestamp, attributes, key, key_len, metadata,
                metadata_len, value, value_len);
    if (need_index) index_add(st, st->position, run);
    st->bytes_since_index += (uint32_t)(size > 0xffffffffu ? 0xffffffffu : size);
    st->position += size;
    st->used = used + size;
    st->max_timestamp = run;
    return (int64_t)(st->next_offset++);
}

static inline uint32_t real_len(const uint32_t *lens, size_t i) {
    return lens && lens[i] != (uint32_t)PLOG_NULL_LEN ? lens[i] : 0;
}
static inline int is_null(const uint32_t *lens, size_t i) {
    return !lens || lens[i] == (uint32_t)PLOG_NULL_LEN;
}

/* Validate a whole batch before any of it is framed, so a bad record leaves nothing
 * half-framed: timestamps never decrease (from st->max_timestamp on; unless PLOG_AS_GIVEN), no body passes
 * MAX_BODY. Returns PLOG_OK and the frames' total size, or the status and (*n_done) the
 * index of the first bad record. */
int plog_check_batch(const plog_appender *st, const uint32_t *value_lens,
                     const uint32_t *key_lens, const uint32_t *meta_lens,
                     const int64_t *timestamps, int64_t default_timestamp, size_t n,
                     size_t *n_done, uint64_t *total_out) {
    int64_t prev = st->max_timestamp;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t ts = timestamps ? timestamps[i] : default_timestamp;
        if (ts < prev && !(st->flags & PLOG_AS_GIVEN)) {
            *n_done = i;
            return PLOG_E_TIMESTAMP;
        }
        if (ts > prev) prev = ts;
        uint64_t body = (uint64_t)BODY_FIXED + real_len(value_lens, i) + real_len(key_lens, i) +
                        real_len(meta_lens, i);
        if (body > MAX_BODY) {
            *n_done = i;
            return PLOG_E_LENGTH;
        }
        total += body + PLOG_FRAME_PREFIX_SIZE;
    }
    *total_out = total;
    return PLOG_OK;
}

/* Frame n records into dst[0..cap): copied from the concatenated values / keys / metas, or,
 * with in_place, already laid out there (each record's bytes after a header-sized gap). */
static int frame_batch(plog_appender *st, uint8_t *dst, size_t cap, const uint8_t *values,
                       const uint32_t *value_lens, const uint8_t *keys, const uint32_t *key_lens,
                       const uint8_t *metas, const uint32_t *meta_lens, const int64_t *timestamps,
                       int64_t default_timestamp, size_t n, int in_place, size_t *n_done,
                       size_t *written) {
    *n_done = 0;
    *written = 0;
    if (!value_lens) return PLOG_E_ARG;
    uint64_t total;
    int bad = plog_check_batch(st, value_lens, key_lens, meta_lens, timestamps, default_timestamp, n,
                               n_done, &total);
    if (bad) return bad;
    /* in place, the buffer holds exactly the frames the lengths describe */
    if (in_place && total != cap) return PLOG_E_ARG;
    const uint8_t *vp = values, *kp = keys, *mp = metas;
    size_t used = 0;
    crc_queue q = {.n = 0};
    for (size_t i = 0; i < n; i++) {
        uint32_t vlen = real_len(value_lens, i), klen = real_len(key_lens, i),
                 mlen = real_len(meta_lens, i);
        uint32_t attrs = (is_null(key_lens, i) ? PLOG_ATTR_NULL_KEY : 0) |
                         (is_null(meta_lens, i) ? PLOG_ATTR_NULL_METADATA : 0) |
                         (value_lens[i] == (uint32_t)PLOG_NULL_LEN ? PLOG_ATTR_NULL_VALUE : 0) |
                         (st->next_offset + 1 < st->unit_end ? PLOG_ATTR_UNIT_CONTINUES : 0);
        uint64_t size = (uint64_t)PLOG_FRAME_HEADER_SIZE + vlen + klen + mlen;
        int64_t ts = timestamps ? timestamps[i] : default_timestamp;
        int need_index;
        int rc = room_for(st, size, &need_index);
        if (!rc && cap - used < size) rc = PLOG_E_SPACE;
        if (rc) {
            crc_flush(&q);
            *n_done = i;
            *written = used;
            return rc;
        }
        uint8_t *d = dst + used;
        if (!in_place) {
            copy_body(d, kp, klen, mp, mlen, vp, vlen);
            vp += vlen;
            if (kp) kp += klen;
            if (mp) mp += mlen;
        }
        crc_push(&q, d, frame_fields(d, st->next_offset, ts, attrs, klen, mlen, vlen));
        if (ts < st->max_timestamp) ts = st->max_timestamp; /* the running maximum */
        if (need_index) index_add(st, st->position, ts);
        st->bytes_since_index += (uint32_t)size;
        st->position += size;
        st->next_offset++;
        st->max_timestamp = ts;
        used += size;
    }
    crc_flush(&q);
    *n_done = n;
    *written = used;
    return PLOG_OK;
}

int plog_frame_batch(plog_appender *st, uint8_t *dst, size_t cap, const uint8_t *values,
                     const uint32_t *value_lens, const uint8_t *keys, const uint32_t *key_lens,
                     const uint8_t *metas, const uint32_t *meta_lens, const int64_t *timestamps,
                     int64_t default_timestamp, size_t n, size_t *n_done, size_t *written) {
    if (st->used > cap) {
        *n_done = *written = 0;
        return PLOG_E_ARG;
    }
    int rc = frame_batch(st, dst + st->used, cap - st->used, values, value_lens, keys, key_lens,
                         metas, meta_lens, timestamps, default_timestamp, n, 0, n_done, written);
    st->used += *written;
    return rc;
}

int plog_frame_in_place(plog_appender *st, uint8_t *buf, size_t len, const uint32_t *value_lens,
                        const uint32_t *key_lens, const uint32_t *meta_lens,
                        const int64_t *timestamps, int64_t default_timestamp, size_t n,
                        size_t *n_done, size_t *written) {
    if (st->used) { /* the frames go straight after what is written: nothing may be pending */
        *n_done = *written = 0;
        return PLOG_E_ARG;
    }
    return frame_batch(st, buf, len, NULL, value_lens, NULL, key_lens, NULL, meta_lens,
                       timestamps, default_timestamp, n, 1, n_done, written);
}

/* Frame n records of values only (no key, no metadata) where the values lie, for one
 * gathered write: see pylog.h. A value shorter than copy_below is copied after its header
 * into scratch (so small records still go out as one piece); a longer one stays where it
 * is, its CRC taken there (over the header's 28 bytes, then the value). */
int plog_frame_gather(plog_appender *st, uint8_t *scratch, size_t scratch_cap,
                      const uint8_t *const *values, const uint32_t *value_lens,
                      const int64_t *timestamps, int64_t default_timestamp, size_t n,
                      uint32_t copy_below, plog_piece *pieces, size_t max_pieces,
                      size_t *n_pieces, size_t *n_done, size_t *written) {
    *n_done = *written = *n_pieces = 0;
    if (!value_lens || !values || st->used) return PLOG_E_ARG;
    uint64_t total;
    int bad = plog_check_batch(st, value_lens, NULL, NULL, timestamps, default_timestamp, n, n_done,
                               &total);
    if (bad) return bad;
    /* room for the whole batch, and no tombstone, checked before anything is framed */
    uint64_t scratch_need = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t vlen = value_lens[i];
        if (vlen == (uint32_t)PLOG_NULL_LEN) return PLOG_E_ARG;
        scratch_need += PLOG_FRAME_HEADER_SIZE + (vlen < copy_below ? vlen : 0);
    }
    if (scratch_need > scratch_cap || max_pieces / 2 < n) return PLOG_E_ARG;
    size_t used = 0, np = 0, written_now = 0;
    crc_queue q = {.n = 0};
    const uint8_t *run = NULL; /* the scratch piece being extended (pieces[np - 1]), or NULL */
    for (size_t i = 0; i < n; i++) {
        uint32_t vlen = value_lens[i];
        int inline_value = vlen < copy_below;
        uint64_t size = (uint64_t)PLOG_FRAME_HEADER_SIZE + vlen;
        uint64_t in_scratch = inline_value ? size : PLOG_FRAME_HEADER_SIZE;
        int64_t ts = timestamps ? timestamps[i] : default_timestamp;
        int need_index;
        int rc = room_for(st, size, &need_index);
        if (rc) {
            crc_flush(&q);
            *n_done = i;
            *written = written_now;
            *n_pieces = np;
            return rc;
        }
        uint8_t *d = scratch + used;
        if (inline_value && vlen) memcpy(d + PLOG_FRAME_HEADER_SIZE, values[i], vlen);
        uint32_t body = frame_fields(d, st->next_offset, ts,
                                     PLOG_ATTR_NULL_KEY | PLOG_ATTR_NULL_METADATA |
                                         (st->next_offset + 1 < st->unit_end ? PLOG_ATTR_UNIT_CONTINUES : 0),
                                     0, 0, vlen);
        if (inline_value)
            crc_push(&q, d, body);
        else /* the header's 28 bytes here, then the value where it lies */
            crc_push_from(&q, d, plog_crc32c(0, d + PLOG_FRAME_PREFIX_SIZE, BODY_FIXED), values[i], vlen);
        if (run != NULL && run + pieces[np - 1].len == d) {
            pieces[np - 1].len += in_scratch; /* follows the previous scratch piece */
        } else {
            pieces[np].base = d;
            pieces[np].len = in_scratch;
            np++;
        }
        run = pieces[np - 1].base;
        if (!inline_value) {
            pieces[np].base = values[i];
            pieces[np].len = vlen;
            np++;
            run = NULL;
        }
        used += in_scratch;
        if (ts < st->max_timestamp) ts = st->max_timestamp; /* the running maximum */
        if (need_index) index_add(st, st->position, ts);
        st->bytes_since_index += (uint32_t)size;
        st->position += size;
        st->next_offset++;
        st->max_timestamp = ts;
        written_now += size;
    }
    (void)total;
    crc_flush(&q);
    *n_done = n;
    *written = written_now;
    *n_pieces = np;
    return PLOG_OK;
}

/* ---- decoding ---------------------------------------------------------------------------- */

int plog_recover(const uint8_t *buf, size_t len, plog_appender *st, uint64_t *n_frames) {
    plog_frame f;
    *n_frames = 0;
    while (st->position < len) {
        int rc = frame_decode(buf, len, st->position, 1, &f);
        if (rc) return rc;
        if (f.offset != st->next_offset &&
            !((st->flags & PLOG_GAPS) && f.offset > st->next_offset &&
              f.offset - st->base_offset < 0xffffffffu))
            return PLOG_E_OFFSET;
        st->next_offset = f.offset;
        int need_index = st->bytes_since_index >= st->index_interval;
        if (need_index) {
            if (st->index && st->index_count >= st->index_cap) return PLOG_E_INDEX_FULL;
            if (st->timeindex && st->timeindex_count >= st->timeindex_cap)
                return PLOG_E_INDEX_FULL;
            index_add(st, st->position, f.timestamp > st->max_timestamp ? f.timestamp : st->max_timestamp);
        }
        st->bytes_since_index += f.frame_size;
        st->position += f.frame_size;
        st->next_offset++;
        if (f.timestamp > st->max_timestamp) st->max_timestamp = f.timestamp;
        (*n_frames)++;
    }
    return PLOG_OK;
}

/* Whether a frame of offset `off` at `pos` may follow damage that starts at `start` and
 * should have held `expected`: see plog_resync. */
static inline int resync_fits(uint64_t off, uint64_t pos, size_t start, uint64_t expected,
                              uint64_t base_offset, int gaps) {
    if (off < expected || off - base_offset >= 0xffffffffu) return 0;
    return gaps || off - expected <= (pos - start) / PLOG_FRAME_HEADER_SIZE;
}

int plog_resync(const uint8_t *buf, size_t len, size_t start, size_t search_end,
                uint64_t expected, uint64_t base_offset, int gaps, plog_frame *out) {
    if (search_end > len) search_end = len;
    if (start >= search_end) return PLOG_E_NOT_FOUND;
    /* where the bad frame's own length field points, when that is plausible */
    if (len - start >= PLOG_FRAME_PREFIX_SIZE) {
        uint32_t body = plog_ld32(buf + start);
        uint64_t hop = (uint64_t)start + PLOG_FRAME_PREFIX_SIZE + body;
        if (body >= BODY_FIXED && body <= MAX_BODY && hop < search_end &&
            frame_decode(buf, len, hop, 1, out) == PLOG_OK &&
            resync_fits(out->offset, hop, start, expected, base_offset, gaps))
            return PLOG_OK;
    }
    /* else every later byte position: cheap checks of the header first, the CRC last */
    for (uint64_t pos = (uint64_t)start + 1; pos < search_end && len - pos >= PLOG_FRAME_HEADER_SIZE; pos++) {
        const uint8_t *p = buf + pos;
        uint64_t off = plog_ld64(p + 8);
        if (!resync_fits(off, pos, start, expected, base_offset, gaps)) continue;
        uint32_t body = plog_ld32(p);
        if (body < BODY_FIXED || body > MAX_BODY || (uint64_t)body > len - pos - PLOG_FRAME_PREFIX_SIZE)
            continue;
        if (plog_ld32(p + 24) & ~(uint32_t)PLOG_ATTR_KNOWN) continue;
        if (frame_decode(buf, len, pos, 1, out) == PLOG_OK) return PLOG_OK;
    }
    return PLOG_E_NOT_FOUND;
}

/* Whether a scan expecting `expected` (UINT64_MAX: anything) must refuse a frame holding
 * offset `got`: in a compacted segment (gaps) offsets may skip forward, never back. */
static inline int unexpected(uint64_t got, uint64_t expected, int gaps) {
    return expected != UINT64_MAX && got != expected && !(gaps && got > expected);
}

/* plog_scan CRC-checks its frames three at a time (plog_crc32c_3: three CRC instructions in
 * flight instead of one chain; frames are short). Each frame's header is checked first
 * (frame_decode without its CRC); the CRCs of up to three such frames are then checked
 * together, in order, before any of them counts as found. A frame that stops the scan (a
 * bad header, an unexpected offset, past max_bytes) is decoded again with its CRC, so the
 * status is exactly the one-frame-at-a-time loop's: the first failing check of the first
 * frame that fails one. */
int plog_scan(const uint8_t *buf, size_t len, size_t start, uint64_t expected_offset, int gaps,
              plog_frame *out, size_t max_out, uint64_t max_bytes, size_t *n_out,
              uint64_t *end_position) {
    uint64_t pos = start, used = 0;
    size_t n = 0;
    *n_out = 0;
    *end_position = start;
    for (;;) {
        size_t k = 0; /* frames out[n..n+k) decoded, their CRCs not yet checked */
        int stop = 0; /* 1: frame out[n+k] stops the scan (check it with its CRC); 2: the end */
        uint64_t p = pos;
        while (k < 3) {
            if (n + k >= max_out || p >= len) {
                stop = 2;
                break;
            }
            plog_frame *f = &out[n + k];
            if (frame_decode(buf, len, p, 0, f) || unexpected(f->offset, expected_offset, gaps) ||
                (n + k > 0 && used + f->frame_size > max_bytes)) {
                stop = 1;
                break;
            }
            used += f->frame_size;
            p += f->frame_size;
            if (expected_offset != UINT64_MAX) expected_offset = f->offset + 1;
            k++;
        }
        if (k == 3) {
            const uint8_t *bodies[3];
            size_t lens[3];
            uint32_t crcs[3];
            for (int i = 0; i < 3; i++) {
                const uint8_t *fp = buf + out[n + i].position;
                bodies[i] = fp + PLOG_FRAME_PREFIX_SIZE;
                lens[i] = plog_ld32(fp);
            }
            plog_crc32c_3(bodies, lens, crcs);
            for (int i = 0; i < 3; i++) {
                if (crcs[i] != plog_ld32(buf + out[n + i].position + 4)) {
                    *n_out = n + (size_t)i;
                    *end_position = out[n + i].position;
                    return PLOG_E_CRC;
                }
            }
        } else {
            for (size_t i = 0; i < k; i++) {
                const uint8_t *fp = buf + out[n + i].position;
                if (plog_crc32c(0, fp + PLOG_FRAME_PREFIX_SIZE, plog_ld32(fp)) != plog_ld32(fp + 4)) {
                    *n_out = n + i;
                    *end_position = out[n + i].position;
                    return PLOG_E_CRC;
                }
            }
        }
        n += k;
        pos = p;
        *n_out = n;
        *end_position = pos;
        if (stop == 2) return PLOG_OK;
        if (stop == 1) {
            plog_frame *f = &out[n];
            int rc = frame_decode(buf, len, pos, 1, f);
            if (rc) return rc;
            if (unexpected(f->offset, expected_offset, gaps)) return PLOG_E_OFFSET;
            return PLOG_OK; /* past max_bytes */
        }
    }
}

int plog_find(const uint8_t *buf, size_t len, const uint8_t *index, size_t n_index,
              uint64_t base_offset, uint64_t target, int gaps, plog_frame *out) {
    if (target < base_offset || target - base_offset > 0xffffffffu) return PLOG_E_NOT_FOUND;
    uint64_t pos = PLOG_FILE_HEADER_SIZE;
    size_t slot;
    if (index && n_index &&
        plog_index_lookup(index, n_index, (uint32_t)(target - base_offset), &slot) == PLOG_OK)
        pos = plog_ld32(index + slot * PLOG_INDEX_ENTRY_SIZE + 4);
    uint64_t prev = 0;
    int first = 1;
    while (pos < len) {
        if (len - pos < PLOG_FRAME_HEADER_SIZE) return PLOG_E_SHORT;
        const uint8_t *p = buf + pos;
#if defined(__GNUC__)
        /* the walk is a chain of dependent loads, one per frame: fetch ahead of it */
        if (len - pos > 1024) __builtin_prefetch(p + 1024);
#endif
        uint32_t body = plog_ld32(p);
        uint64_t off = plog_ld64(p + 8);
        if (body < BODY_FIXED || body > MAX_BODY) return PLOG_E_LENGTH;
        if (!first && (gaps ? off <= prev : off != prev + 1)) return PLOG_E_OFFSET;
        if (off == target || (gaps && off > target)) return frame_decode(buf, len, pos, 1, out);
        if (off > target) return PLOG_E_OFFSET;
        prev = off;
        first = 0;
        pos += (uint64_t)body + PLOG_FRAME_PREFIX_SIZE;
    }
    return PLOG_E_NOT_FOUND;
}

int64_t plog_locate(const plog_view *v, uint64_t target) {
    plog_frame f;
    int rc = plog_find(v->buf, v->len, v->index, v->n_index, v->base_offset, target, v->gaps, &f);
    return rc ? (int64_t)rc : (int64_t)f.position;
}

int plog_find_time(const uint8_t *buf, size_t len, const uint8_t *tindex, size_t n_tindex,
                   int64_t ts, plog_frame *out) {
    uint64_t pos = PLOG_FILE_HEADER_SIZE;
    size_t slot;
    if (tindex && n_tindex && plog_timeindex_lookup(tindex, n_tindex, ts, &slot) == PLOG_OK)
        pos = plog_ld32(tindex + slot * PLOG_TIMEINDEX_ENTRY_SIZE + 12);
    while (pos < len) {
        if (len - pos < PLOG_FRAME_HEADER_SIZE) return PLOG_E_SHORT;
        const uint8_t *p = buf + pos;
        uint32_t body = plog_ld32(p);
        if (body < BODY_FIXED || body > MAX_BODY) return PLOG_E_LENGTH;
        if ((int64_t)plog_ld64(p + 16) >= ts) return frame_decode(buf, len, pos, 1, out);
        pos += (uint64_t)body + PLOG_FRAME_PREFIX_SIZE;
    }
    return PLOG_E_NOT_FOUND;
}

/* ---- columnar scan ------------------------------------------------------------------------ */

/* Whether `len` more bytes fit in column c after row `row` (always, when not collected). */
static inline int column_fits(plog_binary_column *c, uint64_t row, uint32_t len) {
    if (!c->offsets) return 1;
    uint64_t cap = c->data_cap < 0x7fffffffu ? c->data_cap : 0x7fffffffu;
    uint64_t need = (uint64_t)(uint32_t)c->offsets[row] + len;
    if (need <= cap) return 1;
    c->need = need;
    return 0;
}

static inline void column_put(plog_binary_column *c, uint64_t row, const uint8_t *src,
                              uint32_t len, int null) {
    if (!c->offsets) return;
    int32_t at = c->offsets[row];
    if (len) memcpy(c->data + at, src, len);
    c->offsets[row + 1] = at + (int32_t)len;
    if (c->validity) {
        uint8_t bit = (uint8_t)(1u << (row & 7));
        uint8_t *v = c->validity + (row >> 3);
        if ((row & 7) == 0)
            *v = null ? 0 : bit; /* a new byte: its bits above this row are cleared too */
        else
            *v = null ? (uint8_t)(*v & ~bit) : (uint8_t)(*v | bit);
    }
    c->null_count += (uint64_t)(null != 0);
}

/* The bodies the columnar scan checks three at a time (plog_crc32c_3: three CRC streams in
 * flight instead of one dependent chain; the scan of 1,000,000 frames of 100 B values took
 * ~8% less CPU, 32 -> 29.5 ms); larger ones go one by one, through plog_crc32c (folding). */
#define CRC_AHEAD_MAX_BODY 4096

/* Where the three frames from pos end, when each is whole and of a body no larger than
 * CRC_AHEAD_MAX_BODY, and their CRCs match; else pos (the caller then checks each frame
 * itself, which finds the first bad one and why). Reads nothing past len. */
static uint64_t crc_ahead3(const uint8_t *buf, size_t len, uint64_t pos) {
    const uint8_t *bodies[3];
    size_t lens[3];
    uint32_t want[3], got[3];
    uint64_t p = pos;
    for (int i = 0; i < 3; i++) {
        if (p > len || len - p < PLOG_FRAME_PREFIX_SIZE) return pos;
        uint32_t body = plog_ld32(buf + p);
        if (body < BODY_FIXED || body > CRC_AHEAD_MAX_BODY || (uint64_t)body > len - p - PLOG_FRAME_PREFIX_SIZE)
            return pos;
        bodies[i] = buf + p + PLOG_FRAME_PREFIX_SIZE;
        lens[i] = body;
        want[i] = plog_ld32(buf + p + 4);
        p += PLOG_FRAME_PREFIX_SIZE + body;
    }
    plog_crc32c_3(bodies, lens, got);
    if (got[0] != want[0] || got[1] != want[1] || got[2] != want[2]) return pos;
    return p;
}

int plog_scan_columns(const uint8_t *buf, size_t len, size_t start, uint64_t expected_offset,
                      int gaps, uint64_t stop_offset, plog_columns *cols, uint64_t *end_position) {
    *end_position = start;
    if (!cols || cols->rows > cols->capacity) return PLOG_E_ARG;
    plog_binary_column *cs[3] = {&cols->key, &cols->metadata, &cols->value};
    for (int i = 0; i < 3; i++) {
        cs[i]->need = 0;
        if (cs[i]->offsets && cs[i]->offsets[cols->rows] < 0) return PLOG_E_ARG;
    }
    uint64_t pos = start, n = cols->rows;
    uint64_t crc_ok = start; /* the frames before this position had their CRCs checked */
    int rc = PLOG_OK;
    plog_frame f;
    while (n < cols->capacity && pos < len) {
        int check = pos >= crc_ok;
        if (check) {
            crc_ok = crc_ahead3(buf, len, pos);
            check = crc_ok == pos;
        }
        rc = frame_decode(buf, len, pos, check, &f);
        if (rc) break;
        if (unexpected(f.offset, expected_offset, gaps)) {
            rc = PLOG_E_OFFSET;
            break;
        }
        if (f.offset >= stop_offset) break;
        /* all three checked before any is written: a refused row leaves no trace */
        int fits = column_fits(&cols->key, n, f.key_length);
        fits &= column_fits(&cols->metadata, n, f.metadata_length);
        fits &= column_fits(&cols->value, n, f.value_length);
        if (!fits) {
            rc = PLOG_E_SPACE;
            break;
        }
        const uint8_t *p = buf + pos + PLOG_FRAME_HEADER_SIZE;
        uint32_t a = f.attributes;
        if (cols->offsets) cols->offsets[n] = (int64_t)f.offset;
        if (cols->timestamps) cols->timestamps[n] = f.timestamp;
        if (cols->attributes) cols->attributes[n] = (uint8_t)a;
        column_put(&cols->key, n, p, f.key_length, a & PLOG_ATTR_NULL_KEY);
        p += f.key_length;
        column_put(&cols->metadata, n, p, f.metadata_length, a & PLOG_ATTR_NULL_METADATA);
        p += f.metadata_length;
        column_put(&cols->value, n, p, f.value_length, a & PLOG_ATTR_NULL_VALUE);
        pos += f.frame_size;
        n++;
        if (expected_offset != UINT64_MAX) expected_offset = f.offset + 1;
    }
    cols->rows = n;
    *end_position = pos;
    return rc;
}
