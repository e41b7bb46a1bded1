/* Values counted into an HDR histogram's counts, in C. The Python reference (and the
 * path used where this module is not built) is srtm.broker.stats.record_many, which
 * indexes each value as HdrHistogram.record_value does.
 *
 *   record(counts, values, lowest, highest, unit_magnitude, half_count_magnitude,
 *          sub_bucket_mask) -> (min, max)
 *       counts: the histogram's counts (a writable buffer of 4- or 8-byte integers);
 *       values: native int64 (an array('q')), each clipped to [lowest, highest] first.
 *       Every index is checked before any count changes (IndexError: a value past the
 *       counts, which leaves them as they were). Counts wrap on overflow, as numpy's do.
 *
 * Built at install (pip install -e ., make test); optional. The broker's housekeeping
 * moves each histogram's pending values in with one call: numpy's dozen whole-array
 * steps took 35-175 µs per flush whatever the number of values, and every flush holds
 * shaped releases back; this takes a few ns a value. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    long long lowest, highest;
    int unit, half_magnitude;
    unsigned long long mask;
    Py_ssize_t half_count;
} Shape;

static Py_ssize_t index_of(const Shape *s, long long v) {
    if (v < s->lowest)
        v = s->lowest;
    if (v > s->highest)
        v = s->highest;
    unsigned long long u = (unsigned long long)v;
    int pow2ceiling = 64 - __builtin_clzll(u | s->mask);
    int bucket = pow2ceiling - s->unit - (s->half_magnitude + 1);
    long long sub = (long long)(u >> (bucket + s->unit));
    return (Py_ssize_t)((((long long)bucket + 1) << s->half_magnitude) + sub - s->half_count);
}

static PyObject *record(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *counts_obj, *values_obj;
    Shape s;
    if (!PyArg_ParseTuple(args, "OOLLiiK:record", &counts_obj, &values_obj, &s.lowest,
                          &s.highest, &s.unit, &s.half_magnitude, &s.mask))
        return NULL;
    if (s.lowest < 1 || s.highest < s.lowest || s.unit < 0 || s.half_magnitude < 0 ||
        s.unit + s.half_magnitude > 62 || s.mask == 0) {
        PyErr_SetString(PyExc_ValueError, "record: not a histogram's shape");
        return NULL;
    }
    s.half_count = (Py_ssize_t)1 << s.half_magnitude;
    Py_buffer counts, values;
    if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (PyObject_GetBuffer(values_obj, &values, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&counts);
        return NULL;
    }
    PyObject *result = NULL;
    if ((counts.itemsize != 4 && counts.itemsize != 8) || values.itemsize != 8) {
        PyErr_SetString(PyExc_TypeError, "record: counts of 4 or 8 bytes, values of 8");
        goto done;
    }
    Py_ssize_t n = values.len / 8, len = counts.len / counts.itemsize;
    const long long *v = (const long long *)values.buf;
    if (n == 0) {
        PyErr_SetString(PyExc_ValueError, "record: no values");
        goto done;
    }
    long long lo = v[0], hi = v[0];
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = index_of(&s, v[i]);
        if (k < 0 || k >= len) {
            PyErr_Format(PyExc_IndexError, "record: %lld is past the histogram's counts", v[i]);
            goto done;
        }
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    if (counts.itemsize == 8) {
        uint64_t *c = (uint64_t *)counts.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            c[index_of(&s, v[i])] += 1;
    } else {
        uint32_t *c = (uint32_t *)counts.buf;
        for (Py_ssize_t i = 0; i < n; i++)
            c[index_of(&s, v[i])] += 1;
    }
    lo = lo < s.lowest ? s.lowest : (lo > s.highest ? s.highest : lo);
    hi = hi < s.lowest ? s.lowest : (hi > s.highest ? s.highest : hi);
    result = Py_BuildValue("(LL)", lo, hi);
done:
    PyBuffer_Release(&values);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"record", record, METH_VARARGS,
     "record(counts, values, lowest, highest, unit_magnitude, half_count_magnitude, "
     "sub_bucket_mask): count each value, clipped; (min, max) of the clipped values."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._histogram", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__histogram(void) { return PyModule_Create(&module); }
