/* Message frames in C: frame_records(out, records) appends to the bytearray ``out`` one
 * NSQ MESSAGE frame per queue record, as srtm.broker.tcp.frame_records_py does (the
 * reference, and the path used where this module is not built).
 *
 * A frame is ">iIqH16s" (size = 30 + body length, frame type 2, timestamp, attempts + 1,
 * id) followed by the body. Every record is checked before ``out`` grows, so a record
 * this module does not take (TypeError: not a tuple of bytes and ints, an id other than
 * 16 bytes; OverflowError: attempts + 1 past 65535, a timestamp past int64) leaves ``out``
 * as it was and the caller frames the batch in Python.
 *
 * Built at install (pip install -e ., make test); optional. It runs for every message a
 * consumer gets, where the Python loop's struct call and two bytearray appends cost about
 * 120 ns a message. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_bigendian.h"
#include "_int64.h"

#define HEAD 34     /* size, type, timestamp, attempts, id */
#define OVERHEAD 30 /* what the size counts besides the body: all but itself */
#define MESSAGE 2

/* The record's fields, checked: 0 on success, -1 with an exception set. */
static int fields(PyObject *r, PyObject **id, PyObject **body, long long *ts, long *attempts) {
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
        PyErr_SetString(PyExc_TypeError, "a record must be a tuple of at least 6 fields");
        return -1;
    }
    *id = PyTuple_GET_ITEM(r, 0);
    *body = PyTuple_GET_ITEM(r, 1);
    PyObject *t = PyTuple_GET_ITEM(r, 2), *a = PyTuple_GET_ITEM(r, 5);
    if (!PyBytes_Check(*id) || PyBytes_GET_SIZE(*id) != 16 || !PyBytes_Check(*body) ||
        !PyLong_Check(t) || !PyLong_Check(a)) {
        PyErr_SetString(PyExc_TypeError, "a record needs a 16-byte id, a bytes body, int fields");
        return -1;
    }
    *ts = as_int64(t);
    if (*ts == -1 && PyErr_Occurred())
        return -1;
    *attempts = PyLong_AsLong(a);
    if (*attempts == -1 && PyErr_Occurred())
        return -1;
    if (*attempts < 0 || *attempts >= 65535) {
        PyErr_SetString(PyExc_OverflowError, "attempts + 1 out of range for a frame");
        return -1;
    }
    if (PyBytes_GET_SIZE(*body) > INT32_MAX - OVERHEAD) {
        PyErr_SetString(PyExc_OverflowError, "body too long for a frame");
        return -1;
    }
    return 0;
}

static PyObject *frame_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *out, *records;
    if (!PyArg_ParseTuple(args, "O!O!:frame_records", &PyByteArray_Type, &out, &PyList_Type,
                          &records))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), total = 0;
    PyObject *id, *body;
    long long ts;
    long attempts;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (fields(PyList_GET_ITEM(records, i), &id, &body, &ts, &attempts) < 0)
            return NULL;
        total += HEAD + PyBytes_GET_SIZE(body);
    }
    Py_ssize_t start = PyByteArray_GET_SIZE(out);
    if (PyByteArray_Resize(out, start + total) < 0)
        return NULL;
    unsigned char *p = (unsigned char *)PyByteArray_AS_STRING(out) + start;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        id = PyTuple_GET_ITEM(r, 0);
        body = PyTuple_GET_ITEM(r, 1);
        Py_ssize_t blen = PyBytes_GET_SIZE(body);
        put32(p, (uint32_t)(blen + OVERHEAD));
        put32(p + 4, MESSAGE);
        put64(p + 8, as_int64(PyTuple_GET_ITEM(r, 2)));
        long a = PyLong_AsLong(PyTuple_GET_ITEM(r, 5)) + 1;
        p[16] = (unsigned char)(a >> 8);
        p[17] = (unsigned char)a;
        memcpy(p + 18, PyBytes_AS_STRING(id), 16);
        memcpy(p + HEAD, PyBytes_AS_STRING(body), (size_t)blen);
        p += HEAD + blen;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"frame_records", frame_records, METH_VARARGS,
     "frame_records(out, records): append a MESSAGE frame per record to out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._frames", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
