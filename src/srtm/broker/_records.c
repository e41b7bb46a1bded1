/* Queue records in bulk, in C: made from a batch of published bodies, and timed when
 * they are dispatched; and a publish's message ids. The Python references (and the paths
 * used where this module is not built) are srtm.broker.queue.fresh_records_py,
 * srtm.broker.stats.first_attempt_times_py and srtm.broker.message.hex_ids_py.
 *
 *   fresh_records(ids, bodies, now, arrival, publisher) -> list of
 *       (id, body, now, arrival, arrival, 0, publisher, None)
 *   run_records(ids, bodies, run) -> list of (id, body, *run[1:]) for a queue's run
 *       (srtm.broker.queue.run_records_py), as messages are taken from a queue
 *   first_attempt_times(records, now) -> (count, latency, token_wait, lateness)
 *       of the records on their first attempt (field 5 == 0): now - arrival,
 *       release - arrival and now - release, each as native int64 bytes.
 *   hex_ids(first, n) -> list of the n message ids first, first + 1, ..., each 16
 *       lowercase hex digits (srtm.broker.message.hex_ids_py)
 *   untrack(container) -> None: the collector stops tracking a list or deque
 *       (srtm.broker.queue.untrack_py leaves it tracked: the same contents either way)
 *
 * Built at install (pip install -e ., make test); optional. Each runs once per message
 * on the publish and dispatch paths: a record made in about 17 ns (Python's comprehension
 * 39), its three times in about 30 (Python's four comprehensions and arrays 107), an id in
 * about 17 (Python's 58 for 200 at once). A record this module does not take raises TypeError (its fields are
 * checked before anything is made), a difference past int64 OverflowError (as the Python
 * version's array does): the caller then does the same in Python. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>

#include "_int64.h"

static PyObject *fresh_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *ids, *bodies, *now, *arrival, *publisher;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O:fresh_records", &PyList_Type, &ids, &PyList_Type,
                          &bodies, &PyLong_Type, &now, &PyLong_Type, &arrival, &publisher))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (PyList_GET_SIZE(ids) != n) {
        PyErr_SetString(PyExc_ValueError, "fresh_records: as many ids as bodies");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_New(8);
        if (r == NULL) {
            Py_DECREF(zero);
            Py_DECREF(out);
            return NULL;
        }
        PyObject *items[8] = {PyList_GET_ITEM(ids, i), PyList_GET_ITEM(bodies, i), now, arrival,
                              arrival, zero, publisher, Py_None};
        for (int k = 0; k < 8; k++) {
            Py_INCREF(items[k]);
            PyTuple_SET_ITEM(r, k, items[k]);
        }
        PyList_SET_ITEM(out, i, r);
    }
    Py_DECREF(zero);
    return out;
}

/* The records of a queue's run: (id, body, *run[1:]) for each id and body. */
static PyObject *run_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *ids, *bodies, *run;
    if (!PyArg_ParseTuple(args, "O!O!O!:run_records", &PyList_Type, &ids, &PyList_Type, &bodies,
                          &PyTuple_Type, &run))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(bodies);
    if (PyList_GET_SIZE(ids) != n) {
        PyErr_SetString(PyExc_ValueError, "run_records: as many ids as bodies");
        return NULL;
    }
    if (PyTuple_GET_SIZE(run) != 7) {
        PyErr_SetString(PyExc_ValueError, "run_records: a run is a tuple of 7");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyTuple_New(8);
        if (r == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *id = PyList_GET_ITEM(ids, i), *body = PyList_GET_ITEM(bodies, i);
        Py_INCREF(id);
        PyTuple_SET_ITEM(r, 0, id);
        Py_INCREF(body);
        PyTuple_SET_ITEM(r, 1, body);
        for (int k = 1; k < 7; k++) {
            PyObject *v = PyTuple_GET_ITEM(run, k);
            Py_INCREF(v);
            PyTuple_SET_ITEM(r, k + 1, v);
        }
        PyList_SET_ITEM(out, i, r);
    }
    return out;
}

