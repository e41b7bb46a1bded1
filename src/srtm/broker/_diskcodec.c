/* The disk queue's record codec in C: encode_batch(records) -> bytes, and
 * decode_batch(buf, pos, want, max_bytes, version, origin) -> (records, end, problem).
 *
 * The same bytes as srtm.broker.disk.codec.encode_batch_py (the reference, and the path
 * used where this module is not built): per record, CRC-32 of what follows it, then the
 * big-endian fields ">I qqqqH16sHI" (length, timestamp, arrival, release, due = -1,
 * attempts, id, publisher length, body length), the publisher (UTF-8), the body. A field
 * out of range raises OverflowError (the caller treats it as struct.error); a field of
 * another type than bytes, str or int raises TypeError: the caller then encodes the batch
 * in Python, which takes what struct takes.
 *
 * Built at install (pip install -e ., make test) from this file; optional: without a
 * compiler the pure-Python encoder is used. It runs on the event loop for every message
 * that overflows to disk, where the Python version's struct call, concatenations and
 * CRC call per message cost about 0.3 us each.
 *
 * The decoder gives what srtm.broker.disk.codec.decode_batch_py gives (the reference):
 * queue records read back from a segment, checked as _Cursor.next checks them. It runs on
 * the disk thread, whose Python per record (struct, crc32, a Message) held the GIL the
 * event loop needs for 1-2 us a record. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_bigendian.h"
#include "_int64.h"

#define FIXED 56 /* qqqqH16sHI */

/* CRC-32 as zlib's crc32 (reflected, polynomial 0xEDB88320), eight bytes a step
 * ("slicing-by-8"): zlib's own took about 110 ns of the 130 ns a 160-byte record cost
 * here (its setup per call), this about 60 ns. */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t crc32_of(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t a = le32(p) ^ c, b = le32(p + 4);
        c = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^
            crc_table[5][(a >> 16) & 0xFF] ^ crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^
            crc_table[2][(b >> 8) & 0xFF] ^ crc_table[1][(b >> 16) & 0xFF] ^ crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static int get_i64(PyObject *o, long long *out) {
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "a record's time fields must be ints");
        return -1;
    }
    *out = as_int64(o); /* OverflowError past int64, as struct's q */
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* One record's parts, checked (borrowed references, kept alive by the list). */
typedef struct {
    const char *id, *body, *pub;
    Py_ssize_t idlen, blen, plen;
    long long ts, arrival, release;
    long attempts;
} Parts;

static int parts_of(PyObject *rec, Parts *p) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 7) {
        PyErr_SetString(PyExc_ValueError, "a record is a tuple of at least 7 fields");
        return -1;
    }
    PyObject *id = PyTuple_GET_ITEM(rec, 0), *body = PyTuple_GET_ITEM(rec, 1);
    PyObject *pub = PyTuple_GET_ITEM(rec, 6), *att = PyTuple_GET_ITEM(rec, 5);
    if (!PyBytes_Check(id) || !PyBytes_Check(body) || !PyUnicode_Check(pub) ||
        !PyLong_Check(att)) {
        /* the caller encodes such a record in Python instead (TypeError: not here) */
        PyErr_SetString(PyExc_TypeError, "a record's id and body are bytes, its publisher str");
        return -1;
    }
    p->id = PyBytes_AS_STRING(id);
    p->idlen = PyBytes_GET_SIZE(id);
    p->body = PyBytes_AS_STRING(body);
    p->blen = PyBytes_GET_SIZE(body);
    p->pub = PyUnicode_AsUTF8AndSize(pub, &p->plen); /* cached in the str */
    if (p->pub == NULL)
        return -1;
    if (get_i64(PyTuple_GET_ITEM(rec, 2), &p->ts) || get_i64(PyTuple_GET_ITEM(rec, 3), &p->arrival) ||
        get_i64(PyTuple_GET_ITEM(rec, 4), &p->release))
        return -1;
    p->attempts = PyLong_AsLong(att);
    if (p->attempts == -1 && PyErr_Occurred())
        return -1;
    if (p->attempts < 0 || p->attempts > 0xFFFF || p->plen > 0xFFFF ||
        (unsigned long long)p->blen > 0xFFFFFFFFULL - FIXED - (unsigned long long)p->plen) {
        PyErr_SetString(PyExc_OverflowError, "a record's field is out of range");
        return -1;
    }
    return 0;
}

static PyObject *encode_batch(PyObject *self, PyObject *records) {
    (void)self;
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "encode_batch takes a list of records");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records), total = 0;
    Parts *parts = PyMem_Malloc(sizeof(Parts) * (size_t)(n ? n : 1));
    if (parts == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parts_of(PyList_GET_ITEM(records, i), &parts[i]) < 0) {
            PyMem_Free(parts);
            return NULL;
        }
        total += 8 + FIXED + parts[i].plen + parts[i].blen;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        PyMem_Free(parts);
        return NULL;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Parts *p = &parts[i];
        unsigned char *rec = w;
        put32(w + 4, (unsigned long)(FIXED + p->plen + p->blen));
        put64(w + 8, p->ts);
        put64(w + 16, p->arrival);
        put64(w + 24, p->release);
        put64(w + 32, -1);
        w[40] = (unsigned char)(p->attempts >> 8);
        w[41] = (unsigned char)p->attempts;
        /* struct's 16s: truncated, or padded with zeros */
        Py_ssize_t k = p->idlen < 16 ? p->idlen : 16;
        memcpy(w + 42, p->id, (size_t)k);
        memset(w + 42 + k, 0, (size_t)(16 - k));
        w[58] = (unsigned char)(p->plen >> 8);
        w[59] = (unsigned char)p->plen;
        put32(w + 60, (unsigned long)p->blen);
        w += 64;
        memcpy(w, p->pub, (size_t)p->plen);
        w += p->plen;
        memcpy(w, p->body, (size_t)p->blen);
        w += p->blen;
        put32(rec, crc32_of(rec + 4, (size_t)(w - rec - 4)));
    }
    PyMem_Free(parts);
    return out;
}


