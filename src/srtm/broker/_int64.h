/* An int's value as int64, shared by the broker's C extensions (_diskcodec.c, _frames.c,
 * _records.c): included, not compiled on its own.
 *
 * CPython 3.11's PyLong_AsLongLong takes any int of more than one 30-bit digit (every
 * nanosecond timestamp) through _PyLong_AsByteArray, a byte at a time; PyLong_AsLong
 * adds up the digits. Where long is 64 bits (LP64) the two have the same range, and the
 * same OverflowError past it and TypeError for what is not an int. */
#ifndef SRTM_INT64_H
#define SRTM_INT64_H

#include <Python.h>
#include <limits.h>

static inline long long as_int64(PyObject *o) {
#if LONG_MAX == LLONG_MAX
    return PyLong_AsLong(o);
#else
    return PyLong_AsLongLong(o);
#endif
}

#endif
