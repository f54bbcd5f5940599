/*
 * pylog C core: the C API.
 *
 * Pure functions over caller-owned buffers. No Python objects, no allocation,
 * int status codes (0 or a negative PLOG_E_* code). Every multi-byte field is
 * little-endian and is loaded through memcpy, so any alignment is safe (ARMv7
 * faults on unaligned LDRD; see docs/arm.md).
 *
 * The part between the CDEF markers is read verbatim by csrc/_build_pylog.py
 * and handed to cffi's cdef(), so it must stay plain declarations.
 */
#ifndef PYLOG_H
#define PYLOG_H

#define _FILE_OFFSET_BITS 64
#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define PLOG_VERSION 1
#define PLOG_FILE_HEADER_SIZE 32
#define PLOG_FRAME_HEADER_SIZE 36
#define PLOG_FRAME_PREFIX_SIZE 8
#define PLOG_INDEX_ENTRY_SIZE 8
#define PLOG_TIMEINDEX_ENTRY_SIZE 16
#define PLOG_ATTR_NULL_KEY 1
#define PLOG_ATTR_NULL_METADATA 2
#define PLOG_ATTR_NULL_VALUE 4
/* the write unit (an append_batch) goes on after this frame: set on every frame of a
 * batch but its last (docs/format.md, "Write units") */
#define PLOG_ATTR_UNIT_CONTINUES 8
#define PLOG_ATTR_KNOWN 15
#define PLOG_NULL_LEN 4294967295
#define PLOG_HEADER_COMPACTED 1
#define PLOG_GAPS 1
/* explicit timestamps may go below the newest one (kept as given; the time index holds the
 * running maximum): see plog_frame_one */
#define PLOG_AS_GIVEN 2

enum plog_status {
    PLOG_OK = 0,
    PLOG_E_SHORT = -1,        /* the buffer ends inside a frame (a torn tail) */
    PLOG_E_CRC = -2,          /* a frame's CRC32C does not match its bytes */
    PLOG_E_LENGTH = -3,       /* a length field is impossible */
    PLOG_E_OFFSET = -4,       /* a frame carries an unexpected offset */
    PLOG_E_SPACE = -5,        /* the destination buffer is full */
    PLOG_E_NOT_FOUND = -6,    /* no such offset / timestamp here */
    PLOG_E_ARG = -7,          /* a bad argument */
    PLOG_E_ATTRIBUTES = -8,   /* unknown attribute bits */
    PLOG_E_TIMESTAMP = -9,    /* a timestamp below the previous one */
    PLOG_E_INDEX_FULL = -10,  /* no room for another index entry */
    PLOG_E_SEGMENT_FULL = -11 /* the frame would pass the segment's size limit */
};

enum plog_crc_impl {
    PLOG_CRC_PORTABLE = 0,
    PLOG_CRC_SSE42 = 1,
    PLOG_CRC_ARMV8 = 2,
    PLOG_CRC_SSE42_CLMUL = 3 /* SSE4.2 plus VPCLMULQDQ folding for long buffers */
};

/* plog_crc32c_select's modes */
enum plog_crc_select {
    PLOG_CRC_SELECT_BEST = 0,
    PLOG_CRC_SELECT_PORTABLE = 1,
    PLOG_CRC_SELECT_NO_CLMUL = 2 /* the crc32 instructions without the folding path */
};

/* One decoded frame header (what a scan reports). */
typedef struct {
    uint64_t position;        /* byte position of the frame in its buffer */
    uint64_t offset;
    int64_t timestamp;
    uint32_t frame_size;      /* whole frame, header included */
    uint32_t attributes;
    uint32_t key_length;
    uint32_t metadata_length;
    uint32_t value_length;
    uint32_t crc;
} plog_frame;

/*
 * The state of an active segment's writer: where the next frame goes and
 * the sparse index entries produced so far. Framing functions update it.
 */
typedef struct {
    uint64_t base_offset;
    uint64_t next_offset;
    uint64_t position;        /* store position of the next frame */
    uint64_t max_position;    /* a frame may not end past this (segment size) */
    int64_t max_timestamp;    /* highest timestamp so far (INT64_MIN: none) */
    uint32_t index_interval;  /* bytes of store between index entries; 0 = every frame */
    uint32_t bytes_since_index;
    uint8_t *index;           /* offset index entries, 8 bytes each */
    uint64_t index_count;
    uint64_t index_cap;
    uint8_t *timeindex;       /* time index entries, 16 bytes each */
    uint64_t timeindex_count;
    uint64_t timeindex_cap;
    uint32_t flags;           /* PLOG_GAPS: offsets may skip (a compacted segment);
                                 PLOG_AS_GIVEN: timestamps may go back */
    uint64_t used;            /* bytes framed into the write buffer, not yet written out */
    uint64_t unit_end;        /* batch framing: a frame whose offset + 1 is below it gets
                                 PLOG_ATTR_UNIT_CONTINUES (0: none does) */
} plog_appender;

