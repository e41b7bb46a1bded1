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
 * PUBs sends tens in a read, and the general parser's Python costs about 2 µs for each.
 *
 * one_publish(data, limits) is srtm.protocol.parser.one_publish_py in C (the reference,
 * and the path used where this module is not built): a read that is exactly one PUB, or
 * an MPUB of one message, to a topic name already found valid (a sensor's read), as a
 * Pub or Mpub; None for anything else. configure(valid_topics, Pub, Mpub) gives it the
 * parser's table of names found valid and the two command types, once, at import; it
 * makes each command by setting its two slots, as the dataclass's __init__ would. */

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

/* What configure() gave: topic names found valid (bytes -> str), Pub and Mpub. */
static PyObject *valid_topics, *pub_type, *mpub_type;
/* Each type's two slots (topic, then body or bodies), where both are plain slots: a
 * command is then made by setting them, as its dataclass __init__ does, without running
 * that Python function on every sensor's read. NULL: made by calling the type. */
static PyObject *pub_slots[2], *mpub_slots[2];

static void slots_of(PyObject *type, const char *first, const char *second, PyObject **out) {
    const char *names[2] = {first, second};
    Py_CLEAR(out[0]);
    Py_CLEAR(out[1]);
    for (int i = 0; i < 2; i++) {
        PyObject *d = PyType_Check(type) ? PyObject_GetAttrString(type, names[i]) : NULL;
        if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_Clear();
            Py_XDECREF(d);
            Py_CLEAR(out[0]);
            return;
        }
        out[i] = d;
    }
}

static PyObject *make(PyObject *type, PyObject **slots, PyObject *a, PyObject *b) {
    if (slots[0] == NULL)
        return PyObject_CallFunctionObjArgs(type, a, b, NULL);
    PyTypeObject *t = (PyTypeObject *)type;
    PyObject *o = t->tp_alloc(t, 0);
    if (o == NULL)
        return NULL;
    if (Py_TYPE(slots[0])->tp_descr_set(slots[0], o, a) < 0 ||
        Py_TYPE(slots[1])->tp_descr_set(slots[1], o, b) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    return o;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *topics, *pub, *mpub;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &topics, &pub, &mpub))
        return NULL;
    Py_INCREF(topics);
    Py_INCREF(pub);
    Py_INCREF(mpub);
    Py_XSETREF(valid_topics, topics);
    Py_XSETREF(pub_type, pub);
    Py_XSETREF(mpub_type, mpub);
    slots_of(pub, "topic", "body", pub_slots);
    slots_of(mpub, "topic", "bodies", mpub_slots);
    Py_RETURN_NONE;
}

static int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

/* The names of the limits it reads, made once (at import). */
static PyObject *max_line_name, *max_msg_name, *max_body_name;

/* limits.<name> as a Py_ssize_t (-1 with an exception set where it is not one). */
static Py_ssize_t limit(PyObject *limits, PyObject *name) {
    PyObject *v = PyObject_GetAttr(limits, name);
    if (v == NULL)
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return n;
}

static PyObject *one_publish(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "one_publish(data: bytes, limits)");
        return NULL;
    }
    if (valid_topics == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "one_publish before configure()");
        return NULL;
    }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), start;
    if (n >= 4 && memcmp(b, "PUB ", 4) == 0)
        start = 4;
    else if (n >= 5 && memcmp(b, "MPUB ", 5) == 0)
        start = 5;
    else
        Py_RETURN_NONE;
    /* The limits first: nothing after the name's lookup runs code that could change the
     * table (the name is held from there on, all the same). */
    Py_ssize_t max_line = limit(args[1], max_line_name);
    if (max_line == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_msg = limit(args[1], max_msg_name);
    if (max_msg == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t max_body = start == 5 ? limit(args[1], max_body_name) : 0;
    if (max_body == -1 && PyErr_Occurred())
        return NULL;
    /* The newline among the first max_line + 1 bytes, as data.find(b"\n", start,
     * max_line + 1) looks for it. */
    Py_ssize_t stop = max_line + 1 < n ? max_line + 1 : n;
    const unsigned char *nl = stop > start ? memchr(b + start, '\n', (size_t)(stop - start)) : NULL;
    if (nl == NULL)
        Py_RETURN_NONE;
    Py_ssize_t end = nl - b;
    PyObject *key = PyBytes_FromStringAndSize((const char *)b + start, end - start);
    if (key == NULL)
        return NULL;
    PyObject *topic = PyDict_GetItemWithError(valid_topics, key); /* borrowed */
    Py_DECREF(key);
    if (topic == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(topic); /* held until the command is made */
    Py_ssize_t size = n >= end + 5 ? be32(b + end + 1) : -1;
    PyObject *out = NULL;
    if (n < end + 5 || n != end + 5 + size) {
        out = Py_NewRef(Py_None);
    } else if (start == 4) {
        if (size > 0 && size <= max_msg) {
            PyObject *body = PyBytes_FromStringAndSize((const char *)b + end + 5, size);
            if (body != NULL)
                out = make(pub_type, pub_slots, topic, body);
            Py_XDECREF(body);
        } else {
            out = Py_NewRef(Py_None);
        }
    } else {
        Py_ssize_t count = size >= 9 ? be32(b + end + 5) : 0;
        Py_ssize_t msg = size >= 9 ? be32(b + end + 9) : 0;
        if (size < 9 || size > max_body || count != 1 || msg != size - 8 || msg > max_msg) {
            out = Py_NewRef(Py_None);
        } else {
            PyObject *bodies = PyList_New(1);
            PyObject *body =
                bodies ? PyBytes_FromStringAndSize((const char *)b + end + 13, msg) : NULL;
            if (body != NULL) {
                PyList_SET_ITEM(bodies, 0, body); /* steals it */
                out = make(mpub_type, mpub_slots, topic, bodies);
            }
            Py_XDECREF(bodies);
        }
    }
    Py_DECREF(topic);
    return out;
}

static PyMethodDef methods[] = {
    {"pub_run", pub_run, METH_VARARGS,
     "pub_run(buf, pos, max_line, max_size): (topic, bodies, end) of the run of PUBs to one "
     "topic from pos, or None."},
    {"configure", configure, METH_VARARGS,
     "configure(valid_topics, Pub, Mpub): what one_publish reads names from and makes."},
    {"one_publish", (PyCFunction)(void (*)(void))one_publish, METH_FASTCALL,
     "one_publish(data, limits): the Pub or Mpub of one message that data is exactly, or "
     "None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.protocol._pubrun", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pubrun(void) {
    max_line_name = PyUnicode_InternFromString("max_line");
    max_msg_name = PyUnicode_InternFromString("max_msg_size");
    max_body_name = PyUnicode_InternFromString("max_body_size");
    if (max_line_name == NULL || max_msg_name == NULL || max_body_name == NULL)
        return NULL;
    return PyModule_Create(&module);
}
