/*
 * The read side of pylog._speedups: Records built in C straight from the C core's frame
 * decoding, so a read, a fetch or a scan makes no Python-level object but the Records
 * themselves.
 *
 * Records are instances of pylog.record.Record (a NamedTuple, registered once with
 * set_record_type). Their key, metadata and value are slices of the memoryview of the
 * segment's map (made without a slice object where it is safe: see fast_view): a slice shares
 * the base view's managed buffer, which holds the mmap's export, so a view outlives the log,
 * its close, retention and truncation and never faults (the same promise the Python code
 * path keeps).
 *
 * Every frame a Record is made from was CRC-checked by the core (plog_find / plog_scan)
 * in the same call: no bytes that fail their CRC are ever handed out.
 */
#include "speedups.h"
#include "endian.h"
#include "pylog.h"

#include <stdint.h>
#include <string.h>

/* The Record type and how to make one. On CPython < 3.14 a Record is allocated with the
 * type's tp_alloc and filled in (what tuple.__new__ does for a subclass, minus the
 * argument tuple). CPython 3.14 caches a tuple's hash in the object, which tuple.__new__
 * resets and tp_alloc does not: there the Record is made through tuple.__new__ itself. */
static PyObject *record_type = NULL;
static allocfunc record_alloc = NULL;
static PyObject *tuple_new = NULL; /* tuple.__new__, for the 3.14+ path */
static int direct_alloc = 0;
static int pool_on = 0;
static void set_pool(int on);

static PyObject *set_record_type(PyObject *self, PyObject *type) {
    (void)self;
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "set_record_type: expected a tuple subclass");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)type, Py_tp_alloc);
    if (alloc == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "set_record_type: the type has no tp_alloc");
        return NULL;
    }
    PyObject *old = record_type;
    Py_INCREF(type);
    record_type = type;
    Py_XDECREF(old);
    set_pool(pool_on); /* no Record of the old type is reused */
    record_alloc = alloc;
    Py_RETURN_NONE;
}

/* A Record of five new references (stolen, also on failure). */
static PyObject *make_record(PyObject *off, PyObject *ts, PyObject *key, PyObject *value, PyObject *meta) {
    PyObject *items[5] = {off, ts, key, value, meta};
    PyObject *r = NULL;
    for (int i = 0; i < 5; i++)
        if (items[i] == NULL) goto fail;
    if (direct_alloc) {
        r = record_alloc((PyTypeObject *)record_type, 5);
        if (r == NULL) goto fail;
        for (int i = 0; i < 5; i++) PyTuple_SetItem(r, i, items[i]); /* steals; cannot fail */
    } else {
        PyObject *t = PyTuple_New(5);
        if (t == NULL) goto fail;
        for (int i = 0; i < 5; i++) PyTuple_SetItem(t, i, items[i]);
        r = PyObject_CallFunctionObjArgs(tuple_new, record_type, t, NULL);
        Py_DECREF(t);
        if (r == NULL) return NULL;
    }
    /* No reference cycle can run through a Record made here: it is immutable and holds ints,
     * None and views of a map, none of which can refer back to it. So the collector need not
     * look at it (CPython untracks such tuples itself, but only for atomic contents, and
     * memoryviews are not): a fetch of 500 Records then costs a young collection half the
     * objects to traverse. */
    PyObject_GC_UnTrack(r);
    return r;
fail:
    for (int i = 0; i < 5; i++) Py_XDECREF(items[i]);
    return NULL;
}

/* ---- the Record pool of scans and fetches ------------------------------------------------
 *
 * A fetch returns hundreds of Records that its caller drops at the next fetch, and a scan's
 * Records are dropped one by one: allocating each Record anew costs an allocation and a
 * deallocation, and, worse, counts as a new container for the collector. A view and a
 * Record per record is 2 counted allocations, so a poll(500) crosses the young generation's
 * threshold (700) on every call while the previous batch is still alive: a young collection
 * per poll promotes live batches, and their promotion sets off full collections, which
 * traverse the whole heap (half a poll's time in a big heap, measured with gc.callbacks).
 *
 * So scans and fetches take their Records from a ring of POOL_SIZE Records: the one at the
 * cursor is reused when the ring holds its only reference (its last user dropped it; the
 * same test zip() and enumerate() make to reuse their result tuples), else a new Record
 * takes its place in the ring. A reused Record is never seen by anyone else: its reference
 * count says no one else holds it, it is untracked (so gc.get_objects() cannot reach it) and
 * Records are not weak-referenceable. Its items are replaced in place, which releases the
 * old ones (a view of a map among them).
 *
 * A Record its user dropped must not keep a map alive for long: release_pooled(except) lets
 * go of the items of every Record no one else holds whose views are of another map than
 * `except`. A scan call of another map than the last call's does it for the maps other than
 * its own (so a scan over many segments keeps no more of them mapped than before; a run of
 * calls on one map pays nothing), and Reader dealloc (a sealed segment's maps let go: evicted
 * from the cache, the log closed, the segment deleted) for all. What stays: a Record dropped
 * after its segment's maps were let go keeps that map until a scan call of another map or
 * until its slot is reused (at most POOL_SIZE Records later). Maps are told apart by address
 * only: one reused by a new view at worst delays a release.
 * (Records of the scan's own map are not released at each call: freeing a thousand views at
 * once and then making a thousand unbalances the collector's count, which the pool avoids.)
 *
 * Only where a Record is made with tp_alloc (CPython < 3.14: 3.14's tuples cache their hash)
 * and where reference counts are exact (not on free-threaded builds). */
