/*
 * The append side of pylog._speedups: the per-record append fast path.
 *
 * A Framer frames one record (a bytes value, no key, no metadata, a clamped timestamp) into
 * one active segment's write buffer with the C core's plog_frame_one: frame_value() is
 * pylog._native.Appender.frame_value without cffi's argument conversion (the caller holds
 * the log's lock), and append() is Log.append's whole common case in one call: it takes the
 * log's lock (a threading.RLock, through its acquire and release), frames with the time now
 * and releases the lock. Taking the lock in C leaves no point where a signal handler's
 * exception could leave it held: Python runs handlers only between bytecodes (and inside a
 * blocking acquire, which then fails and holds nothing).
 *
 * The appender state (plog_appender) and the write buffer are the ones pylog._native
 * allocated with cffi; their addresses come in as integers, each together with the Python
 * object that owns the memory, which the Framer keeps a reference to, so the memory it
 * writes to outlives it. The write buffer is replaced when it grows (Appender.reserve),
 * which hands the Framer the new one (set_buffer). The log turns a Framer off (enable) under
 * its lock when its segment stops being the append target (a roll, a fence, a close), and
 * append() checks that once it holds the lock: it then frames nothing and says so
 * (FRAMER_OFF), and Log.append takes its general path.
 *
 * lengths() is append_batch's len() of every item, as uint32s, in one C loop.
 *
 * Framer.frame_gather() is append_batch's write of a big batch of bytes values without
 * joining them into one buffer first: a chunk at a time, headers and small values are made
 * in the (empty) write buffer, each larger value's CRC is taken where it lies, and the
 * frames go out with pwritev, large values straight from the callers' bytes objects (the
 * GIL released). The file peer of the
 * comparison benchmark joins, then writes: one user-space copy and one kernel copy; this
 * leaves only the kernel's.
 *
 * Framer.write_out(fd) is the write-out of the write buffer (ActiveSegment.write_pending's
 * pwrite and drain, for the group commit leader of fsync="always" above all): one pwrite
 * loop without the GIL, then the buffer forgotten, in one call.
 */
#include "speedups.h"
#include "groupcommit.h"
#include "pylog.h"

#include <structmember.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    plog_appender *st;
    uint8_t *buf;
    Py_ssize_t cap;
    PyObject *st_owner;  /* keeps *st alive */
    PyObject *buf_owner; /* keeps buf[0..cap) alive */
    PyObject *acquire;   /* the log lock's acquire and release (bound methods), for append() */
    PyObject *release;
    int enabled;         /* append() frames only while this is the log's append target */
    /* frame_gather's per-record arrays, kept between calls up to GATHER_KEEP_RECORDS
     * records (a bigger batch's are freed after it), freed with the Framer */
    size_t g_records;    /* records the arrays below have room for */
    const uint8_t **g_values;
    uint32_t *g_lens;
    plog_piece *g_pieces; /* 2 a record */
    struct iovec *g_iov;  /* 2 a record */
} Framer;

/* frame_gather frames and writes a batch a chunk at a time: the frames of about
 * GATHER_CHUNK bytes are made in the (empty) write buffer, used as scratch (reused, so it
 * stays in the CPU's cache: copied, CRC'd and handed to the kernel while hot), then
 * written. A value shorter than GATHER_COPY_BELOW is copied there after its header; a
 * longer one is written from where it lies (a piece of its own in the pwritev: the kernel's
 * cost per piece, ~60 ns measured, is below the copy's only for values this large). */
#ifndef GATHER_CHUNK
#define GATHER_CHUNK (512 * 1024)
#endif
#define GATHER_COPY_BELOW (16 * 1024)
/* the smallest write buffer frame_gather works in (the caller reserves more) */
#define GATHER_MIN_BUFFER (PLOG_FRAME_HEADER_SIZE + GATHER_COPY_BELOW + 64 * 1024)
#define GATHER_KEEP_RECORDS 16384

/* What append() returns when it did not frame (not enabled): below every core status. */
#define FRAMER_OFF (-1000)

/* A clock for tests (a callable returning ms since the epoch), or NULL: CLOCK_REALTIME. */
static PyObject *test_clock = NULL;

static const uint8_t empty[1] = {0};