/* CRC32C (Castagnoli). crc is the running value, 0 to start. */
uint32_t plog_crc32c(uint32_t crc, const uint8_t *buf, size_t len);
uint32_t plog_crc32c_portable(uint32_t crc, const uint8_t *buf, size_t len);
/* The CRC32C (from 0) of three buffers at once: out[i] = plog_crc32c(0, bufs[i], lens[i]). */
void plog_crc32c_3(const uint8_t *const bufs[3], const size_t lens[3], uint32_t out[3]);
uint32_t plog_crc32c_hw(uint32_t crc, const uint8_t *buf, size_t len);
int plog_crc32c_hw_available(void);
/* The folding path where the CPU has it, else plog_crc32c_hw. */
uint32_t plog_crc32c_clmul(uint32_t crc, const uint8_t *buf, size_t len);
int plog_crc32c_clmul_available(void);
int plog_crc32c_impl(void);
void plog_crc32c_select(int mode);
int plog_crc32c_batch(const uint8_t *buf, size_t len, const uint64_t *positions,
                      const uint32_t *lengths, size_t n, uint32_t *out);

/* Frame one record into dst[st->used..cap). Returns its offset, or < 0. With
 * clamp_timestamp, a timestamp below the newest one is raised to it instead of refused;
 * without it, such a timestamp is kept as given under PLOG_AS_GIVEN, else refused. A time
 * index entry holds the largest timestamp up to its frame (the running maximum). */
int64_t plog_frame_one(plog_appender *st, uint8_t *dst, size_t cap,
                       const uint8_t *key, uint32_t key_len,
                       const uint8_t *metadata, uint32_t metadata_len,
                       const uint8_t *value, uint32_t value_len,
                       uint32_t attributes, int64_t timestamp, int clamp_timestamp);

/* Frame n records (concatenated buffers + lengths; PLOG_NULL_LEN = null) into
 * dst[st->used..cap); *written bytes are added to st->used. */
int plog_frame_batch(plog_appender *st, uint8_t *dst, size_t cap,
                     const uint8_t *values, const uint32_t *value_lens,
                     const uint8_t *keys, const uint32_t *key_lens,
                     const uint8_t *metas, const uint32_t *meta_lens,
                     const int64_t *timestamps, int64_t default_timestamp,
                     size_t n, size_t *n_done, size_t *written);

/* plog_frame_batch for records already laid out in buf[0..len): each record's key, metadata
 * and value follow a header-sized gap, which this fills in (header and CRC); len must be
 * exactly the frames' size. Nothing may be pending in the write buffer (st->used == 0): the
 * caller writes buf[0..*written) at the store position the first frame had. */
int plog_frame_in_place(plog_appender *st, uint8_t *buf, size_t len,
                        const uint32_t *value_lens, const uint32_t *key_lens,
                        const uint32_t *meta_lens, const int64_t *timestamps,
                        int64_t default_timestamp, size_t n, size_t *n_done, size_t *written);

/* Walk and validate frames from st->position, adding index entries (index may be NULL). */
int plog_recover(const uint8_t *buf, size_t len, plog_appender *st, uint64_t *n_frames);

/* After a bad frame at `start` (one whose offset should be `expected`): the first position
 * after it holding a whole, CRC-valid frame with an offset >= expected, first trying where
 * the bad frame's length field points. Without gaps the offset must also be one that the
 * bytes skipped could have held (at most one record per frame header's size of them).
 * Frames may start only before search_end (<= len; past it the caller knows there are only
 * zeros, which never start a frame), and must end within len.
 * PLOG_E_NOT_FOUND when there is none (the damage is a torn tail). */
int plog_resync(const uint8_t *buf, size_t len, size_t start, size_t search_end,
                uint64_t expected, uint64_t base_offset, int gaps, plog_frame *out);

/* Decode up to max_out valid frames from start, stopping after max_bytes of frames. */
int plog_scan(const uint8_t *buf, size_t len, size_t start, uint64_t expected_offset,
              int gaps, plog_frame *out, size_t max_out, uint64_t max_bytes,
              size_t *n_out, uint64_t *end_position);