#define POOL_SIZE 2048u /* > 2 x poll(1000): the batch the caller still holds, and the new one */
static PyObject *pool[POOL_SIZE];
static const PyObject *pool_map[POOL_SIZE]; /* the map view each was sliced from (compared only) */
static size_t pool_cursor = 0;
static const PyObject *last_scan_map = NULL; /* the map of the last scan call (compared only) */

static void release_pooled(const PyObject *except) {
    for (size_t i = 0; i < POOL_SIZE; i++) {
        PyObject *r = pool[i];
        if (r == NULL || pool_map[i] == NULL || pool_map[i] == except || Py_REFCNT(r) != 1) continue;
        pool_map[i] = NULL;
        for (Py_ssize_t k = 0; k < 5; k++) {
            Py_INCREF(Py_None);
            PyTuple_SetItem(r, k, Py_None); /* refcount 1: cannot fail; releases the old item */
        }
    }
}

/* Use the pool or not (on only with tp_alloc); the Records it held are let go either way. */
static void set_pool(int on) {
    for (size_t i = 0; i < POOL_SIZE; i++) {
        pool_map[i] = NULL;
        Py_CLEAR(pool[i]);
    }
#ifdef Py_GIL_DISABLED
    (void)on;
    pool_on = 0;
#else
    pool_on = on;
#endif
}

/* A Record of five new references (stolen, also on failure), from the pool when it can. */
static PyObject *pooled_record(const PyObject *mv, PyObject *off, PyObject *ts, PyObject *key, PyObject *value,
                               PyObject *meta) {
    if (!pool_on) return make_record(off, ts, key, value, meta);
    PyObject *items[5] = {off, ts, key, value, meta};
    for (int i = 0; i < 5; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 5; j++) Py_XDECREF(items[j]);
            return NULL;
        }
    }
    size_t i = pool_cursor++ & (POOL_SIZE - 1);
    PyObject *r = pool[i];
    if (r != NULL && Py_REFCNT(r) == 1) {
        for (int k = 0; k < 5; k++) PyTuple_SetItem(r, k, items[k]); /* steals; releases the old item */
        pool_map[i] = mv;
        Py_INCREF(r);
        return r;
    }
    r = make_record(off, ts, key, value, meta);
    if (r == NULL) return NULL;
    Py_INCREF(r);
    PyObject *old = pool[i];
    pool[i] = r;
    pool_map[i] = mv;
    Py_XDECREF(old); /* held elsewhere too (its count was not 1): not freed here */
    return r;
}

/* ---- views of a map, made without a slice ------------------------------------------------
 *
 * mv[a:b] through PySequence_GetSlice costs two ints and a slice object besides the new
 * view (a third of a scanned Record's time). The view it makes is a copy of mv's view,
 * registered with the same managed buffer (so it holds the map's export just the same),
 * whose buf, len and shape[0] are then moved to the slice. PyMemoryView_FromObject(mv)
 * makes that copy (mbuf_add_view: a new memoryview of mv's managed buffer); fast_view then
 * moves buf, len and shape[0] itself, as memoryview's own slicing (init_slice) does for a
 * one-dimensional, contiguous view of bytes.
 *
 * The memoryview object's layout is not part of the limited API, so it is mirrored here
 * (PyMemoryViewObject of CPython 3.10-3.14; Py_buffer is stable) and used only when
 * check_view_layout, at import, finds the running interpreter's memoryviews laid out so
 * (their basic and item sizes, and every field read or written here, compared with what a
 * real slice holds) and fast_view's views equal to real slices. Otherwise, on free-threaded
 * builds (another object header), and for a map view that is not one-dimensional bytes with
 * unit stride, views are made by slicing. */
typedef struct {
    void *buf;
    PyObject *obj;
    Py_ssize_t len;
    Py_ssize_t itemsize;
    int readonly;
    int ndim;
    char *format;
    Py_ssize_t *shape;
    Py_ssize_t *strides;
    Py_ssize_t *suboffsets;
    void *internal;
} view_buffer; /* Py_buffer */