static void *addr_of(PyObject *o) {
    unsigned long long a = PyLong_AsUnsignedLongLong(o);
    if (a == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (a == 0) {
        PyErr_SetString(PyExc_ValueError, "Framer: a NULL address");
        return NULL;
    }
    return (void *)(uintptr_t)a;
}

static PyObject *framer_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *addr, *owner;
    static char *kwlist[] = {"st_addr", "owner", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:Framer", kwlist, &addr, &owner)) return NULL;
    void *st = addr_of(addr);
    if (st == NULL) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    Framer *self = (Framer *)alloc(type, 0);
    if (self == NULL) return NULL;
    self->st = (plog_appender *)st;
    self->buf = NULL;
    self->cap = 0;
    Py_INCREF(owner);
    self->st_owner = owner;
    self->buf_owner = NULL;
    self->acquire = self->release = NULL;
    self->enabled = 0;
    self->g_records = 0;
    self->g_values = NULL;
    self->g_lens = NULL;
    self->g_pieces = NULL;
    self->g_iov = NULL;
    return (PyObject *)self;
}

static void framer_dealloc(PyObject *o) {
    Framer *self = (Framer *)o;
    PyTypeObject *tp = Py_TYPE(o);
    Py_XDECREF(self->st_owner);
    Py_XDECREF(self->buf_owner);
    Py_XDECREF(self->acquire);
    Py_XDECREF(self->release);
    free(self->g_values);
    free(self->g_lens);
    free(self->g_pieces);
    free(self->g_iov);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(o);
    Py_DECREF(tp);
}

PyDoc_STRVAR(set_buffer_doc,
"set_buffer(addr, cap, owner)\n\n"
"Frame into the write buffer at ``addr`` of ``cap`` bytes from now on; ``owner`` owns that\n"
"memory (kept alive by the Framer).");

static PyObject *framer_set_buffer(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Framer *self = (Framer *)o;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_buffer(addr, cap, owner) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t cap = PyLong_AsSsize_t(args[1]);
    if (cap == -1 && PyErr_Occurred()) return NULL;
    if (cap < 0) {
        PyErr_SetString(PyExc_ValueError, "set_buffer: a negative capacity");
        return NULL;
    }
    uint8_t *buf = NULL;
    if (cap > 0) {
        buf = (uint8_t *)addr_of(args[0]);
        if (buf == NULL) return NULL;
    }
    PyObject *old = self->buf_owner;
    Py_INCREF(args[2]);
    self->buf_owner = args[2];
    self->buf = buf;
    self->cap = cap;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(frame_value_doc,
"frame_value(value, timestamp) -> int\n\n"
"Frame one record (``value`` bytes, no key, no metadata, ``timestamp`` in ms, raised to the\n"
"newest timestamp if below it) into the write buffer: its offset, or a negative status\n"
"(PLOG_E_SPACE, PLOG_E_SEGMENT_FULL, PLOG_E_INDEX_FULL, ...), exactly as\n"
"pylog._native.Appender.frame_value.");

static PyObject *framer_frame_value(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Framer *self = (Framer *)o;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "frame_value(value, timestamp) takes 2 arguments");
        return NULL;
    }
    PyObject *value = args[0];
    if (!PyBytes_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "frame_value: value must be bytes");
        return NULL;
    }
    long long ts = PyLong_AsLongLong(args[1]);
    if (ts == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_Size(value);
    if ((unsigned long long)n >= UINT32_MAX) { /* PLOG_NULL_LEN and above; (Py_ssize_t)UINT32_MAX is -1 on 32-bit */
        PyErr_SetString(PyExc_OverflowError, "frame_value: value too large");
        return NULL;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AsString(value);
    if (data == NULL) return NULL;
    if (self->buf == NULL) /* no buffer yet: "no space", as with a zero-capacity one */
        return PyLong_FromLong(PLOG_E_SPACE);
    int64_t off = plog_frame_one(self->st, self->buf, (size_t)self->cap, empty, 0, empty, 0,
                                 n ? data : empty, (uint32_t)n, 3, (int64_t)ts, 1);
    return PyLong_FromLongLong((long long)off);
}

PyDoc_STRVAR(set_lock_doc,
"set_lock(lock)\n\n"
"The log's lock (a threading.RLock), which append() and append_durable() hold while they\n"
"frame, and append_durable()'s leader while it writes out.");

static PyObject *framer_set_lock(PyObject *o, PyObject *lock) {
    Framer *self = (Framer *)o;
    PyObject *acq = PyObject_GetAttrString(lock, "acquire");
    if (acq == NULL) return NULL;
    PyObject *rel = PyObject_GetAttrString(lock, "release");
    if (rel == NULL) {
        Py_DECREF(acq);
        return NULL;
    }
    PyObject *old[2] = {self->acquire, self->release};
    self->acquire = acq;
    self->release = rel;
    for (int i = 0; i < 2; i++) Py_XDECREF(old[i]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(enable_doc,
"enable(flag)\n\n"
"Whether append() may frame: true only while this appender's segment is the log's append\n"
"target. The log turns it off (under its lock) when the segment stops being that: a roll,\n"
"a fence, a close.");

static PyObject *framer_enable(PyObject *o, PyObject *flag) {
    Framer *self = (Framer *)o;
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    if (on && self->acquire == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "enable: set_lock first");
        return NULL;
    }
    self->enabled = on;
    Py_RETURN_NONE;
}

static int now_ms(int64_t *out) {
    if (test_clock != NULL) {
        PyObject *r = PyObject_CallNoArgs(test_clock);
        if (r == NULL) return -1;
        long long v = PyLong_AsLongLong(r);
        Py_DECREF(r);
        if (v == -1 && PyErr_Occurred()) return -1;
        *out = (int64_t)v;
        return 0;
    }
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    /* time.time_ns() // 1_000_000 */
    *out = (int64_t)t.tv_sec * 1000 + (int64_t)(t.tv_nsec / 1000000);
    return 0;
}

PyDoc_STRVAR(append_doc,
"append(value) -> int\n\n"
"Log.append's common record in one C call: take the log's lock, frame ``value`` (bytes, no\n"
"key, no metadata, the time now in ms, raised to the newest timestamp if below it) into the\n"
"write buffer, release the lock. Its offset; or a negative status when it did not frame: a\n"
"core status (no room, segment full, index full: the caller's general path makes room) or\n"
"FRAMER_OFF (not enabled: the segment stopped being the append target). Taking the lock in\n"
"C leaves no point where a signal handler's exception could leave it held.");

/* append()'s first half: check value, take the log's lock, frame. 0: the lock is held and
 * *off is the offset or a negative status (FRAMER_OFF when not enabled); 1: not enabled, the
 * lock not taken (*off = FRAMER_OFF); -1: an exception, the lock not held. */
static int frame_locked(Framer *self, PyObject *value, int64_t *off) {
    if (!PyBytes_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "append: value must be bytes");
        return -1;
    }
    Py_ssize_t n = PyBytes_Size(value);
    if ((unsigned long long)n >= UINT32_MAX) { /* PLOG_NULL_LEN and above; (Py_ssize_t)UINT32_MAX is -1 on 32-bit */
        PyErr_SetString(PyExc_OverflowError, "append: value too large");
        return -1;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AsString(value);
    if (data == NULL) return -1;
    *off = FRAMER_OFF;
    if (!self->enabled) return 1;
    PyObject *r = PyObject_CallNoArgs(self->acquire);
    if (r == NULL) return -1; /* interrupted while waiting: not held */
    Py_DECREF(r);
    if (self->enabled && self->buf != NULL) { /* checked again under the lock */
        int64_t ts;
        if (now_ms(&ts) < 0) {
            PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
            PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
            r = PyObject_CallNoArgs(self->release);
            Py_XDECREF(r);
            PyErr_Restore(exc_type, exc_value, exc_tb);
            return -1;
        }
        *off = plog_frame_one(self->st, self->buf, (size_t)self->cap, empty, 0, empty, 0,
                              n ? data : empty, (uint32_t)n, 3, ts, 1);
    }
    return 0;
}

/* Release a lock through its bound release method, keeping an exception already set
 * (the release's own failure is then dropped). 0, or -1 with an exception. */
static int call_release(PyObject *release) {
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    int pending = PyErr_Occurred() != NULL;
    if (pending) PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyObject *r = PyObject_CallNoArgs(release);
    if (pending) {
        Py_XDECREF(r);
        if (r == NULL) PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return -1;
    }
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *framer_append(PyObject *o, PyObject *value) {
    Framer *self = (Framer *)o;
    int64_t off;
    int rc = frame_locked(self, value, &off);
    if (rc < 0) return NULL;
    if (rc == 0 && call_release(self->release) < 0) return NULL;
    return PyLong_FromLongLong((long long)off);
}

/* ---- the durable append (group commit: csrc/groupcommit.h) -------------------------------- */

/* pylog.vfs and the functions it holds by default (os.pwrite, its fdatasync): the durable
 * fast path is taken only while vfs still holds those (a test's or a fault injector's
 * replacement sees every write and fdatasync), see set_durable_vfs */
static PyObject *vfs_module = NULL, *vfs_pwrite = NULL, *vfs_fdatasync = NULL;
/* while pylog.vfs times its syncs (vfs.observe_syncs): its timed fdatasync, which the fast path
 * also takes for its own (it wraps the default), and the callable the fast path then hands the
 * seconds of each of its fdatasyncs; NULL when not timed. See set_sync_observer. */
static PyObject *vfs_timed_fdatasync = NULL, *sync_observer = NULL;
/* attribute names, interned once */
static PyObject *s_pwrite, *s_fdatasync, *s_durable_failed, *s_store_fd, *s_index_written,
    *s_written, *s_written_next, *s_index_fd, *s_timeindex_fd;

static int intern_names(void) {
#define NAME(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return -1;
    NAME(s_pwrite, "pwrite")
    NAME(s_fdatasync, "fdatasync")
    NAME(s_durable_failed, "_durable_failed")
    NAME(s_store_fd, "store_fd")
    NAME(s_index_written, "index_written")
    NAME(s_written, "written")
    NAME(s_written_next, "written_next")
    NAME(s_index_fd, "index_fd")
    NAME(s_timeindex_fd, "timeindex_fd")
#undef NAME
    return 0;
}

/* 1 while pylog.vfs holds its default pwrite and fdatasync, 0 when not (or set_durable_vfs
 * was never called), -1 with an exception. Read from the module's dict (vfs_dict, borrowed
 * from vfs_module, which is kept): two dict lookups, no attribute protocol. */
static PyObject *vfs_dict = NULL;

static int vfs_native(void) {
    if (vfs_dict == NULL) return 0;
    PyObject *f = PyDict_GetItemWithError(vfs_dict, s_pwrite); /* borrowed */
    if (f == NULL) return PyErr_Occurred() ? -1 : 0;
    if (f != vfs_pwrite) return 0;
    f = PyDict_GetItemWithError(vfs_dict, s_fdatasync);
    if (f == NULL) return PyErr_Occurred() ? -1 : 0;
    return f == vfs_fdatasync || (vfs_timed_fdatasync != NULL && f == vfs_timed_fdatasync);
}

/* Hand the seconds of one of the fast path's fdatasyncs (a failed one too) to sync_observer,
 * if set; its exception, if any, is reported as unraisable (the append's outcome does not
 * depend on it). Any exception already set is kept. The GIL is held. */
static void observe_sync(double seconds) {
    if (sync_observer == NULL) return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *obs = sync_observer;
    Py_INCREF(obs);
    PyObject *arg = PyFloat_FromDouble(seconds);
    PyObject *r = arg ? PyObject_CallFunctionObjArgs(obs, arg, NULL) : NULL;
    Py_XDECREF(arg);
    if (r == NULL) PyErr_WriteUnraisable(obs);
    else Py_DECREF(r);
    Py_DECREF(obs);
    PyErr_Restore(type, value, tb);
}

/* *out = int(o.name); 0, or -1 with an exception. */
static int int_attr(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = x;
    return 0;
}

static int set_int_attr(PyObject *o, PyObject *name, unsigned long long x) {
    PyObject *v = PyLong_FromUnsignedLongLong(x);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return rc;
}

/* The durable fast path failed after it became the leader. The group commit is fenced and
 * the leader steps down here first, in C, where no signal handler can come between them
 * (a fence that never happened would let a later fdatasync, which Linux may let succeed
 * after a failed one, acknowledge records whose write-back failed). Then the exception set
 * is handed to log._durable_failed, which fences the log's own state, while the log's lock
 * is still held when ``holding`` (as the Python leader fences a failed write-out: no other
 * thread frames or writes out in between; the lock is an RLock); then the lock is released
 * and the exception raised (or what _durable_failed raised). */
static PyObject *durable_failed(Framer *self, GroupCommit *g, PyObject *log, int holding) {
    pylog_gc_fence(g);
    pylog_gc_step_down_unsynced(g);
    PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyErr_NormalizeException(&exc_type, &exc_value, &exc_tb);
    PyObject *r = PyObject_CallMethodObjArgs(log, s_durable_failed, exc_value ? exc_value : Py_None, NULL);
    if (r == NULL) {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
    } else {
        Py_DECREF(r);
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    if (holding) call_release(self->release); /* keeps the exception set */
    return NULL;
}

/* pwrite buf[0..len) to fd at pos, all of it (again after EINTR and short writes), without
 * the GIL. 0 or an errno. */
static int pwrite_all_nogil(int fd, const uint8_t *p, size_t left, uint64_t pos) {
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (left > 0) {
        ssize_t n = pwrite(fd, p, left, (off_t)pos);
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        if (n == 0) {
            err = EIO;
            break;
        }
        p += n;
        left -= (size_t)n;
        pos += (uint64_t)n;
    }
    Py_END_ALLOW_THREADS
    return err;
}

PyDoc_STRVAR(append_durable_doc,
"append_durable(value, log, gc) -> int\n\n"
"Log.append's common record under fsync=\"always\" in one C call, while pylog.vfs holds its\n"
"default pwrite and fdatasync. Frames ``value`` as append() does and arrives at the group\n"
"commit ``gc`` (log._gc, a GroupCommit). While a leader writes out and fdatasyncs, it\n"
"waits with the GIL released (csrc/groupcommit.h). When none leads and the leader's\n"
"descriptor was made for this Framer's segment, it leads: lets its group form (as\n"
"gc.gather), writes the write buffer and the new index entries\n"
"out as ActiveSegment.write_pending does (the log's lock held, the GIL released),\n"
"fdatasyncs (no lock held, the GIL released), moves gc.durable_next past them and wakes the\n"
"group. Returns the offset: the record is durable if gc.durable_next is past it, else the\n"
"caller waits in _wait_durable (a leader's descriptor to make, a roll, a fence). A negative\n"
"status as append(), having framed nothing. A failed pwrite or fdatasync is handed\n"
"to log._durable_failed (the log fenced, the group commit fenced and stepped down in C\n"
"first), then raised.");

/* The leader gives up leading before it wrote anything out, so that a follower or the
 * caller's _wait_durable leads; the caller's arrival is taken back (it arrives again there). */
static void give_up_unsynced(GroupCommit *g) {
    pthread_mutex_lock(&g->mu);
    if (g->arrived > 0) g->arrived--;
    pthread_mutex_unlock(&g->mu);
    pylog_gc_step_down_unsynced(g);
}

/* The leader cannot lead in C after all (the segment stopped being the append target, or
 * its state is not what the C write-out handles): step down unsynced, release the log's lock
 * and return the offset (the caller's _wait_durable takes over). */
static PyObject *give_up_lead(Framer *self, GroupCommit *g, int64_t off) {
    give_up_unsynced(g);
    if (call_release(self->release) < 0) return NULL;
    return PyLong_FromLongLong((long long)off);
}

static double seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

static PyObject *framer_append_durable(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Framer *self = (Framer *)o;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "append_durable(value, log, gc) takes 3 arguments");
        return NULL;
    }
    PyObject *log = args[1];
    if (pylog_gc_type == NULL || !PyObject_TypeCheck(args[2], pylog_gc_type)) {
        PyErr_SetString(PyExc_TypeError, "append_durable: gc must be a GroupCommit");
        return NULL;
    }
    GroupCommit *g = (GroupCommit *)args[2];
    int64_t off;
    int rc = frame_locked(self, args[0], &off);
    if (rc < 0) return NULL;
    if (rc > 0) return PyLong_FromLongLong((long long)off);
    /* the log's lock is held */
    int native = off >= 0 ? vfs_native() : 0;
    if (native <= 0) { /* not framed, or a replaced vfs (it must see every call): Python's path */
        if (call_release(self->release) < 0 || native < 0) return NULL;
        return PyLong_FromLongLong((long long)off);
    }
    int holding = 1; /* the log's lock */
    int r = GC_LEAD;
    pthread_mutex_lock(&g->mu);
    pylog_gc_arrive_locked(g); /* under the log's lock: before any write-out of this record */
    if (g->syncing || g->fenced) {
        /* wait for the leader with the log's lock released (the others frame meanwhile) */
        pthread_mutex_unlock(&g->mu);
        holding = 0;
        if (call_release(self->release) < 0) return NULL;
        pthread_mutex_lock(&g->mu);
        r = pylog_gc_follow(g, off);
        if (r < 0) return NULL; /* mu not held */
    }
    if (r != GC_LEAD || g->sync_framer != o || g->sync_fd < 0) {
        /* durable; fenced; or this Framer may not lead (its segment's descriptor is not made
         * yet): the caller's _wait_durable leads or raises, arriving again */
        if (r == GC_LEAD && g->arrived > 0) g->arrived--;
        pthread_mutex_unlock(&g->mu);
        if (holding && call_release(self->release) < 0) return NULL;
        return PyLong_FromLongLong((long long)off);
    }
    g->syncing = 1; /* the leader now */
    g->leader = PyThread_get_thread_ident();
    if (g->arrived < g->target && g->wait_ns > 0) {
        /* let the group form (csrc/groupcommit.h), the log's lock released */
        pthread_mutex_unlock(&g->mu);
        if (holding) {
            holding = 0;
            if (call_release(self->release) < 0) {
                give_up_unsynced(g);
                return NULL;
            }
        }
        pthread_mutex_lock(&g->mu);
        pylog_gc_gather(g); /* releases mu */
    } else {
        pthread_mutex_unlock(&g->mu); /* one writer: a group of one, led with the lock held */
    }
    if (!holding) {
        PyObject *res = PyObject_CallNoArgs(self->acquire);
        if (res == NULL) { /* a signal handler's exception while waiting for the lock */
            give_up_unsynced(g);
            return NULL;
        }
        Py_DECREF(res);
    }
    /* the leader, the log's lock held: what the C write-out needs, or Python's path */
    if (!self->enabled || self->buf == NULL || g->fenced || g->sync_framer != o || g->sync_fd < 0
        || g->sync_seg == NULL)
        return give_up_lead(self, g, off);
    PyObject *seg = g->sync_seg;
    Py_INCREF(seg);
    long long store_fd = -1, index_fd = -1, timeindex_fd = -1, iw = 0;
    plog_appender *st = self->st;
    if (int_attr(seg, s_index_written, &iw) < 0 || int_attr(seg, s_store_fd, &store_fd) < 0
        || (iw >= 0 && (uint64_t)iw < st->index_count /* new index entries */
            && (int_attr(seg, s_index_fd, &index_fd) < 0 || int_attr(seg, s_timeindex_fd, &timeindex_fd) < 0))) {
        Py_DECREF(seg);
        give_up_unsynced(g);
        call_release(self->release); /* keeps the exception set */
        return NULL;
    }
    if (iw < 0 || (uint64_t)iw > st->index_count || store_fd < 0 || store_fd > INT_MAX
        || index_fd > INT_MAX || timeindex_fd > INT_MAX
        || ((uint64_t)iw < st->index_count && (index_fd < 0 || timeindex_fd < 0))
        || st->used > (uint64_t)self->cap
        || (sizeof(off_t) < 8 && st->position > (uint64_t)INT32_MAX)) {
        Py_DECREF(seg);
        return give_up_lead(self, g, off);
    }
    /* write out (as Framer.write_out and ActiveSegment.write_pending), fdatasync, step down */
    uint64_t used = st->used;
    int err = used ? pwrite_all_nogil((int)store_fd, self->buf, (size_t)used, st->position - used) : 0;
    if (err) {
        Py_DECREF(seg);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return durable_failed(self, g, log, 1);
    }
    st->used = 0;
    uint64_t goal = st->next_offset;
    if (set_int_attr(seg, s_written, st->position) < 0 || set_int_attr(seg, s_written_next, goal) < 0) {
        Py_DECREF(seg);
        return durable_failed(self, g, log, 1);
    }
    uint64_t ic = st->index_count;
    if ((uint64_t)iw < ic) { /* the new index entries, as ActiveSegment.write_pending writes them */
        uint64_t n = ic - (uint64_t)iw;
        err = pwrite_all_nogil((int)index_fd, st->index + (uint64_t)iw * PLOG_INDEX_ENTRY_SIZE,
                               (size_t)(n * PLOG_INDEX_ENTRY_SIZE),
                               PLOG_FILE_HEADER_SIZE + (uint64_t)iw * PLOG_INDEX_ENTRY_SIZE);
        if (!err)
            err = pwrite_all_nogil((int)timeindex_fd, st->timeindex + (uint64_t)iw * PLOG_TIMEINDEX_ENTRY_SIZE,
                                   (size_t)(n * PLOG_TIMEINDEX_ENTRY_SIZE),
                                   PLOG_FILE_HEADER_SIZE + (uint64_t)iw * PLOG_TIMEINDEX_ENTRY_SIZE);
        if (err) {
            Py_DECREF(seg);
            errno = err;
            PyErr_SetFromErrno(PyExc_OSError);
            return durable_failed(self, g, log, 1);
        }
        if (set_int_attr(seg, s_index_written, ic) < 0) {
            Py_DECREF(seg);
            return durable_failed(self, g, log, 1);
        }
    }
    Py_DECREF(seg);
    int group = pylog_gc_take_group(g); /* everyone whose record this write-out took */
    int sync_fd = g->sync_fd;           /* the leader's: a close hands it over (orphan), never closes it */
    if (call_release(self->release) < 0) return durable_failed(self, g, log, 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
#if defined(__APPLE__)
        int r = fsync(sync_fd); /* pylog.vfs.fdatasync is os.fsync there */
#else
        int r = fdatasync(sync_fd);
#endif
        if (r == 0) break;
        if (errno != EINTR) {
            err = errno;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    double synced = seconds_since(&t0);
    if (err) {
        observe_sync(synced);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return durable_failed(self, g, log, 0);
    }
    int fd = pylog_gc_step_down(g, 1, (long long)goal, group, synced);
    if (fd >= 0) close(fd); /* the log closed during the fdatasync */
    observe_sync(synced); /* after the step-down: the group does not wait for the observer */
    return PyLong_FromLongLong((long long)off);
}

PyDoc_STRVAR(set_sync_observer_doc,
"set_sync_observer(timed_fdatasync, observer)\n\n"
"While pylog.vfs times its syncs: ``timed_fdatasync`` is its timed wrapper of the default\n"
"fdatasync, which Framer.append_durable accepts as the default (it keeps its C path), and\n"
"``observer(seconds)`` is called after each fdatasync that path makes itself. Both None:\n"
"not timed.");

static PyObject *set_sync_observer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_sync_observer(timed_fdatasync, observer) takes 2 arguments");
        return NULL;
    }
    if ((args[0] == Py_None) != (args[1] == Py_None) || (args[1] != Py_None && !PyCallable_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "set_sync_observer: both None, or a function and a callable");
        return NULL;
    }
    PyObject *old[2] = {vfs_timed_fdatasync, sync_observer};
    vfs_timed_fdatasync = args[0] == Py_None ? NULL : Py_NewRef(args[0]);
    sync_observer = args[1] == Py_None ? NULL : Py_NewRef(args[1]);
    Py_XDECREF(old[0]);
    Py_XDECREF(old[1]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_durable_vfs_doc,
"set_durable_vfs(vfs, pwrite, fdatasync)\n\n"
"Framer.append_durable writes and fdatasyncs in C only while ``vfs.pwrite is pwrite`` and\n"
"``vfs.fdatasync is fdatasync`` (pylog.vfs and its defaults: a replacement, a test's or a\n"
"fault injector's, then sees every call, the caller's Python path making them).");

static PyObject *set_durable_vfs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "set_durable_vfs(vfs, pwrite, fdatasync) takes 3 arguments");
        return NULL;
    }
    if (!PyModule_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_durable_vfs: vfs must be a module");
        return NULL;
    }
    PyObject *d = PyModule_GetDict(args[0]); /* borrowed: lives as long as the module */
    if (d == NULL) return NULL;
    PyObject *old[3] = {vfs_module, vfs_pwrite, vfs_fdatasync};
    vfs_dict = d;
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    vfs_module = args[0];
    vfs_pwrite = args[1];
    vfs_fdatasync = args[2];
    for (int i = 0; i < 3; i++) Py_XDECREF(old[i]);
    Py_RETURN_NONE;
}