/* A time field of a record as int64; -1 with an exception set when it is not an int. */
static int time_field(PyObject *r, int k, long long *out) {
    PyObject *v = PyTuple_GET_ITEM(r, k);
    if (!PyLong_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "a record's times and attempts must be ints");
        return -1;
    }
    *out = as_int64(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* One pass: the three differences of each first attempt, side by side in ``buf`` (three
 * runs of ``n``); the count, or -1 with an exception set. */
static Py_ssize_t times(PyObject *records, long long now, int64_t *buf, Py_ssize_t n) {
    Py_ssize_t j = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        long long attempts, arrival, release, x, y, z;
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 6) {
            PyErr_SetString(PyExc_TypeError, "a record must be a tuple of at least 6 fields");
            return -1;
        }
        if (time_field(r, 5, &attempts) < 0)
            return -1;
        if (attempts != 0)
            continue;
        if (time_field(r, 3, &arrival) < 0 || time_field(r, 4, &release) < 0)
            return -1;
        if (__builtin_sub_overflow(now, arrival, &x) ||
            __builtin_sub_overflow(release, arrival, &y) ||
            __builtin_sub_overflow(now, release, &z)) {
            PyErr_SetString(PyExc_OverflowError, "a time difference past int64");
            return -1;
        }
        buf[j] = x;
        buf[n + j] = y;
        buf[2 * n + j] = z;
        j++;
    }
    return j;
}

static PyObject *first_attempt_times(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *records;
    long long now;
    if (!PyArg_ParseTuple(args, "O!L:first_attempt_times", &PyList_Type, &records, &now))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records);
    int64_t *buf = PyMem_Malloc((size_t)(3 * n + 1) * sizeof(int64_t));
    if (buf == NULL)
        return PyErr_NoMemory();
    Py_ssize_t count = times(records, now, buf, n);
    PyObject *out = NULL;
    if (count >= 0) {
        const char *p = (const char *)buf;
        Py_ssize_t size = count * 8, run = n * 8;
        out = Py_BuildValue("ny#y#y#", count, p, size, p + run, size, p + 2 * run, size);
    }
    PyMem_Free(buf);
    return out;
}

static PyObject *hex_ids(PyObject *Py_UNUSED(self), PyObject *args) {
    static const char digits[] = "0123456789abcdef";
    PyObject *first_obj;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!n:hex_ids", &PyLong_Type, &first_obj, &n))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "hex_ids: n must be >= 0");
        return NULL;
    }
    unsigned long long first = PyLong_AsUnsignedLongLong(first_obj);
    if (first == (unsigned long long)-1 && PyErr_Occurred())
        return NULL; /* negative, or past 64 bits: OverflowError */
    if (n > 0 && (unsigned long long)(n - 1) > ULLONG_MAX - first) {
        PyErr_SetString(PyExc_OverflowError, "hex_ids: the last id is past 64 bits");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyBytes_FromStringAndSize(NULL, 16);
        if (id == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        char *p = PyBytes_AS_STRING(id);
        unsigned long long v = first + (unsigned long long)i;
        for (int k = 15; k >= 0; k--, v >>= 4)
            p[k] = digits[v & 15];
        PyList_SET_ITEM(out, i, id);
    }
    return out;
}

/* A queue's bulk storage (lists of a million ids and bodies, a deque of records) holds
 * only what cannot refer back to it, so it is never part of a cycle, and refcounting frees
 * what it drops. Tracked, every full collection would visit each entry (33 ms for 1.7
 * million, freeing nothing): the broker's longest stalls. What it holds stays alive: an
 * untracked container's references count as coming from outside the collected set. */
static PyObject *deque_type;

static PyObject *untrack(PyObject *Py_UNUSED(self), PyObject *container) {
    if (!PyList_CheckExact(container) && (PyObject *)Py_TYPE(container) != deque_type) {
        PyErr_Format(PyExc_TypeError, "untrack: a list or deque, not %.100s",
                     Py_TYPE(container)->tp_name);
        return NULL;
    }
    if (PyObject_GC_IsTracked(container))
        PyObject_GC_UnTrack(container);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"fresh_records", fresh_records, METH_VARARGS,
     "fresh_records(ids, bodies, now, arrival, publisher): a published batch's records."},
    {"run_records", run_records, METH_VARARGS,
     "run_records(ids, bodies, run): the records of a queue's run (id, body, *run[1:])."},
    {"first_attempt_times", first_attempt_times, METH_VARARGS,
     "first_attempt_times(records, now): count, latency, token wait, lateness (int64 bytes)."},
    {"hex_ids", hex_ids, METH_VARARGS,
     "hex_ids(first, n): the n message ids from first on, 16 lowercase hex digits each."},
    {"untrack", untrack, METH_O,
     "untrack(container): the collector stops tracking a list or deque (a queue's storage)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._records", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__records(void) {
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return NULL;
    deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL)
        return NULL;
    return PyModule_Create(&module);
}
