/*
 * pylog._speedups: the CPython extension module that makes Python objects fast (Records,
 * the scan iterator, reads; the per-record append path). It sits beside the cffi module
 * pylog._cffi and compiles its own copy of the C core's sources (store.c, index.c,
 * crc32c.c), built with hidden visibility so the two copies never meet.
 *
 * The module is split by concern, one .c file each, all listed in setup.py
 * (SPEEDUPS_SOURCES). Each part defines one init hook, declared here and called in order
 * from the module's init in speedups.c (SPEEDUPS_PARTS); a hook adds its functions and
 * types to the module and returns 0, or sets an exception and returns -1.
 *
 * The limited API (abi3, Python 3.10) is used except on free-threaded builds, where it
 * does not exist. It has no buffer protocol before 3.11, so C pointers into maps are
 * passed in as integers by pylog._native (the same pointers its cffi calls use), always
 * together with the Python object that owns the memory, which the callee keeps a
 * reference to for as long as it reads the memory or hands out views of it.
 */
#ifndef PYLOG_SPEEDUPS_H
#define PYLOG_SPEEDUPS_H

#include <Python.h>

/* speedups_read.c: Record construction, sealed/active segment reads and scans. */
int pylog_speedups_read_init(PyObject *module);

/* speedups_append.c: the per-record append fast path (Framer) and append_batch's lengths. */
int pylog_speedups_append_init(PyObject *module);

/* speedups_groupcommit.c: the group commit of fsync="always" (GroupCommit), its waits in C. */
int pylog_speedups_groupcommit_init(PyObject *module);

#define SPEEDUPS_PARTS pylog_speedups_read_init, pylog_speedups_groupcommit_init, pylog_speedups_append_init

#endif