/* ---- append_batch's gathered write ------------------------------------------------------- */

/* Room in the Framer's arrays for n records; -1 with MemoryError. */
static int gather_reserve(Framer *self, size_t n) {
    if (n > self->g_records) {
        size_t cap = n < 1024 ? 1024 : n;
        if (cap > ((size_t)-1) / (2 * sizeof(struct iovec))) {
            PyErr_NoMemory();
            return -1;
        }
        const uint8_t **v = realloc(self->g_values, cap * sizeof *v);
        if (v) self->g_values = v;
        uint32_t *l = realloc(self->g_lens, cap * sizeof *l);
        if (l) self->g_lens = l;
        plog_piece *p = realloc(self->g_pieces, 2 * cap * sizeof *p);
        if (p) self->g_pieces = p;
        struct iovec *io = realloc(self->g_iov, 2 * cap * sizeof *io);
        if (io) self->g_iov = io;
        if (!v || !l || !p || !io) {
            PyErr_NoMemory();
            return -1;
        }
        self->g_records = cap;
    }
    return 0;
}

/* Let go of the arrays of a batch bigger than GATHER_KEEP_RECORDS. */
static void gather_trim(Framer *self) {
    if (self->g_records <= GATHER_KEEP_RECORDS) return;
    free(self->g_values);
    free(self->g_lens);
    free(self->g_pieces);
    free(self->g_iov);
    self->g_values = NULL;
    self->g_lens = NULL;
    self->g_pieces = NULL;
    self->g_iov = NULL;
    self->g_records = 0;
}

