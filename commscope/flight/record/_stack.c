/* The stack walk of the flight recorder, in C: one call instead of a Python loop.
 *
 * capture(frame, limit) returns [code, offset, code, offset, ...] for `frame` and the
 * frames that called it, innermost first, at most `limit` frames: the same flat list
 * commscope.flight.record.stack.capture_stack_py builds with f_code, f_lasti and f_back.
 * Only public C API is used (PyFrame_GetCode, PyFrame_GetLasti, PyFrame_GetBack,
 * Python 3.11+); every reference taken is released on every path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000
#error "the stack walk needs Python 3.11 (PyFrame_GetLasti)"
#endif

static PyObject *
capture(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "capture(frame, limit) takes 2 arguments");
        return NULL;
    }
    PyObject *start = args[0];
    long limit = PyLong_AsLong(args[1]);
    if (limit == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (start != Py_None && !PyFrame_Check(start)) {
        PyErr_SetString(PyExc_TypeError, "capture() needs a frame or None");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    PyFrameObject *frame = start == Py_None ? NULL : (PyFrameObject *)start;
    Py_XINCREF(frame);
    for (long n = 0; n < limit && frame != NULL; n++) {
        PyCodeObject *code = PyFrame_GetCode(frame); /* new reference */
        PyObject *offset = PyLong_FromLong((long)PyFrame_GetLasti(frame));
        int failed = offset == NULL
            || PyList_Append(out, (PyObject *)code) < 0
            || PyList_Append(out, offset) < 0;
        Py_XDECREF(offset);
        Py_DECREF(code);
        PyFrameObject *back = failed ? NULL : PyFrame_GetBack(frame); /* new or NULL */
        Py_DECREF(frame);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
        frame = back;
    }
    Py_XDECREF(frame);
    return out;
}

static PyMethodDef methods[] = {
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL,
     "capture(frame, limit) -> [code, offset, ...], innermost first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stack", "The flight recorder's stack walk in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__stack(void)
{
    return PyModule_Create(&module);
}
