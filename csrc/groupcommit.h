/*
 * The group commit of fsync="always" (pylog._speedups.GroupCommit, csrc/speedups_groupcommit.c),
 * shared with the Framer's durable append (csrc/speedups_append.c).
 *
 * One per Log (Log._gc). Appenders frame their records into the write buffer, then arrive
 * here and wait until a leader's fdatasync covers their record; one of them at a time is
 * that leader. The state lives under a pthread mutex, not a Python lock, so that followers
 * wait on a condition variable with the GIL released and wake straight into C: a record of
 * 16 threads then costs its append call and one GIL hand-off, not a Python Condition's
 * lock juggling (see docs/benchmarks.md).
 *
 * Lock order and the GIL: the log's lock (a Python RLock) comes before the mutex; the mutex
 * is held only for a few loads and stores of this struct, never while calling into Python
 * or acquiring the GIL. A thread may take it while holding the GIL (its holder never waits
 * for the GIL); a thread that waits on one of its conditions has released the GIL first and
 * drops the mutex before it takes the GIL back.
 *
 * Fields touched without the GIL (the waits) change only under the mutex; sync_fd, orphan,
 * sync_seg and sync_framer are touched only with the GIL held (the leader, the close).
 */
#ifndef PYLOG_GROUPCOMMIT_H
#define PYLOG_GROUPCOMMIT_H

#include <Python.h>
#include <pthread.h>

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t done;   /* followers: durable_next moved, the leader stepped down, a fence */
    pthread_cond_t formed; /* the gathering leader: arrived reached target, or a fence */
    int ready;             /* mu, done and formed were initialised */
    int syncing;           /* a leader writes out and fdatasyncs */
    int waiting;           /* followers waiting on done */
    int arrived;           /* appenders arrived since the last write-out */
    int target;            /* the last group's size: the next leader waits for that many */
    int gathering;         /* a leader waits on formed for its group */
    int fenced;            /* the log is fenced: every wait ends */
    long long durable_next; /* every offset below it is durable */
    long long wait_ns;     /* how long the next leader waits for its group, at most */
    double wait_max;       /* the cap of wait_ns, seconds */
    int sync_fd;           /* the leader's dup of sync_seg's store, -1 when none */
    int orphan;            /* the log closed while a leader used sync_fd: that leader closes it */
    PyObject *sync_seg;    /* the ActiveSegment sync_fd belongs to (NULL: None) */
    PyObject *sync_framer; /* that segment's Framer, if it has one (NULL: None) */
} GroupCommit;

/* what a wait in the group commit ends with */
#define GC_DURABLE 0 /* the offset is durable */
#define GC_LEAD 1    /* no leader: the caller leads now (syncing set) */
#define GC_FENCED 2  /* the log is fenced */
#define GC_IDLE 3    /* (gc_follow) no leader, the offset not durable: the caller may lead */

extern PyTypeObject *pylog_gc_type;

/* One appender arrived (mu held). */
void pylog_gc_arrive_locked(GroupCommit *g);
/* mu held, the GIL held: wait until ``off`` is durable, the log fenced or no leader syncs:
 * GC_DURABLE, GC_FENCED or GC_IDLE with mu held; -1 with an exception (a signal handler's,
 * checked every 50 ms in the main thread) and mu not held. */
int pylog_gc_follow(GroupCommit *g, long long off);
/* the leader, mu held, the GIL held: wait (the GIL released) until the group has formed
 * (``arrived`` reached ``target``) or a fence, at most wait_ns; mu released on return. */
void pylog_gc_gather(GroupCommit *g);
/* the leader, the GIL held: the number of appenders arrived since the last write-out, and
 * start counting anew (called under the log's lock once the write-out is done). */
int pylog_gc_take_group(GroupCommit *g);
/* the leader steps down, the GIL held: when ``ok``, ``durable_next`` moves to ``goal`` and
 * the next group's size and wait are noted (``elapsed_s``: this fdatasync's time); the
 * followers wake. Returns the leader's descriptor when the log closed meanwhile (the
 * caller closes it), else -1. */
int pylog_gc_step_down(GroupCommit *g, int ok, long long goal, int group, double elapsed_s);

#endif