/* Write iov[0..niov) at pos, all of it: IOV_MAX pieces a call, again after a short write
 * or EINTR. 0, or an errno. Called without the GIL. */
static int write_all_v(int fd, struct iovec *iov, size_t niov, off_t pos) {
#ifdef IOV_MAX
    const size_t max_iov = IOV_MAX;
#else
    const size_t max_iov = 1024;
#endif
    while (niov > 0) {
        if (iov->iov_len == 0) {
            iov++;
            niov--;
            continue;
        }
        int cnt = (int)(niov < max_iov ? niov : max_iov);
        ssize_t w = pwritev(fd, iov, cnt, pos);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO; /* no progress on a non-empty write: never loop forever */
        pos += w;
        size_t left = (size_t)w;
        while (niov > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            niov--;
        }
        if (left) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

PyDoc_STRVAR(frame_gather_doc,
"frame_gather(fd, values, start, timestamps_addr, default_timestamp) -> (status, n, written) or None\n\n"
"append_batch's write of values[start:] (a list of bytes; no keys, no metadata) without\n"
"joining the values into one buffer: frames them a chunk of ~512 KiB at a time\n"
"(plog_frame_gather: headers and values under 16 KiB in the empty write buffer, which must\n"
"hold at least ~80 KiB; each larger value's CRC taken where it lies) and writes each chunk\n"
"with pwritev (IOV_MAX pieces a call, the GIL released) to ``fd`` at the store position its\n"
"first frame had. ``timestamps_addr``: the address of int64 timestamps for values[start:]\n"
"(the caller keeps them alive), or 0 for ``default_timestamp``. Returns the core status\n"
"(OK, or PLOG_E_SEGMENT_FULL / PLOG_E_INDEX_FULL after ``n`` records: those are framed and\n"
"written), the records framed and the bytes written; None, with nothing framed, when an\n"
"item is not exactly bytes (the caller's general path takes the batch). OSError when a\n"
"write fails: the records are framed, their bytes maybe partly written (the caller fences\n"
"the log).");

static PyObject *framer_frame_gather(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
    Framer *self = (Framer *)o;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "frame_gather(fd, values, start, timestamps_addr, default_timestamp) "
                                         "takes 5 arguments");
        return NULL;
    }
    int fd = (int)PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "frame_gather: values must be a list");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    unsigned long long ts_addr = PyLong_AsUnsignedLongLong(args[3]);
    if (ts_addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    long long default_ts = PyLong_AsLongLong(args[4]);
    if (default_ts == -1 && PyErr_Occurred()) return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "frame_gather: a negative start");
        return NULL;
    }
    if (self->st->used) {
        PyErr_SetString(PyExc_RuntimeError, "frame_gather: the write buffer is not empty");
        return NULL;
    }
    if (self->buf == NULL || self->cap < GATHER_MIN_BUFFER) {
        PyErr_SetString(PyExc_RuntimeError, "frame_gather: the write buffer is too small (reserve first)");
        return NULL;
    }
    /* the frames are made in the write buffer (empty, and no one else frames into it: the
     * caller holds the log's lock), at most chunk bytes of them at a time */
    size_t chunk = (size_t)self->cap - PLOG_FRAME_HEADER_SIZE - GATHER_COPY_BELOW;
    if (chunk > GATHER_CHUNK) chunk = GATHER_CHUNK;
    /* our own list of the items: holds them while the GIL is released, whatever the
     * caller's list goes through meanwhile */
    PyObject *items = PyList_GetSlice(args[1], start, PY_SSIZE_T_MAX);
    if (items == NULL) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = PyList_Size(items);
    if (n <= 0) {
        result = Py_BuildValue("(inn)", PLOG_OK, (Py_ssize_t)0, (Py_ssize_t)0);
        goto done;
    }
    if (gather_reserve(self, (size_t)n) < 0) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GetItem(items, i);
        if (it == NULL) goto done;
        Py_ssize_t len = PyBytes_CheckExact(it) ? PyBytes_Size(it) : -1;
        if (len < 0 || (unsigned long long)len >= UINT32_MAX) { /* not bytes; PLOG_NULL_LEN and above */
            result = Py_NewRef(Py_None);
            goto done;
        }
        self->g_values[i] = (const uint8_t *)PyBytes_AsString(it);
        self->g_lens[i] = (uint32_t)len;
    }
    const int64_t *ts = (const int64_t *)(uintptr_t)ts_addr;
    size_t n_done = 0, written = 0, bad_at;
    uint64_t total;
    /* the whole batch first: a bad record must leave nothing written */
    int rc = plog_check_batch(self->st, self->g_lens, NULL, NULL, ts, (int64_t)default_ts, (size_t)n,
                              &bad_at, &total);
    while (rc == PLOG_OK && n_done < (size_t)n) {
        size_t i = n_done, j = i, need = 0;
        while (j < (size_t)n) {
            size_t s = PLOG_FRAME_HEADER_SIZE + (self->g_lens[j] < GATHER_COPY_BELOW ? self->g_lens[j] : 0);
            if (j > i && need + s > chunk) break;
            need += s;
            j++;
        }
        uint64_t at = self->st->position;
        size_t n_pieces = 0, k = 0, w = 0;
        rc = plog_frame_gather(self->st, self->buf, (size_t)self->cap, self->g_values + i,
                               self->g_lens + i, ts ? ts + i : NULL, (int64_t)default_ts, j - i,
                               GATHER_COPY_BELOW, self->g_pieces, 2 * (j - i), &n_pieces, &k, &w);
        if (rc == PLOG_E_ARG) {
            PyErr_SetString(PyExc_RuntimeError, "frame_gather: plog_frame_gather refused its arguments");
            goto done;
        }
        if (w) {
            for (size_t m = 0; m < n_pieces; m++) {
                self->g_iov[m].iov_base = (void *)self->g_pieces[m].base;
                self->g_iov[m].iov_len = self->g_pieces[m].len;
            }
            int err;
            Py_BEGIN_ALLOW_THREADS
            err = write_all_v(fd, self->g_iov, n_pieces, (off_t)at);
            Py_END_ALLOW_THREADS
            if (err) {
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
                goto done;
            }
        }
        n_done += k;
        written += w;
    }
    result = Py_BuildValue("(inn)", rc, (Py_ssize_t)n_done, (Py_ssize_t)written);