typedef struct {
    PyVarObject ob_base;
    void *mbuf;
    Py_hash_t hash;
    int flags;
    Py_ssize_t exports;
    view_buffer view;
    PyObject *weakreflist;
    Py_ssize_t ob_array[1];
} view_layout; /* PyMemoryViewObject */

/* memoryview's flags: a contiguous view in use (not released, not restricted) has these */
#define VIEW_FLAGS_CONTIGUOUS 0x006 /* _Py_MEMORYVIEW_C | _Py_MEMORYVIEW_FORTRAN */

static int fast_views = 0; /* check_view_layout passed (and not turned off) */
static int fast_views_ok = 0; /* check_view_layout passed */

/* Is mv a view fast_view can make views of: in use (not released), one dimension of bytes,
 * unit stride, its shape and strides in the object (where a memoryview keeps them)? */
static inline int plain_bytes_view(PyObject *mv) {
    const view_layout *l = (const view_layout *)mv;
    return fast_views && l->flags == VIEW_FLAGS_CONTIGUOUS && l->view.ndim == 1 && l->view.itemsize == 1 &&
           l->view.shape == l->ob_array && l->view.strides == l->ob_array + 1 && l->view.strides[0] == 1 &&
           l->view.suboffsets == NULL && l->view.shape[0] == l->view.len;
}

/* mv[a:b] of a plain_bytes_view mv: a new view of mv's managed buffer. Frames lie within
 * the map, so 0 <= a <= b <= len(mv) holds; were it not to, slicing (which clips to the
 * view) makes the view: none ever reaches past the map. */
static inline PyObject *fast_view(PyObject *mv, Py_ssize_t a, Py_ssize_t b) {
    if (a < 0 || a > b || b > ((const view_layout *)mv)->view.len) return PySequence_GetSlice(mv, a, b);
    PyObject *v = PyMemoryView_FromObject(mv);
    if (v == NULL) return NULL;
    view_layout *l = (view_layout *)v;
    l->view.buf = (char *)l->view.buf + a;
    l->view.len = b - a;
    l->view.shape[0] = b - a;
    return v;
}

static int same_view(PyObject *x, PyObject *y) {
    const view_layout *a = (const view_layout *)x, *b = (const view_layout *)y;
    return a->mbuf == b->mbuf && a->view.buf == b->view.buf && a->view.obj == b->view.obj &&
           a->view.len == b->view.len && a->view.itemsize == 1 && b->view.itemsize == 1 &&
           a->view.readonly == b->view.readonly && a->view.ndim == 1 && b->view.ndim == 1 &&
           a->view.shape == a->ob_array && b->view.shape == b->ob_array && a->view.shape[0] == b->view.shape[0] &&
           a->view.strides == a->ob_array + 1 && b->view.strides == b->ob_array + 1 && a->view.strides[0] == 1 &&
           b->view.strides[0] == 1 && a->view.suboffsets == NULL && b->view.suboffsets == NULL &&
           a->flags == b->flags && a->hash == b->hash && a->exports == 0 && b->exports == 0;
}

/* 1: this interpreter's memoryviews are laid out as view_layout says and fast_view makes
 * exactly the views slicing makes; 0: they are not (or it cannot tell). Never fails. */
static int check_view_layout(void) {
#ifdef Py_GIL_DISABLED
    return 0;
#else
    int ok = 0;
    PyObject *data = NULL, *base = NULL, *slice = NULL, *fast = NULL, *empty = NULL, *fast_empty = NULL;
    PyObject *type = (PyObject *)&PyMemoryView_Type;
    PyObject *basic = PyObject_GetAttrString(type, "__basicsize__");
    PyObject *item = basic ? PyObject_GetAttrString(type, "__itemsize__") : NULL;
    if (item == NULL || PyLong_AsSsize_t(basic) != (Py_ssize_t)offsetof(view_layout, ob_array) ||
        PyLong_AsSsize_t(item) != (Py_ssize_t)sizeof(Py_ssize_t))
        goto done;
    data = PyBytes_FromStringAndSize("0123456789abcdefghijklmnopqrstuvwxyz", 36);
    base = data ? PyMemoryView_FromObject(data) : NULL;
    if (base == NULL) goto done;
    const view_layout *b = (const view_layout *)base;
    if (b->view.buf != (void *)PyBytes_AsString(data) || b->view.obj != data || b->view.len != 36 ||
        b->view.readonly != 1 || b->view.ndim != 1 || b->view.itemsize != 1 || b->view.shape != b->ob_array ||
        b->view.strides != b->ob_array + 1 || b->view.shape[0] != 36 || b->view.strides[0] != 1 ||
        b->view.suboffsets != NULL || b->view.format == NULL || strcmp(b->view.format, "B") != 0 ||
        b->hash != -1 || b->exports != 0 || b->weakreflist != NULL || b->flags != VIEW_FLAGS_CONTIGUOUS)
        goto done;
    slice = PySequence_GetSlice(base, 5, 17);
    empty = slice ? PySequence_GetSlice(base, 36, 36) : NULL;
    if (empty == NULL) goto done;
    fast_views = 1; /* for plain_bytes_view while checking */
    if (!plain_bytes_view(base) || !plain_bytes_view(slice)) goto done;
    fast = fast_view(base, 5, 17);
    fast_empty = fast ? fast_view(base, 36, 36) : NULL;
    if (fast_empty == NULL) goto done;
    ok = same_view(slice, fast) && same_view(empty, fast_empty) &&
         ((const view_layout *)slice)->view.buf == (const char *)b->view.buf + 5 &&
         ((const view_layout *)slice)->view.len == 12 && PyObject_RichCompareBool(slice, fast, Py_EQ) == 1 &&
         PyObject_Size(fast) == 12 && PyObject_Size(fast_empty) == 0;
done:
    fast_views = 0;
    PyErr_Clear();
    Py_XDECREF(basic);
    Py_XDECREF(item);
    Py_XDECREF(fast_empty);
    Py_XDECREF(fast);
    Py_XDECREF(empty);
    Py_XDECREF(slice);
    Py_XDECREF(base);
    Py_XDECREF(data);
    return ok;
#endif
}