static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static long long get64(const unsigned char *p) {
    unsigned long long v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (long long)v;
}

#define MAX_RECORD (1UL << 30)

/* One record's tuple (id, body, timestamp, arrival, release, attempts, publisher,
 * origin) of the fixed part at f, the publisher and body after it; NULL with *problem set
 * (a new str) for a publisher that is not UTF-8, NULL alone on an error. */
static PyObject *record_of(const unsigned char *f, unsigned plen, size_t blen, PyObject *origin,
                           PyObject **problem) {
    PyObject *pub = PyUnicode_DecodeUTF8((const char *)f + FIXED, (Py_ssize_t)plen, NULL);
    if (pub == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
            return NULL;
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *value = PyErr_GetRaisedException();
#else
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
#endif
        *problem = value != NULL ? PyObject_Str(value) : NULL; /* str(exc), as in Python */
        Py_XDECREF(value);
        return NULL;
    }
    PyObject *rec = PyTuple_New(8);
    if (rec == NULL) {
        Py_DECREF(pub);
        return NULL;
    }
    PyObject *items[6] = {
        PyBytes_FromStringAndSize((const char *)f + 34, 16),
        PyBytes_FromStringAndSize((const char *)f + FIXED + plen, (Py_ssize_t)blen),
        PyLong_FromLongLong(get64(f)),
        PyLong_FromLongLong(get64(f + 8)),
        PyLong_FromLongLong(get64(f + 16)),
        PyLong_FromLong((long)f[32] << 8 | f[33]),
    };
    for (int i = 0; i < 6; i++)
        PyTuple_SET_ITEM(rec, i, items[i]); /* NULLs are let go with the tuple */
    PyTuple_SET_ITEM(rec, 6, pub);
    Py_INCREF(origin);
    PyTuple_SET_ITEM(rec, 7, origin);
    for (int i = 0; i < 6; i++)
        if (items[i] == NULL) {
            Py_DECREF(rec);
            return NULL;
        }
    return rec;
}

static PyObject *decode_batch(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t pos, want, max_bytes;
    int version;
    PyObject *origin;
    if (!PyArg_ParseTuple(args, "y*nnniO:decode_batch", &view, &pos, &want, &max_bytes, &version,
                          &origin))
        return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len;
    if (pos < 0 || pos > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "decode_batch: pos out of the buffer");
        return NULL;
    }
    const size_t frame = version == 2 ? 8 : 0;
    PyObject *out = PyList_New(0), *problem = NULL;
    if (out == NULL)
        goto fail;
    Py_ssize_t p = pos;
    while (PyList_GET_SIZE(out) < want && p - pos < max_bytes) {
        if ((size_t)(n - p) < frame + FIXED)
            break; /* the buffer ends (cleanly or within a record) */
        const unsigned char *r = b + p, *f = r + frame;
        unsigned plen = (unsigned)f[50] << 8 | f[51];
        size_t blen = get32(f + 52);
        unsigned long long length = FIXED + plen + (unsigned long long)blen;
        uint32_t crc = 0;
        if (frame) {
            crc = get32(r);
            unsigned long given = get32(r + 4);
            if (given < FIXED || given > MAX_RECORD) {
                problem = PyUnicode_FromFormat("record length %lu out of range", given);
                break;
            }
            if (given != length) {
                problem = PyUnicode_FromFormat("lengths %u+%lu do not fill a %lu-byte record",
                                               plen, (unsigned long)blen, given);
                break;
            }
        }
        if ((unsigned long long)(n - p) < frame + length)
            break; /* cut short in the buffer: the caller reads on */
        size_t end = frame + (size_t)length;
        if (frame && crc32_of(r + 4, end - 4) != crc) {
            problem = PyUnicode_FromString("checksum mismatch");
            break;
        }
        PyObject *rec = record_of(f, plen, blen, origin, &problem);
        if (rec == NULL) {
            if (problem != NULL)
                break;
            goto fail;
        }
        if (PyList_Append(out, rec) < 0) {
            Py_DECREF(rec);
            goto fail;
        }
        Py_DECREF(rec);
        p += (Py_ssize_t)end;
    }
    if (PyErr_Occurred())
        goto fail; /* a problem that could not be made */
    PyBuffer_Release(&view);
    if (problem == NULL) {
        problem = Py_None;
        Py_INCREF(problem);
    }
    return Py_BuildValue("(NnN)", out, p, problem);
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(out);
    Py_XDECREF(problem);
    return NULL;
}

static PyMethodDef methods[] = {
    {"encode_batch", encode_batch, METH_O,
     "Version-2 disk queue records of a list of records, back to back."},
    {"decode_batch", decode_batch, METH_VARARGS,
     "Up to want records (and about max_bytes) of a buffer of disk queue records from pos: "
     "(records, the offset after them, why reading stopped early or None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._diskcodec", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__diskcodec(void) {
    crc_init();
    return PyModule_Create(&module);
}