done:
    gather_trim(self);
    Py_DECREF(items);
    return result;
}

PyDoc_STRVAR(write_out_doc,
"write_out(fd) -> bool\n\n"
"Hand the framed bytes of the write buffer to the OS: pwrite them (all of them, retried\n"
"after EINTR and short writes, without the GIL) to ``fd`` at the store position the first\n"
"of them has (position - used), then forget them (used = 0). The caller holds the log's\n"
"lock. OSError when a pwrite fails: nothing is forgotten then, so a write-out done again\n"
"writes the same bytes to the same place. False, having done nothing, where a position\n"
"does not fit this platform's off_t (the caller writes them out in Python); else True.");

static PyObject *framer_write_out(PyObject *o, PyObject *arg) {
    Framer *self = (Framer *)o;
    long fdl = PyLong_AsLong(arg);
    if (fdl == -1 && PyErr_Occurred()) return NULL;
    if (fdl < 0 || fdl > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "write_out: a bad file descriptor");
        return NULL;
    }
    uint64_t used = self->st->used;
    if (used == 0) Py_RETURN_TRUE;
    uint64_t at = self->st->position - used;
    if (self->buf == NULL || used > (uint64_t)self->cap) {
        PyErr_SetString(PyExc_RuntimeError, "write_out: more bytes pending than the buffer holds");
        return NULL;
    }
    /* off_t is 32 bits on some 32-bit builds: positions past it go through Python */
    if (sizeof(off_t) < 8 && at + used > (uint64_t)INT32_MAX) Py_RETURN_FALSE;
    int err = pwrite_all_nogil((int)fdl, self->buf, (size_t)used, at);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->st->used = 0;
    Py_RETURN_TRUE;
}

