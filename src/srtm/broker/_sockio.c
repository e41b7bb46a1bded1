/* A connection's two socket calls on the hot path, in C: recv_stamped(sock, size) reads
 * once with the kernel's receive stamp, send(sock, data) sends once; as
 * srtm.broker.sockio's recv_stamped_py and send_py do through the socket object (the
 * reference, and the path used where this module is not built).
 *
 * Both run on non-blocking sockets (MSG_DONTWAIT: they never wait, whatever the socket)
 * and keep the GIL: the call returns at once, and releasing the GIL around it costs more
 * than the call and hands it to the disk thread in the middle of a read. The read parses
 * its SCM_TIMESTAMPNS here rather than building Python's list of (level, type, bytes),
 * and reads the clock after it, as the reference calls time.time_ns. Together about 1 µs
 * of the broker's thread a read and its answer (a single PUB's round trip is ~15 µs).
 * Errors are raised as the socket module's calls raise them (OSError by errno: BlockingIOError
 * when nothing is there, or no room; EINTR is retried).
 *
 * Built at install (pip install -e ., make test); optional. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static PyObject *fileno_name; /* "fileno", interned at import */

/* ``sock.fileno()``; -1 with an error set: OSError EBADF for a closed socket (-1), as
 * the socket's own calls raise. */
static int descriptor(PyObject *sock) {
    PyObject *got = PyObject_CallMethodNoArgs(sock, fileno_name);
    if (got == NULL)
        return -1;
    long fd = PyLong_AsLong(got);
    Py_DECREF(got);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    if (fd < 0 || fd > INT_MAX) {
        errno = EBADF;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return (int)fd;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The SCM_TIMESTAMPNS stamp among ``m``'s control messages, in ns (0: none). */
static long long kernel_stamp(struct msghdr *m) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c != NULL; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        }
    }
    return 0;
}

static PyObject *recv_stamped(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "recv_stamped(sock, size) takes 2 arguments");
        return NULL;
    }
    int fd = descriptor(args[0]);
    if (fd < 0)
        return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 0) {
        PyErr_SetString(PyExc_ValueError, "negative buffersize in recv_stamped");
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, size);
    if (data == NULL)
        return NULL;
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(struct timespec))];
    } control;
    struct iovec iov = {PyBytes_AS_STRING(data), (size_t)size};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control.bytes;
    m.msg_controllen = sizeof control.bytes;
    ssize_t n;
    do {
        n = recvmsg(fd, &m, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        Py_DECREF(data);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    long long now = now_ns(), stamp = kernel_stamp(&m);
    if (n != size && _PyBytes_Resize(&data, n) < 0)
        return NULL;
    return Py_BuildValue("(NLL)", data, stamp, now);
}

static PyObject *send_(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send(sock, data) takes 2 arguments");
        return NULL;
    }
    int fd = descriptor(args[0]);
    if (fd < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    ssize_t n;
    do {
        n = send(fd, view.buf, (size_t)view.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    PyBuffer_Release(&view);
    if (n < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromSsize_t(n);
}

static PyMethodDef methods[] = {
    {"recv_stamped", (PyCFunction)(void (*)(void))recv_stamped, METH_FASTCALL,
     "recv_stamped(sock, size): (data, kernel stamp in ns or 0, time.time_ns after it)."},
    {"send", (PyCFunction)(void (*)(void))send_, METH_FASTCALL,
     "send(sock, data): the bytes sent, as sock.send(data) on a non-blocking socket."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._sockio", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sockio(void) {
    fileno_name = PyUnicode_InternFromString("fileno");
    if (fileno_name == NULL)
        return NULL;
    return PyModule_Create(&module);
}