/* Index search: largest entry with relative offset <= rel (returns slot), or NOT_FOUND. */
int plog_index_lookup(const uint8_t *index, size_t n, uint32_t rel, size_t *slot);
/* Time index search: last entry whose timestamp < ts, or NOT_FOUND. */
int plog_timeindex_lookup(const uint8_t *tindex, size_t n, int64_t ts, size_t *slot);
/* Check an index: entries strictly increasing, positions inside [header, store_len). */
int plog_index_check(const uint8_t *index, size_t n, uint64_t store_len, size_t *bad_slot);
int plog_timeindex_check(const uint8_t *tindex, size_t n, uint64_t store_len, size_t *bad_slot);

/* Find the first frame with offset >= target (CRC verified) using the index as a hint. */
int plog_find(const uint8_t *buf, size_t len, const uint8_t *index, size_t n_index,
              uint64_t base_offset, uint64_t target, int gaps, plog_frame *out);
/* What plog_locate needs to know of one mapped segment, filled in once per map so that a
 * read passes two arguments instead of eight (each cffi argument costs ~45 ns). The pointers
 * are borrowed: the caller keeps the maps alive as long as the view. */
typedef struct {
    const uint8_t *buf;
    size_t len;
    const uint8_t *index;
    size_t n_index;
    uint64_t base_offset;
    int gaps;
} plog_view;

/* plog_find through a view: the position of the CRC-verified frame of `target` (with gaps:
 * the first frame at or after it), or a negative PLOG_E_* status. */
int64_t plog_locate(const plog_view *v, uint64_t target);

/* Find the first frame with timestamp >= ts (CRC verified). */
int plog_find_time(const uint8_t *buf, size_t len, const uint8_t *tindex, size_t n_tindex,
                   int64_t ts, plog_frame *out);

/* Kafka's partitioner hash (MurmurHash2, seed 0x9747b28c), as an unsigned 32-bit value. */
uint32_t plog_murmur2(const uint8_t *data, size_t len);

/* Encode / check a 32-byte file header. */
int plog_header_encode(uint8_t *dst, const uint8_t *magic, uint64_t base_offset, uint32_t flags);
int plog_header_check(const uint8_t *src, size_t len, const uint8_t *magic, uint64_t *base_offset,
                      uint32_t *flags);
/*
 * Columnar scan: one pass over a store buffer that CRC-checks frames (as plog_scan does)
 * and appends each record as a row of caller-owned column arrays in Arrow's layout.
 *
 * A binary column (key, metadata, value): row i is data[offsets[i] .. offsets[i+1]) and
 * bit i of validity (least significant bit first) is 0 when the field is null (a null is
 * stored as zero bytes). offsets has capacity + 1 entries; offsets[rows] must hold the
 * bytes used so far (0 before the first row). offsets NULL: the column is not collected.
 */
typedef struct {
    int32_t *offsets;         /* capacity + 1 entries, or NULL: not collected */
    uint8_t *data;
    uint64_t data_cap;        /* bytes of data (at most INT32_MAX of them are used) */
    uint8_t *validity;        /* (capacity + 7) / 8 bytes, or NULL */
    uint64_t null_count;      /* nulls so far: each null row adds one */
    uint64_t need;            /* after PLOG_E_SPACE: the data_cap the refused row needs, else 0 */
} plog_binary_column;

typedef struct {
    uint64_t rows;            /* rows so far: a scan appends from here */
    uint64_t capacity;        /* rows the per-row arrays have room for */
    int64_t *offsets;         /* capacity entries, or NULL */
    int64_t *timestamps;      /* capacity entries (ms), or NULL */
    uint8_t *attributes;      /* capacity entries (PLOG_ATTR_* bits), or NULL */
    plog_binary_column key;
    plog_binary_column metadata;
    plog_binary_column value;
} plog_columns;

/* Append the valid frames from start to cols until it is full (OK), the buffer ends (OK),
 * a frame's offset is >= stop_offset (OK; UINT64_MAX: no bound), a binary column's data is
 * full (PLOG_E_SPACE, see need) or a frame is bad (its status). expected_offset and gaps as
 * for plog_scan. Rows before the stop are kept; *end_position is where the next frame is. */
int plog_scan_columns(const uint8_t *buf, size_t len, size_t start, uint64_t expected_offset,
                      int gaps, uint64_t stop_offset, plog_columns *cols, uint64_t *end_position);