/* mv[a:b] (a new view sharing mv's managed buffer), or None when null. `fast`: mv is a
 * plain_bytes_view (0 <= a <= b <= len(mv) always holds: frames lie within the map). */
static inline PyObject *field(PyObject *mv, int fast, int null, uint64_t a, uint64_t b) {
    if (null) {
        Py_INCREF(Py_None);
        return Py_None;
    }
    if (fast) return fast_view(mv, (Py_ssize_t)a, (Py_ssize_t)b);
    return PySequence_GetSlice(mv, (Py_ssize_t)a, (Py_ssize_t)b);
}

/* The Record of a decoded (CRC-checked) frame; ts, when given, is reused (a new reference
 * is taken). `pooled`: from the Record pool (scans and fetches). */
static PyObject *frame_record(PyObject *mv, int fast, const plog_frame *f, PyObject *ts, int pooled) {
    uint64_t p = f->position + PLOG_FRAME_HEADER_SIZE;
    uint64_t m = p + f->key_length, v = m + f->metadata_length;
    uint32_t a = f->attributes;
    if (ts != NULL) Py_INCREF(ts);
    else ts = PyLong_FromLongLong(f->timestamp);
    PyObject *off = PyLong_FromUnsignedLongLong(f->offset);
    PyObject *k = field(mv, fast, a & PLOG_ATTR_NULL_KEY, p, m);
    PyObject *val = field(mv, fast, a & PLOG_ATTR_NULL_VALUE, v, v + f->value_length);
    PyObject *meta = field(mv, fast, a & PLOG_ATTR_NULL_METADATA, m, v);
    return pooled ? pooled_record(mv, off, ts, k, val, meta) : make_record(off, ts, k, val, meta);
}

/* Arguments shared by read and scan: the memoryview of a store map, the address and length
 * of the bytes C reads (the same map). */
static int map_args(PyObject *const *args, PyObject **mv, const uint8_t **buf, size_t *len) {
    *mv = args[0];
    if (!PyMemoryView_Check(*mv)) {
        PyErr_SetString(PyExc_TypeError, "expected the store map's memoryview");
        return -1;
    }
    uintptr_t addr = (uintptr_t)PyLong_AsVoidPtr(args[1]);
    if (addr == 0 && PyErr_Occurred()) return -1;
    unsigned long long l = PyLong_AsUnsignedLongLong(args[2]);
    if (l == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    Py_ssize_t n = PyObject_Size(*mv);
    if (n < 0) return -1;
    if (l > (unsigned long long)n) { /* C must never read past the view it was given */
        PyErr_Format(PyExc_ValueError, "store length %llu is past the map's %zd bytes", l, n);
        return -1;
    }
    *buf = (const uint8_t *)addr;
    *len = (size_t)l;
    return 0;
}

static int u64_arg(PyObject *o, uint64_t *out) {
    if (o == Py_None) {
        *out = UINT64_MAX;
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = v;
    return 0;
}

PyDoc_STRVAR(read_doc,
"read(mv, addr, length, index_addr, n_index, base_offset, gaps, target) -> Record | None\n\n"
"The Record at ``target``: the index lookup, the CRC-checked frame and the Record in one\n"
"call. None when it cannot be read this way (no such offset here, a compacted gap, a bad\n"
"frame on the way): the caller's checked slow path then finds out why.");

static PyObject *sp_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "read() takes 8 arguments");
        return NULL;
    }
    PyObject *mv;
    const uint8_t *buf;
    size_t len;
    if (map_args(args, &mv, &buf, &len) < 0) return NULL;
    const uint8_t *index = (const uint8_t *)PyLong_AsVoidPtr(args[3]);
    if (index == NULL && PyErr_Occurred()) return NULL;
    Py_ssize_t n_index = PyLong_AsSsize_t(args[4]);
    if (n_index == -1 && PyErr_Occurred()) return NULL;
    uint64_t base, target;
    if (u64_arg(args[5], &base) < 0) return NULL;
    int gaps = PyObject_IsTrue(args[6]);
    if (gaps < 0) return NULL;
    if (u64_arg(args[7], &target) < 0) return NULL;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_record_type was not called");
        return NULL;
    }
    plog_frame f;
    if (n_index < 0) n_index = 0;
    if (plog_find(buf, len, index, (size_t)n_index, base, target, gaps, &f) != PLOG_OK || f.offset != target)
        Py_RETURN_NONE;
    return frame_record(mv, plain_bytes_view(mv), &f, NULL, 0);
}