static PyMethodDef framer_methods[] = {
    {"set_buffer", (PyCFunction)(void (*)(void))framer_set_buffer, METH_FASTCALL, set_buffer_doc},
    {"frame_value", (PyCFunction)(void (*)(void))framer_frame_value, METH_FASTCALL, frame_value_doc},
    {"set_lock", framer_set_lock, METH_O, set_lock_doc},
    {"enable", framer_enable, METH_O, enable_doc},
    {"append", framer_append, METH_O, append_doc},
    {"append_durable", (PyCFunction)(void (*)(void))framer_append_durable, METH_FASTCALL, append_durable_doc},
    {"frame_gather", (PyCFunction)(void (*)(void))framer_frame_gather, METH_FASTCALL, frame_gather_doc},
    {"write_out", framer_write_out, METH_O, write_out_doc},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot framer_slots[] = {
    {Py_tp_new, (void *)framer_new},
    {Py_tp_dealloc, (void *)framer_dealloc},
    {Py_tp_methods, (void *)framer_methods},
    {Py_tp_doc, (void *)"Framer(st_addr, owner): frames one record into an active segment's write buffer "
                        "(the per-record append fast path; see csrc/speedups_append.c)."},
    {0, NULL},
};

static PyType_Spec framer_spec = {
    "pylog._speedups.Framer",
    sizeof(Framer),
    0,
    Py_TPFLAGS_DEFAULT,
    framer_slots,
};

/* ---- lengths --------------------------------------------------------------------------- */

PyDoc_STRVAR(lengths_doc,
"lengths(items) -> bytearray\n\n"
"``len()`` of every item of a list or tuple, as native uint32s (4 bytes each). TypeError for\n"
"an item without a length, OverflowError for one of 4 GiB or more: what\n"
"``array('I', map(len, items))`` gives, in one C loop.");

static PyObject *lengths(PyObject *self, PyObject *items) {
    (void)self;
    int is_list = PyList_Check(items);
    if (!is_list && !PyTuple_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "lengths: expected a list or tuple");
        return NULL;
    }
    Py_ssize_t n = is_list ? PyList_Size(items) : PyTuple_Size(items);
    if (n < 0) return NULL;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 4);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* borrowed; an item's __len__ may change the list, so it is held while asked */
        PyObject *it = is_list ? PyList_GetItem(items, i) : PyTuple_GetItem(items, i);
        if (it == NULL) goto fail;
        Py_ssize_t len;
        if (PyBytes_CheckExact(it)) {
            len = PyBytes_Size(it);
        } else {
            Py_INCREF(it);
            len = PyObject_Size(it);
            Py_DECREF(it);
        }
        if (len < 0) goto fail;
        if ((unsigned long long)len > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "unsigned int is greater than maximum");
            goto fail;
        }
        uint32_t v = (uint32_t)len;
        /* the bytearray's buffer is fetched each time: nothing here can resize it, but it
         * costs nothing to not rely on that */
        memcpy(PyByteArray_AsString(out) + 4 * i, &v, 4);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}


