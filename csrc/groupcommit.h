/*
 * The group commit of fsync="always" (pylog._speedups.GroupCommit, csrc/speedups_groupcommit.c),
 * shared with the Framer's durable append (csrc/speedups_append.c).
 *
 * One per Log (Log._gc). Appenders frame their records into the write buffer, then arrive
 * here and wait until an fdatasync covers their record. One of them at a time is the
 * leader (the first to arrive while none leads), who lets its group form (it waits, at most
 * about one fdatasync's time, until as many appenders have arrived as the last group had),
 * writes out everything framed so far, fdatasyncs and steps down; so with N threads each
 * fdatasync covers about N records.
 *
 * The state lives under a pthread mutex, not a Python lock, so that followers wait with the
 * GIL released, on a condition variable, and wake straight into C: a step-down wakes them
 * all at once, and they queue for the GIL.
 *
 * Lock order and the GIL: the log's lock (a Python RLock) comes before the mutex; the mutex
 * is held only for a few loads and stores, never while calling into Python or acquiring the
 * GIL. A thread may take it while holding the GIL (its holder never waits for the GIL); a
 * thread that waits under it has released the GIL first and drops it before it takes the GIL
 * back. Fields touched without the GIL change only under the mutex; sync_fd, orphan,
 * sync_seg, sync_framer and wait_max are touched only with the GIL held.
 */
#ifndef PYLOG_GROUPCOMMIT_H
#define PYLOG_GROUPCOMMIT_H

#include <Python.h>
#include <pthread.h>

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t formed;    /* the gathering leader: its group arrived, or a fence */
    pthread_cond_t done;      /* the followers: a step-down, a move of durable_next, a fence */
    int ready;                /* mu, formed and done were initialised */
    int syncing;              /* a leader writes out and fdatasyncs */
    int waiting;              /* followers waiting on done */
    int arrived;              /* appenders arrived since the last write-out (the forming group) */
    int target;               /* the last group's size: the size at which a group has formed */
    int fenced;               /* the log is fenced: every wait ends */
    int gathering;            /* the leader waits on formed for its group */
    long long durable_next;   /* every offset below it is durable */
    long long syncs;          /* fdatasyncs the leaders made (for tests and benchmarks) */
    long long epoch;          /* truncates (lower()) so far */
    long long lead_epoch;     /* the epoch when the leader wrote out (take_group) */
    unsigned long leader;     /* the leading thread (PyThread_get_thread_ident), when syncing */
    long long wait_ns;        /* how long a leader waits for its group (the last fdatasync's time) */
    double wait_max;          /* the cap of wait_ns, seconds */
    int sync_fd;              /* the leader's dup of sync_seg's store, -1 when none */
    int orphan;               /* the log closed while a leader used sync_fd: that leader closes it */
    PyObject *sync_seg;       /* the ActiveSegment sync_fd belongs to (NULL: None) */
    PyObject *sync_framer;    /* that segment's Framer, if it has one (NULL: None) */
} GroupCommit;

/* what a wait in the group commit ends with (pylog.groupcommit's GC_* are the same) */
#define GC_DURABLE 0 /* the offset is durable */
#define GC_LEAD 1    /* the caller leads now (arrive(): syncing set) */
#define GC_FENCED 2  /* the log is fenced */

extern PyTypeObject *pylog_gc_type;

/* One appender arrived (mu held). */
void pylog_gc_arrive_locked(GroupCommit *g);
/* mu held, the GIL held: wait until ``off`` is durable, the log is fenced, or no leader
 * syncs (the caller is to lead): GC_DURABLE, GC_FENCED or GC_LEAD (syncing not set yet)
 * with mu held; -1 with an exception (a signal handler's, checked every 50 ms) and mu not
 * held. */
int pylog_gc_follow(GroupCommit *g, long long off);
/* The leader, mu held, the GIL held: let the group form: wait (the GIL released) until
 * ``arrived`` reaches ``target`` or a fence, at most wait_ns; mu released on return. */
void pylog_gc_gather(GroupCommit *g);
/* The log is fenced (the GIL held): every follower wakes, no one leads any more. */
void pylog_gc_fence(GroupCommit *g);
/* the leader, the GIL held: the number of appenders arrived since the last write-out, and
 * start counting anew (called under the log's lock once the write-out is done; notes the
 * epoch). */
int pylog_gc_take_group(GroupCommit *g);
/* the leader steps down, the GIL held: when ``ok``, ``durable_next`` moves to ``goal``
 * (unless a truncate came after the write-out: ``epoch``) and the next group's size and wait
 * are noted (``elapsed_s``: this fdatasync's time); the followers wake. Returns the leader's
 * descriptor when the log closed meanwhile (the caller closes it), else -1. */
int pylog_gc_step_down(GroupCommit *g, int ok, long long goal, int group, double elapsed_s);
/* the leader steps down without having synced (a failure, or it gives up leading), closing
 * its descriptor if the log closed meanwhile. */
void pylog_gc_step_down_unsynced(GroupCommit *g);

#endif
