/*
 * pylog._speedups.GroupCommit: the group commit of fsync="always", its state and its waits
 * (the protocol, the lock order and the GIL rules are in groupcommit.h).
 *
 * Python drives it from LogGroupCommit._wait_durable (pylog/groupcommit.py, whose
 * _PyGroupCommit is the same object in Python for the pure backend): arrive(offset) waits
 * as a follower and says whether the record is durable, the caller leads, or the log is
 * fenced; the leader writes out, calls take_group(), fdatasyncs and calls step_down().
 * Framer.append_durable (speedups_append.c) does all of that in C for the common record.
 */
#include "groupcommit.h"

#include <structmember.h>

#include <errno.h>
#include <time.h>
#include <unistd.h>

PyTypeObject *pylog_gc_type = NULL;

#define SIGNAL_CHECK_NS 50000000LL

/* the clock of the cvs' timed waits: the default one (see gc_new). A step of the wall clock
 * can only lengthen or shorten a wait that loops and looks again: a 50 ms slice between two
 * looks for a signal, or a leader's wait (at most 2 ms) for a group that did not form. */
#define GC_CLOCK CLOCK_REALTIME

/* The absolute time on the cvs' clock (GC_CLOCK) ``ns`` from now. */
static void cv_deadline(struct timespec *t, long long ns) {
    if (ns < 0) ns = 0;
    clock_gettime(GC_CLOCK, t);
    long long nsec = (long long)t->tv_nsec + ns % 1000000000LL;
    t->tv_sec += (time_t)(ns / 1000000000LL + nsec / 1000000000LL);
    t->tv_nsec = (long)(nsec % 1000000000LL);
}

void pylog_gc_arrive_locked(GroupCommit *g) {
    g->arrived++;
    if (g->gathering && g->arrived >= g->target) pthread_cond_signal(&g->formed);
}

/* mu held: wake every follower: those whose record is durable return, the first of the
 * others to see no leader leads, the rest wait on. (Waking only the followers whose record
 * is durable, one at a time, each by the one before, made fewer context switches but
 * serialised the wake-ups, which on a 2-vCPU VM cost 10-50 us each: docs/benchmarks.md.) */
static void wake_locked(GroupCommit *g) {
    if (g->waiting) pthread_cond_broadcast(&g->done);
}

/* A follower waits on the followers' condition variable, the GIL released, in slices of
 * SIGNAL_CHECK_NS: between them it takes the GIL to see whether a signal handler raised
 * (Ctrl-C in the main thread), as threading's waits do. */
int pylog_gc_follow(GroupCommit *g, long long off) {
    for (;;) {
        if (g->durable_next > off) return GC_DURABLE;
        if (g->fenced) return GC_FENCED;
        if (!g->syncing) return GC_LEAD;
        struct timespec dl;
        cv_deadline(&dl, SIGNAL_CHECK_NS);
        int rc;
        g->waiting++;
        Py_BEGIN_ALLOW_THREADS
        rc = pthread_cond_timedwait(&g->done, &g->mu, &dl);
        g->waiting--;
        /* never take the GIL back holding mu: its holder may be waiting for mu */
        pthread_mutex_unlock(&g->mu);
        Py_END_ALLOW_THREADS
        if (rc != 0 && PyErr_CheckSignals() < 0) return -1; /* a timeout (or any error) */
        pthread_mutex_lock(&g->mu);
    }
}

void pylog_gc_gather(GroupCommit *g) {
    if (g->arrived >= g->target || g->wait_ns <= 0 || g->fenced) {
        pthread_mutex_unlock(&g->mu);
        return;
    }
    struct timespec dl;
    cv_deadline(&dl, g->wait_ns);
    g->gathering = 1;
    Py_BEGIN_ALLOW_THREADS
    while (g->arrived < g->target && !g->fenced)
        if (pthread_cond_timedwait(&g->formed, &g->mu, &dl) != 0) break;
    g->gathering = 0;
    pthread_mutex_unlock(&g->mu);
    Py_END_ALLOW_THREADS
}

void pylog_gc_fence(GroupCommit *g) {
    pthread_mutex_lock(&g->mu);
    g->fenced = 1;
    wake_locked(g);
    pthread_cond_broadcast(&g->formed);
    pthread_mutex_unlock(&g->mu);
}

int pylog_gc_take_group(GroupCommit *g) {
    pthread_mutex_lock(&g->mu);
    int n = g->arrived;
    g->arrived = 0;
    g->lead_epoch = g->epoch;
    pthread_mutex_unlock(&g->mu);
    return n;
}