PyDoc_STRVAR(bytes_only_doc,
"bytes_only(items) -> bool\n\n"
"Whether every item of the list ``items`` is exactly bytes (no subclass, no other\n"
"bytes-like, no None) shorter than 4 GiB: the batches Framer.frame_gather takes.");

static PyObject *bytes_only(PyObject *self, PyObject *items) {
    (void)self;
    if (!PyList_Check(items)) Py_RETURN_FALSE;
    Py_ssize_t n = PyList_Size(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PyList_GetItem(items, i);
        if (it == NULL) return NULL;
        if (!PyBytes_CheckExact(it) || (unsigned long long)PyBytes_Size(it) >= UINT32_MAX) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(set_test_clock_doc,
"set_test_clock(clock)\n\n"
"For tests: Framer.append takes its timestamps from ``clock()`` (ms since the epoch) instead\n"
"of the system clock; None goes back to the system clock.");

static PyObject *set_test_clock(PyObject *self, PyObject *clock) {
    (void)self;
    PyObject *old = test_clock;
    if (clock == Py_None) {
        test_clock = NULL;
    } else {
        Py_INCREF(clock);
        test_clock = clock;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef append_methods[] = {
    {"lengths", lengths, METH_O, lengths_doc},
    {"bytes_only", bytes_only, METH_O, bytes_only_doc},
    {"set_test_clock", set_test_clock, METH_O, set_test_clock_doc},
    {"set_durable_vfs", (PyCFunction)(void (*)(void))set_durable_vfs, METH_FASTCALL, set_durable_vfs_doc},
    {"set_sync_observer", (PyCFunction)(void (*)(void))set_sync_observer, METH_FASTCALL, set_sync_observer_doc},
    {NULL, NULL, 0, NULL},
};

int pylog_speedups_append_init(PyObject *module) {
    if (intern_names() < 0) return -1;
    if (PyModule_AddFunctions(module, append_methods) < 0) return -1;
    PyObject *t = PyType_FromSpec(&framer_spec);
    if (t == NULL) return -1;
    if (PyModule_AddObject(module, "Framer", t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return PyModule_AddIntConstant(module, "FRAMER_OFF", FRAMER_OFF);
}