/*
 * Kafka RecordBatch v2 (csrc/kafka.c; pylog.serve). plog_kafka_decode reads `count` records
 * from the (uncompressed) records section src[0..len) into columns: timestamp and offset
 * deltas, and keys, values and headers each joined into a caller buffer of at least `len`
 * bytes with their lengths (PLOG_NULL_LEN: null; a record without headers has null headers).
 * A record's headers are its wire bytes from headerCount on. used[] gets the bytes used in
 * keys, values and headers. Status PLOG_E_SHORT or PLOG_E_LENGTH for a bad section.
 * plog_kafka_encode builds one whole batch (61-byte header, records, CRC32C) of n records into
 * dst; metadata (meta_lens NULL: none) that is not in Kafka's header encoding goes out as one
 * header named "pylog.metadata". plog_kafka_headers_check: 0 when buf is that encoding.
 */
#define PLOG_KAFKA_BATCH_HEADER_SIZE 61
int plog_kafka_headers_check(const uint8_t *buf, size_t len);
int plog_kafka_decode(const uint8_t *src, size_t len, uint32_t count, int64_t *ts_delta,
                      int64_t *offset_delta, uint8_t *keys, uint32_t *key_lens, uint8_t *values,
                      uint32_t *value_lens, uint8_t *headers, uint32_t *header_lens,
                      uint64_t used[3]);
int plog_kafka_encode(uint8_t *dst, size_t cap, uint32_t n, const int64_t *offsets,
                      const int64_t *timestamps, const uint8_t *keys, const uint32_t *key_lens,
                      const uint8_t *values, const uint32_t *value_lens, const uint8_t *meta,
                      const uint32_t *meta_lens, size_t *written);
/* CDEF END */

/* ---- not in the cffi API (pylog._speedups only) -------------------------------------------- */

/* plog_crc32c_3 continuing three CRCs: out[i] = plog_crc32c(init[i], bufs[i], lens[i]). */
void plog_crc32c_3_from(const uint32_t init[3], const uint8_t *const bufs[3], const size_t lens[3],
                        uint32_t out[3]);

/* Check a whole batch before any of it is framed (what plog_frame_batch checks first):
 * timestamps never decrease (from st->max_timestamp on; NULL timestamps: all
 * default_timestamp), no frame body passes the format's limit. PLOG_OK and the frames' total
 * size in *total, or PLOG_E_TIMESTAMP / PLOG_E_LENGTH and the first bad record in *n_bad. */
int plog_check_batch(const plog_appender *st, const uint32_t *value_lens,
                     const uint32_t *key_lens, const uint32_t *meta_lens,
                     const int64_t *timestamps, int64_t default_timestamp, size_t n,
                     size_t *n_bad, uint64_t *total);

/* One piece of a gathered write: len bytes at base (what struct iovec holds). */
typedef struct {
    const uint8_t *base;
    size_t len;
} plog_piece;

/* Frame n records of values only (no key, no metadata, no tombstone: value_lens[i] is never
 * PLOG_NULL_LEN) without copying the values, for a gathered write (pwritev) of
 * pieces[0..*n_pieces), which together are the *written bytes of the frames, in order, that
 * go at the store position the first frame had. Headers, and the values shorter than
 * copy_below (after their header), are made in scratch[0..scratch_cap); a longer value is
 * a piece of its own, values[i] itself, its CRC computed where it lies. The bytes are the
 * ones plog_frame_batch would make. Validates the whole batch first (PLOG_E_TIMESTAMP,
 * PLOG_E_LENGTH: nothing framed; PLOG_E_ARG, nothing framed, for a tombstone or when
 * scratch or pieces are too small for the whole batch: 36 bytes a record plus the copied
 * values, two pieces a record); stops early with PLOG_E_SEGMENT_FULL / PLOG_E_INDEX_FULL
 * (*n_done records framed, to be written; the caller makes room and frames the rest).
 * Nothing may be pending in the write buffer (st->used == 0). The pure backend has no
 * counterpart: it frames such batches in place (plog_frame_in_place), the same bytes. */
int plog_frame_gather(plog_appender *st, uint8_t *scratch, size_t scratch_cap,
                      const uint8_t *const *values, const uint32_t *value_lens,
                      const int64_t *timestamps, int64_t default_timestamp, size_t n,
                      uint32_t copy_below, plog_piece *pieces, size_t max_pieces,
                      size_t *n_pieces, size_t *n_done, size_t *written);

#endif