/* mu held: the leader's descriptor and its segment and Framer, forgotten (the caller closes
 * the descriptor and drops the references once mu is released: a deallocation may run Python
 * code). */
static int forget_sync_fd_locked(GroupCommit *g, PyObject **seg, PyObject **framer) {
    int fd = g->sync_fd;
    g->sync_fd = -1;
    g->orphan = 0;
    *seg = g->sync_seg;
    *framer = g->sync_framer;
    g->sync_seg = g->sync_framer = NULL;
    return fd;
}

int pylog_gc_step_down(GroupCommit *g, int ok, long long goal, int group, double elapsed_s) {
    PyObject *seg = NULL, *framer = NULL;
    int fd = -1;
    pthread_mutex_lock(&g->mu);
    g->syncing = 0;
    if (g->orphan) /* the log closed during the fdatasync: the leader closes its descriptor */
        fd = forget_sync_fd_locked(g, &seg, &framer);
    if (ok) {
        g->syncs++;
        g->target = group > 1 ? group : 1;
        /* (not if a truncate came between the write-out and now: goal is from before it) */
        if (goal > g->durable_next && g->lead_epoch == g->epoch) g->durable_next = goal;
        if (group > 1) { /* the next leader waits at most this fdatasync's time for its group */
            double w = elapsed_s < g->wait_max ? elapsed_s : g->wait_max; /* as the Python twin */
            g->wait_ns = w > 0 ? (long long)(w * 1e9) : 0;
        }
    }
    wake_locked(g);
    pthread_mutex_unlock(&g->mu);
    Py_XDECREF(seg); /* after the mutex: a deallocation may run Python code */
    Py_XDECREF(framer);
    return fd;
}

void pylog_gc_step_down_unsynced(GroupCommit *g) {
    int fd = pylog_gc_step_down(g, 0, 0, 0, 0.0);
    if (fd >= 0) close(fd); /* the log closed meanwhile */
}

/* ---- the Python type --------------------------------------------------------------------- */

static PyObject *gc_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_Size(args) != 0 || (kwds != NULL && PyDict_Size(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "GroupCommit() takes no arguments");
        return NULL;
    }
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    GroupCommit *g = (GroupCommit *)alloc(type, 0);
    if (g == NULL) return NULL;
    g->ready = 0;
    g->syncing = g->waiting = g->arrived = g->fenced = g->orphan = 0;
    g->target = 1;
    g->durable_next = 0;
    g->wait_ns = g->syncs = g->epoch = g->lead_epoch = 0;
    g->gathering = 0;
    g->leader = 0;
    g->wait_max = 0.002;
    g->sync_fd = -1;
    g->sync_seg = g->sync_framer = NULL;
    /* default attributes only: pthread_mutexattr_* and pthread_condattr_setclock are
     * versioned GLIBC_2.34 in glibc >= 2.34 (moved from libpthread), which would make the
     * wheels manylinux_2_34 and leave out Debian 11, Ubuntu 20.04, Raspberry Pi OS bullseye */
    int rc = pthread_mutex_init(&g->mu, NULL);
    if (rc == 0) {
        rc = pthread_cond_init(&g->formed, NULL);
        if (rc == 0) {
            rc = pthread_cond_init(&g->done, NULL);
            if (rc != 0) pthread_cond_destroy(&g->formed);
        }
        if (rc != 0) pthread_mutex_destroy(&g->mu);
    }
    if (rc != 0) {
        Py_DECREF(g);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    g->ready = 1;
    return (PyObject *)g;
}

static void gc_dealloc(PyObject *o) {
    GroupCommit *g = (GroupCommit *)o;
    PyTypeObject *tp = Py_TYPE(o);
    Py_XDECREF(g->sync_seg);
    Py_XDECREF(g->sync_framer);
    if (g->ready) {
        pthread_cond_destroy(&g->done);
        pthread_cond_destroy(&g->formed);
        pthread_mutex_destroy(&g->mu);
    }
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(o);
    Py_DECREF(tp);
}

PyDoc_STRVAR(arrive_doc,
"arrive(offset) -> int\n\n"
"An appender whose record at ``offset`` is framed arrives, and waits (the GIL released)\n"
"while a leader writes out and fdatasyncs or its group forms. 0: the record is durable;\n"
"1: the caller leads now (it writes out, calls take_group(), fdatasyncs, calls\n"
"step_down()); 2: the log is fenced.");