/* ---- a sealed segment's reader ------------------------------------------------------------ */

/* read() with the map's arguments parsed once: a sealed segment's maps never change, so
 * each read passes one argument (the offset). Holds the map's memoryview (views are sliced
 * from it) and `keep`, the objects owning the memory C reads (the store and index maps).
 *
 * Random reads: the sparse index (an entry per index_interval_bytes) leaves a walk of up to
 * a few KiB of frame headers per read, most of a random read's time. A Reader remembers the
 * positions its walks find: the first read in an index block walks the whole block (headers
 * only, with plog_find's rules: lengths in bounds, offsets consecutive) and keeps each
 * frame's position; later reads in that block decode their frame directly. The target frame
 * itself is CRC-checked on every read, as plog_find does. The table is allocated zeroed and
 * untouched (the OS backs only the pages filled), at most 4 bytes per record of the segment,
 * freed with the Reader when the segment is unmapped. Compacted segments (gaps) and blocks
 * whose walk finds anything unusual use plog_find. */
typedef struct {
    PyObject_HEAD
    PyObject *mv;
    PyObject *keep;
    const uint8_t *buf;
    size_t len;
    const uint8_t *index;
    size_t n_index;
    uint64_t base;
    int gaps;
    uint64_t count;        /* records in the segment (next_offset - base) */
    uint8_t *block_state;  /* per index entry: 0 not walked, 1 positions known, 2 use plog_find */
    uint32_t *positions;   /* per record: its frame's position, where its block is known */
} Reader;

enum { BLOCK_UNKNOWN = 0, BLOCK_KNOWN = 1, BLOCK_FIND = 2 };

/* Walk index block b and fill in its positions: BLOCK_KNOWN, or BLOCK_FIND when the walk
 * meets anything plog_find would not step over. */
static uint8_t fill_block(Reader *r, size_t b) {
    const uint8_t *e = r->index + b * PLOG_INDEX_ENTRY_SIZE;
    uint64_t rel = plog_ld32(e), pos = plog_ld32(e + 4);
    uint64_t end = b + 1 < r->n_index ? plog_ld32(e + PLOG_INDEX_ENTRY_SIZE) : r->count;
    if (end > r->count || rel >= end) return BLOCK_FIND;
    for (; rel < end; rel++) {
        if (pos >= r->len || r->len - pos < PLOG_FRAME_HEADER_SIZE || pos > UINT32_MAX) return BLOCK_FIND;
        const uint8_t *p = r->buf + pos;
        uint32_t body = plog_ld32(p);
        if (body < PLOG_FRAME_HEADER_SIZE - PLOG_FRAME_PREFIX_SIZE || body > 0x7fffffffu) return BLOCK_FIND;
        if (plog_ld64(p + 8) != r->base + rel) return BLOCK_FIND;
        r->positions[rel] = (uint32_t)pos;
        pos += (uint64_t)body + PLOG_FRAME_PREFIX_SIZE;
    }
    return BLOCK_KNOWN;
}

/* The CRC-checked frame of `target` through the block table: 1 found, 0 not (use plog_find). */
static int reader_locate(Reader *r, uint64_t target, plog_frame *f) {
    if (r->gaps || r->n_index == 0 || target < r->base || target - r->base >= r->count) return 0;
    uint64_t rel = target - r->base;
    size_t slot;
    if (plog_index_lookup(r->index, r->n_index, (uint32_t)rel, &slot) != PLOG_OK) return 0;
    if (r->block_state == NULL) {
        r->block_state = PyMem_Calloc(r->n_index, 1);
        r->positions = PyMem_Calloc((size_t)r->count, sizeof(uint32_t));
        if (r->block_state == NULL || r->positions == NULL) { /* no table: plog_find only */
            PyMem_Free(r->positions);
            r->positions = NULL;
            if (r->block_state) memset(r->block_state, BLOCK_FIND, r->n_index);
            else return 0;
        }
    }
    uint8_t st = r->block_state[slot];
    if (st == BLOCK_UNKNOWN) st = r->block_state[slot] = fill_block(r, slot);
    if (st != BLOCK_KNOWN) return 0;
    size_t n = 0;
    uint64_t end;
    return plog_scan(r->buf, r->len, r->positions[rel], target, 0, f, 1, UINT64_MAX, &n, &end) == PLOG_OK &&
           n == 1;
}

