/* A publisher's run of PUBs in C: pub_run(buf, pos, max_line, max_size) finds the whole,
 * well-formed PUBs to one topic back to back from ``pos``, as
 * srtm.protocol.parser.pub_run_py does (the reference, and the path used where this module
 * is not built).
 *
 * It takes only the plain form, "PUB <topic>\n" then a 4-byte big-endian size in
 * 1..max_size then the body, whole, with the line at most max_line bytes and the topic
 * free of spaces and carriage returns; it stops at the first command that is anything
 * else (another topic, a line cut short, a bad size), which the general parser then reads
 * and, where it is wrong, refuses. So the commands it gives are those the general parser
 * would give for the same bytes.
 *
 * Built at install (pip install -e ., make test); optional. A publisher that pipelines
 * PUBs sends tens in a read, and the general parser's Python costs about 2 µs for each. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *pub_run(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_line, max_size;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &pos, &max_line, &max_size))
        return NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len, p = pos < 0 ? n : pos;
    Py_ssize_t topic_at = -1, topic_len = 0;
    PyObject *bodies = PyList_New(0);
    if (bodies == NULL)
        goto fail;
    while (n - p >= 4 && memcmp(b + p, "PUB ", 4) == 0) {
        /* The newline within max_line bytes of the line's start, as the general parser
         * bounds a line. */
        Py_ssize_t reach = n - (p + 4);
        if (reach > max_line - 4 + 1)
            reach = max_line - 4 + 1;
        if (reach <= 0)
            break;
        const unsigned char *nl = memchr(b + p + 4, '\n', (size_t)reach);
        if (nl == NULL)
            break;
        Py_ssize_t t_at = p + 4, t_len = (nl - b) - t_at;
        if (t_len == 0 || memchr(b + t_at, ' ', (size_t)t_len) != NULL ||
            memchr(b + t_at, '\r', (size_t)t_len) != NULL)
            break;
        if (topic_at < 0) {
            topic_at = t_at;
            topic_len = t_len;
        } else if (t_len != topic_len || memcmp(b + t_at, b + topic_at, (size_t)t_len) != 0) {
            break;
        }
        Py_ssize_t at = (nl - b) + 1;
        if (n - at < 4)
            break;
        int32_t size = (int32_t)(((uint32_t)b[at] << 24) | ((uint32_t)b[at + 1] << 16) |
                                 ((uint32_t)b[at + 2] << 8) | (uint32_t)b[at + 3]);
        if (size <= 0 || size > max_size || n - (at + 4) < size)
            break;
        PyObject *body = PyBytes_FromStringAndSize((const char *)b + at + 4, size);
        if (body == NULL)
            goto fail;
        int err = PyList_Append(bodies, body);
        Py_DECREF(body);
        if (err < 0)
            goto fail;
        p = at + 4 + size;
    }
    if (PyList_GET_SIZE(bodies) == 0) {
        Py_DECREF(bodies);
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    PyObject *topic = PyBytes_FromStringAndSize((const char *)b + topic_at, topic_len);
    PyBuffer_Release(&view);
    if (topic == NULL) {
        Py_DECREF(bodies);
        return NULL;
    }
    return Py_BuildValue("(NNn)", topic, bodies, p);
fail:
    Py_XDECREF(bodies);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pub_run", pub_run, METH_VARARGS,
     "pub_run(buf, pos, max_line, max_size): (topic, bodies, end) of the run of PUBs to one "
     "topic from pos, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.protocol._pubrun", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pubrun(void) { return PyModule_Create(&module); }