static PyObject *gc_arrive(PyObject *o, PyObject *arg) {
    GroupCommit *g = (GroupCommit *)o;
    long long off = PyLong_AsLongLong(arg);
    if (off == -1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&g->mu);
    pylog_gc_arrive_locked(g);
    int r = pylog_gc_follow(g, off);
    if (r < 0) return NULL; /* mu not held */
    if (r == GC_LEAD) {
        g->syncing = 1;
        g->leader = PyThread_get_thread_ident();
    }
    pthread_mutex_unlock(&g->mu);
    return PyLong_FromLong(r);
}

PyDoc_STRVAR(gather_doc,
"gather()\n\n"
"The leader lets its group form: it waits (the GIL released) until as many appenders have\n"
"arrived since the last write-out as the last group had, or the log is fenced, at most about\n"
"one fdatasync's time (wait_max at most). A group of one never waits.");

static PyObject *gc_gather(PyObject *o, PyObject *unused) {
    (void)unused;
    GroupCommit *g = (GroupCommit *)o;
    pthread_mutex_lock(&g->mu);
    pylog_gc_gather(g);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(take_group_doc,
"take_group() -> int\n\n"
"The leader, once it has written out: how many appenders arrived since the last write-out\n"
"(its group), counting anew from 0.");

static PyObject *gc_take_group(PyObject *o, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(pylog_gc_take_group((GroupCommit *)o));
}

PyDoc_STRVAR(step_down_doc,
"step_down(ok, goal, group, elapsed) -> int\n\n"
"The leader steps down and wakes the followers. When ``ok`` (its fdatasync succeeded),\n"
"every offset below ``goal`` is durable, and ``group`` (its size) and ``elapsed`` (its\n"
"fdatasync's seconds) set how big the next group is and how long it may take to form.\n"
"Returns the leader's descriptor if the log closed meanwhile (the caller closes it), else -1.");

static PyObject *gc_step_down(PyObject *o, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "step_down(ok, goal, group, elapsed) takes 4 arguments");
        return NULL;
    }
    int ok = PyObject_IsTrue(args[0]);
    long long goal = PyLong_AsLongLong(args[1]);
    long group = PyLong_AsLong(args[2]);
    double elapsed = PyFloat_AsDouble(args[3]);
    if (ok < 0 || PyErr_Occurred()) {
        /* step down all the same (else every later appender waits for ever), then raise */
        PyObject *exc_type = NULL, *exc_value = NULL, *exc_tb = NULL;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        pylog_gc_step_down_unsynced((GroupCommit *)o);
        PyErr_Restore(exc_type, exc_value, exc_tb);
        return NULL;
    }
    return PyLong_FromLong(pylog_gc_step_down((GroupCommit *)o, ok, goal, (int)group, elapsed));
}

PyDoc_STRVAR(fence_doc,
"fence()\n\n"
"The log is fenced: every follower stops waiting (arrive() says 2).");