static PyTypeObject *reader_type = NULL;

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (kwargs != NULL && PyDict_Size(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "Reader() takes no keyword arguments");
        return NULL;
    }
    if (!PyTuple_Check(args) || PyTuple_Size(args) != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "Reader(mv, addr, length, index_addr, n_index, base_offset, gaps, keep, count)");
        return NULL;
    }
    PyObject *a[9];
    for (Py_ssize_t i = 0; i < 9; i++) a[i] = PyTuple_GetItem(args, i);
    PyObject *mv;
    const uint8_t *buf;
    size_t len;
    if (map_args(a, &mv, &buf, &len) < 0) return NULL;
    const uint8_t *index = (const uint8_t *)PyLong_AsVoidPtr(a[3]);
    if (index == NULL && PyErr_Occurred()) return NULL;
    Py_ssize_t n_index = PyLong_AsSsize_t(a[4]);
    if (n_index == -1 && PyErr_Occurred()) return NULL;
    uint64_t base;
    if (u64_arg(a[5], &base) < 0) return NULL;
    int gaps = PyObject_IsTrue(a[6]);
    if (gaps < 0) return NULL;
    uint64_t count;
    if (u64_arg(a[8], &count) < 0) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Reader *r = (Reader *)alloc(type, 0);
    if (r == NULL) return NULL;
    Py_INCREF(mv);
    r->mv = mv;
    Py_INCREF(a[7]);
    r->keep = a[7];
    r->buf = buf;
    r->len = len;
    r->index = index;
    r->n_index = n_index < 0 ? 0 : (size_t)n_index;
    r->base = base;
    r->gaps = gaps;
    r->count = count;
    r->block_state = NULL;
    r->positions = NULL;
    return (PyObject *)r;
}

static void reader_dealloc(PyObject *o) {
    Reader *r = (Reader *)o;
    PyTypeObject *tp = Py_TYPE(o);
    Py_XDECREF(r->mv);
    Py_XDECREF(r->keep);
    release_pooled(NULL); /* the maps go: no Record dropped by its user may keep them alive */
    PyMem_Free(r->block_state);
    PyMem_Free(r->positions);
    freefunc free_ = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    free_(o);
    Py_DECREF(tp);
}

static PyObject *reader_read(PyObject *o, PyObject *arg) {
    Reader *r = (Reader *)o;
    unsigned long long target = PyLong_AsUnsignedLongLong(arg);
    if (target == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_record_type was not called");
        return NULL;
    }
    plog_frame f;
    if (!reader_locate(r, target, &f) &&
        (plog_find(r->buf, r->len, r->index, r->n_index, r->base, target, r->gaps, &f) != PLOG_OK ||
         f.offset != target))
        Py_RETURN_NONE;
    return frame_record(r->mv, plain_bytes_view(r->mv), &f, NULL, 0);
}

static PyMethodDef reader_methods[] = {
    {"read", reader_read, METH_O,
     "read(offset) -> Record | None: the Record at offset (index lookup, CRC-checked frame, Record), "
     "or None when it cannot be read this way (the caller's checked slow path finds out why)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot reader_slots[] = {
    {Py_tp_new, (void *)reader_new},
    {Py_tp_dealloc, (void *)reader_dealloc},
    {Py_tp_methods, (void *)reader_methods},
    {Py_tp_doc, (void *)"Reader(mv, addr, length, index_addr, n_index, base_offset, gaps, keep, count): "
                        "reads of one sealed segment's map (count records), its arguments parsed once."},
    {0, NULL},
};

static PyType_Spec reader_spec = {
    "pylog._speedups.Reader",
    sizeof(Reader),
    0,
    Py_TPFLAGS_DEFAULT,
    reader_slots,
};

/* ---- the lazy iterator of a scanned chunk ---------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *mv;
    plog_frame *frames;
    size_t n, i;
    PyObject *ts; /* the last timestamp made, reused while equal */
    int64_t ts_value;
    int fast; /* mv is a plain_bytes_view */
} RecordIter;

static PyTypeObject *record_iter_type = NULL;

