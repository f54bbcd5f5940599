/* pylog._speedups: the module object and its init (see speedups.h for the layout). */
#include "speedups.h"
#include "pylog.h"

#include <stdlib.h>
#include <string.h>

typedef int (*speedups_part)(PyObject *);
static const speedups_part parts[] = {SPEEDUPS_PARTS};

static const char *const crc_names[] = {
    [PLOG_CRC_PORTABLE] = "portable",
    [PLOG_CRC_SSE42] = "sse4.2",
    [PLOG_CRC_ARMV8] = "armv8-crc",
    [PLOG_CRC_SSE42_CLMUL] = "sse4.2+vpclmulqdq",
};

static PyObject *crc_impl(PyObject *self, PyObject *unused) {
    (void)self; (void)unused;
    int i = plog_crc32c_impl();
    if (i < 0 || (size_t)i >= sizeof crc_names / sizeof crc_names[0]) return PyUnicode_FromFormat("%d", i);
    return PyUnicode_FromString(crc_names[i]);
}

static PyMethodDef methods[] = {
    {"crc_impl", crc_impl, METH_NOARGS,
     "The CRC32C implementation this module's copy of the C core uses (it must match pylog._native's)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "pylog._speedups",
    "pylog's CPython extension: Records, reads and scans made in C (used by the native backend).",
    -1,
    methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    /* the same CRC32C choice pylog._native makes for its copy of the core */
    const char *portable = getenv("PYLOG_CRC32C_FORCE_PORTABLE");
    const char *no_clmul = getenv("PYLOG_CRC32C_NO_CLMUL");
    plog_crc32c_select(portable && strcmp(portable, "1") == 0 ? PLOG_CRC_SELECT_PORTABLE
                       : no_clmul && strcmp(no_clmul, "1") == 0 ? PLOG_CRC_SELECT_NO_CLMUL
                       : PLOG_CRC_SELECT_BEST);
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i](m) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
#ifdef Py_GIL_DISABLED
    PyUnstable_Module_SetGIL(m, Py_MOD_GIL_USED);
#endif
    return m;
}