static PyObject *gc_fence(PyObject *o, PyObject *unused) {
    (void)unused;
    pylog_gc_fence((GroupCommit *)o);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(abandon_doc,
"abandon()\n\n"
"The calling thread gave up leading before it wrote out (a signal handler's exception as\n"
"arrive() returned 1, before the caller could know it leads): if it is the leader, it steps\n"
"down, so that the others do not wait for it for ever.");

static PyObject *gc_abandon(PyObject *o, PyObject *unused) {
    (void)unused;
    GroupCommit *g = (GroupCommit *)o;
    int mine;
    pthread_mutex_lock(&g->mu);
    mine = g->syncing && g->leader == PyThread_get_thread_ident();
    pthread_mutex_unlock(&g->mu);
    if (mine) pylog_gc_step_down_unsynced(g);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(advance_doc,
"advance(n)\n\n"
"Every offset below ``n`` is durable (a flush, a roll's sealed segment, an open): durable_next\n"
"moves up to ``n`` if it is below it, and waiting followers look again.");

PyDoc_STRVAR(lower_doc,
"lower(n)\n\n"
"A truncate cut the log to ``n`` records: durable_next goes down to ``n`` if it is above it.");

static PyObject *move_durable(PyObject *o, PyObject *arg, int up) {
    GroupCommit *g = (GroupCommit *)o;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    pthread_mutex_lock(&g->mu);
    if (up ? n > g->durable_next : n < g->durable_next) g->durable_next = n;
    if (!up) g->epoch++; /* a leader's goal from before it no longer counts */
    if (up) wake_locked(g);
    pthread_mutex_unlock(&g->mu);
    Py_RETURN_NONE;
}

static PyObject *gc_advance(PyObject *o, PyObject *arg) { return move_durable(o, arg, 1); }
static PyObject *gc_lower(PyObject *o, PyObject *arg) { return move_durable(o, arg, 0); }

PyDoc_STRVAR(close_fd_doc,
"close_fd() -> int\n\n"
"At close: the leader's descriptor, forgotten, for the caller to close; or -1 when there is\n"
"none, or while a leader fdatasyncs with it (that leader's step_down() hands it over).");

static PyObject *gc_close_fd(PyObject *o, PyObject *unused) {
    (void)unused;
    GroupCommit *g = (GroupCommit *)o;
    PyObject *seg = NULL, *framer = NULL;
    int fd = -1;
    pthread_mutex_lock(&g->mu);
    if (g->syncing)
        g->orphan = 1;
    else
        fd = forget_sync_fd_locked(g, &seg, &framer);
    pthread_mutex_unlock(&g->mu);
    Py_XDECREF(seg);
    Py_XDECREF(framer);
    return PyLong_FromLong(fd);
}

static PyMethodDef gc_methods[] = {
    {"arrive", gc_arrive, METH_O, arrive_doc},
    {"gather", gc_gather, METH_NOARGS, gather_doc},
    {"take_group", gc_take_group, METH_NOARGS, take_group_doc},
    {"step_down", (PyCFunction)(void (*)(void))gc_step_down, METH_FASTCALL, step_down_doc},
    {"fence", gc_fence, METH_NOARGS, fence_doc},
    {"abandon", gc_abandon, METH_NOARGS, abandon_doc},
    {"advance", gc_advance, METH_O, advance_doc},
    {"lower", gc_lower, METH_O, lower_doc},
    {"close_fd", gc_close_fd, METH_NOARGS, close_fd_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef gc_members[] = {
    {"syncing", T_INT, offsetof(GroupCommit, syncing), READONLY, "a leader writes out and fdatasyncs"},
    {"waiting", T_INT, offsetof(GroupCommit, waiting), READONLY, "followers waiting"},
    {"arrived", T_INT, offsetof(GroupCommit, arrived), READONLY, "appenders arrived since the last write-out"},
    {"target", T_INT, offsetof(GroupCommit, target), READONLY, "the last group's size"},
    {"fenced", T_INT, offsetof(GroupCommit, fenced), READONLY, "the log is fenced"},
    {"durable_next", T_LONGLONG, offsetof(GroupCommit, durable_next), READONLY, "every offset below it is durable"},
    {"epoch", T_LONGLONG, offsetof(GroupCommit, epoch), READONLY, "truncates so far (lower() calls)"},
    {"syncs", T_LONGLONG, offsetof(GroupCommit, syncs), READONLY,
     "the fdatasyncs its leaders made (each covers a group)"},
    {"wait_ns", T_LONGLONG, offsetof(GroupCommit, wait_ns), READONLY,
     "how long the next leader waits at most for its group, ns (the last fdatasync's time)"},
    {"wait_max", T_DOUBLE, offsetof(GroupCommit, wait_max), 0,
     "the longest a leader waits for its group, seconds (0.002)"},
    {"sync_fd", T_INT, offsetof(GroupCommit, sync_fd), 0, "the leader's dup of sync_seg's store, -1 when none"},
    {"orphan", T_INT, offsetof(GroupCommit, orphan), 0, "the log closed while a leader used sync_fd"},
    {"sync_seg", T_OBJECT, offsetof(GroupCommit, sync_seg), 0, "the segment sync_fd belongs to, or None"},
    {"sync_framer", T_OBJECT, offsetof(GroupCommit, sync_framer), 0, "that segment's Framer, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot gc_slots[] = {
    {Py_tp_new, (void *)gc_new},
    {Py_tp_dealloc, (void *)gc_dealloc},
    {Py_tp_methods, (void *)gc_methods},
    {Py_tp_members, (void *)gc_members},
    {Py_tp_doc, (void *)"GroupCommit(): a log's group commit under fsync=\"always\": its state and its "
                        "waits, the GIL released (see csrc/groupcommit.h and LogGroupCommit._wait_durable)."},
    {0, NULL},
};

static PyType_Spec gc_spec = {
    "pylog._speedups.GroupCommit",
    sizeof(GroupCommit),
    0,
    Py_TPFLAGS_DEFAULT,
    gc_slots,
};

int pylog_speedups_groupcommit_init(PyObject *module) {
    PyObject *g = PyType_FromSpec(&gc_spec);
    if (g == NULL) return -1;
    pylog_gc_type = (PyTypeObject *)g;
    Py_INCREF(g);
    if (PyModule_AddObject(module, "GroupCommit", g) < 0) {
        Py_DECREF(g);
        return -1;
    }
    return 0;
}