static void record_iter_dealloc(PyObject *o) {
    RecordIter *it = (RecordIter *)o;
    PyTypeObject *tp = Py_TYPE(o);
    Py_XDECREF(it->mv);
    Py_XDECREF(it->ts);
    PyMem_Free(it->frames);
    freefunc free_ = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    free_(o);
    Py_DECREF(tp);
}

static inline PyObject *next_ts(PyObject **cache, int64_t *value, int64_t ts) {
    if (*cache == NULL || *value != ts) {
        PyObject *o = PyLong_FromLongLong(ts);
        if (o == NULL) return NULL;
        Py_XDECREF(*cache);
        *cache = o;
        *value = ts;
    }
    return *cache;
}

static PyObject *record_iter_next(PyObject *o) {
    RecordIter *it = (RecordIter *)o;
    if (it->i >= it->n) {
        if (it->frames != NULL) { /* exhausted: let go of the map now */
            PyMem_Free(it->frames);
            it->frames = NULL;
            Py_CLEAR(it->mv);
            Py_CLEAR(it->ts);
        }
        return NULL;
    }
    const plog_frame *f = &it->frames[it->i++];
    PyObject *ts = next_ts(&it->ts, &it->ts_value, f->timestamp);
    if (ts == NULL) return NULL;
    return frame_record(it->mv, it->fast, f, ts, 1);
}

static PyObject *record_iter_length_hint(PyObject *o, PyObject *unused) {
    (void)unused;
    RecordIter *it = (RecordIter *)o;
    return PyLong_FromSize_t(it->n - it->i);
}

static PyMethodDef record_iter_methods[] = {
    {"__length_hint__", record_iter_length_hint, METH_NOARGS, "Records left."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot record_iter_slots[] = {
    {Py_tp_dealloc, (void *)record_iter_dealloc},
    {Py_tp_iter, (void *)PyObject_SelfIter},
    {Py_tp_iternext, (void *)record_iter_next},
    {Py_tp_methods, (void *)record_iter_methods},
    {Py_tp_doc, (void *)"The Records of one scanned chunk, each made as it is consumed."},
    {0, NULL},
};

static PyType_Spec record_iter_spec = {
    "pylog._speedups.RecordIter",
    sizeof(RecordIter),
    0,
    Py_TPFLAGS_DEFAULT,
    record_iter_slots,
};

/* ---- scan ------------------------------------------------------------------------------ */

PyDoc_STRVAR(scan_doc,
"scan(mv, addr, length, start, expected_offset, max_out, max_bytes, gaps, lazy)\n"
"    -> (records, count, last_offset, status, end_position, bytes_used, first_frame_size)\n\n"
"The C core's scan (plog_scan: up to ``max_out`` CRC-valid frames from ``start``, stopping\n"
"after ``max_bytes`` of frames) and the Records of the frames it found: a list, or with\n"
"``lazy`` an iterator that makes each Record as it is consumed. ``status`` is OK or why the\n"
"scan stopped before a bad frame; ``last_offset`` is -1 when nothing was found.");

static PyObject *sp_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "scan() takes 9 arguments");
        return NULL;
    }
    PyObject *mv;
    const uint8_t *buf;
    size_t len;
    if (map_args(args, &mv, &buf, &len) < 0) return NULL;
    uint64_t start, expected, max_bytes;
    if (u64_arg(args[3], &start) < 0 || u64_arg(args[4], &expected) < 0) return NULL;
    Py_ssize_t max_out = PyLong_AsSsize_t(args[5]);
    if (max_out == -1 && PyErr_Occurred()) return NULL;
    if (u64_arg(args[6], &max_bytes) < 0) return NULL;
    int gaps = PyObject_IsTrue(args[7]);
    int lazy = PyObject_IsTrue(args[8]);
    if (gaps < 0 || lazy < 0) return NULL;
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "set_record_type was not called");
        return NULL;
    }
    if (mv != last_scan_map) { /* Records dropped since keep no other map alive */
        release_pooled(mv);
        last_scan_map = mv;
    }
    if (max_out < 0) max_out = 0;
    int fast = plain_bytes_view(mv);
    /* no more frames than the bytes after start could hold */
    size_t room = start < len ? (size_t)((len - start) / PLOG_FRAME_HEADER_SIZE) + 1 : 1;
    size_t cap = (size_t)max_out < room ? (size_t)max_out : room;
    plog_frame *frames = PyMem_Malloc((cap ? cap : 1) * sizeof(plog_frame));
    if (frames == NULL) return PyErr_NoMemory();
    size_t n = 0;
    uint64_t end = start;
    int rc = plog_scan(buf, len, (size_t)start, expected, gaps, frames, cap, max_bytes, &n, &end);
    unsigned long long used = 0;
    for (size_t i = 0; i < n; i++) used += frames[i].frame_size;
    long long last = n ? (long long)frames[n - 1].offset : -1;
    unsigned long first_size = n ? frames[0].frame_size : 0;
    PyObject *records;
    if (lazy) {
        RecordIter *it = PyObject_New(RecordIter, record_iter_type);
        if (it == NULL) {
            PyMem_Free(frames);
            return NULL;
        }
        Py_INCREF(mv);
        it->mv = mv;
        it->frames = frames;
        it->n = n;
        it->i = 0;
        it->ts = NULL;
        it->ts_value = 0;
        it->fast = fast;
        records = (PyObject *)it;
    } else {
        records = PyList_New((Py_ssize_t)n);
        if (records == NULL) {
            PyMem_Free(frames);
            return NULL;
        }
        /* Thousands of new objects that all survive would set off young-generation
         * collections over and over, none of which can free anything: pause the collector. */
        int was_enabled = n > 64 ? PyGC_Disable() : 0;
        PyObject *ts = NULL;
        int64_t ts_value = 0;
        for (size_t i = 0; i < n; i++) {
            PyObject *t = next_ts(&ts, &ts_value, frames[i].timestamp);
            PyObject *r = t == NULL ? NULL : frame_record(mv, fast, &frames[i], t, 1);
            if (r == NULL) {
                Py_CLEAR(records);
                break;
            }
            PyList_SetItem(records, (Py_ssize_t)i, r);
        }
        Py_XDECREF(ts);
        if (was_enabled) PyGC_Enable();
        PyMem_Free(frames);
        if (records == NULL) return NULL;
    }
    return Py_BuildValue("(NnLiKKk)", records, (Py_ssize_t)n, last, rc, (unsigned long long)end, used,
                         first_size);
}

static PyObject *set_fast_views(PyObject *self, PyObject *flag) {
    (void)self;
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    int was = fast_views;
    fast_views = on && fast_views_ok;
    return PyBool_FromLong(was);
}

static PyObject *set_direct_alloc(PyObject *self, PyObject *flag) {
    (void)self;
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    int was = direct_alloc;
    direct_alloc = on;
    set_pool(on);
    return PyBool_FromLong(was);
}

static PyMethodDef read_methods[] = {
    {"_set_direct_alloc", set_direct_alloc, METH_O,
     "Tests only: make Records with tp_alloc (True) or through tuple.__new__ (False, what CPython >= 3.14 "
     "gets); returns the previous setting."},
    {"_set_fast_views", set_fast_views, METH_O,
     "Tests only: make views of maps without slicing (True: only where the import-time layout check "
     "passed) or by slicing (False); returns the previous setting."},
    {"set_record_type", set_record_type, METH_O, "Register pylog.record.Record, the type of the Records made here."},
    {"read", (PyCFunction)(void (*)(void))sp_read, METH_FASTCALL, read_doc},
    {"scan", (PyCFunction)(void (*)(void))sp_scan, METH_FASTCALL, scan_doc},
    {NULL, NULL, 0, NULL},
};

int pylog_speedups_read_init(PyObject *module) {
    if (PyModule_AddFunctions(module, read_methods) < 0) return -1;
    record_iter_type = (PyTypeObject *)PyType_FromSpec(&record_iter_spec);
    if (record_iter_type == NULL) return -1;
    Py_INCREF(record_iter_type);
    if (PyModule_AddObject(module, "RecordIter", (PyObject *)record_iter_type) < 0) {
        Py_DECREF(record_iter_type);
        return -1;
    }
    reader_type = (PyTypeObject *)PyType_FromSpec(&reader_spec);
    if (reader_type == NULL) return -1;
    Py_INCREF(reader_type);
    if (PyModule_AddObject(module, "Reader", (PyObject *)reader_type) < 0) {
        Py_DECREF(reader_type);
        return -1;
    }
    /* the runtime's version, not the headers': an abi3 build runs on later CPythons too */
    PyObject *vi = PySys_GetObject("version_info"); /* borrowed */
    PyObject *minor = vi ? PySequence_GetItem(vi, 1) : NULL;
    PyObject *major = vi ? PySequence_GetItem(vi, 0) : NULL;
    if (minor == NULL || major == NULL) {
        Py_XDECREF(minor);
        Py_XDECREF(major);
        return -1;
    }
    long maj = PyLong_AsLong(major), min = PyLong_AsLong(minor);
    Py_DECREF(minor);
    Py_DECREF(major);
    direct_alloc = maj == 3 && min < 14;
    fast_views = fast_views_ok = check_view_layout();
    if (PyModule_AddIntConstant(module, "FAST_VIEWS", fast_views) < 0) return -1;
    set_pool(direct_alloc);
    PyObject *tuple_type = (PyObject *)&PyTuple_Type;
    tuple_new = PyObject_GetAttrString(tuple_type, "__new__");
    if (tuple_new == NULL) return -1;
    return PyModule_AddIntConstant(module, "DIRECT_ALLOC", direct_alloc);
}
