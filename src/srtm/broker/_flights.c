/* A consumer's run of FINs taken off its channel's messages in flight, in C. The Python
 * reference (and the path used where this module is not built) is
 * srtm.broker.flights.fin_flights_py.
 *
 *   fin_flights(flights, mids, consumer) -> (done, failed, settles, stopped)
 *       each id of mids whose flight (record, consumer, deadline) in the dict flights
 *       has this very consumer is deleted from it; done: how many; failed: the ids that
 *       were absent or another consumer's (left as they are), in order; settles: a
 *       (origin, count) per run of taken flights whose record's field 7 is the same
 *       origin, None apart; stopped: the index of the first id whose flight this does
 *       not take (not a tuple of at least 2, or, this consumer's, its record not a tuple
 *       of at least 8), left in place with every id after it for the caller, else
 *       len(mids).
 *
 *   fly(flights, recs, consumer, deadline) -> ids
 *       each record of the list recs (a tuple whose field 0 is its id) put in flight in
 *       the dict flights, id -> (record, consumer, deadline); ids: their ids, in order.
 *       A record that is not a tuple, or an empty one, raises TypeError before any is put.
 *
 * Built at install (pip install -e ., make test); optional. Each runs once per message a
 * consumer gets: a FIN about 50 ns against the Python loop's 120 (runs of 100). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Append (origin, run) to settles; -1 with an exception set. */
static int add_settle(PyObject *settles, PyObject *origin, Py_ssize_t run) {
    PyObject *pair = Py_BuildValue("(On)", origin, run);
    if (pair == NULL)
        return -1;
    int rc = PyList_Append(settles, pair);
    Py_DECREF(pair);
    return rc;
}

static PyObject *fin_flights(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *flights, *mids, *consumer;
    if (!PyArg_ParseTuple(args, "O!O!O:fin_flights", &PyDict_Type, &flights, &PyList_Type,
                          &mids, &consumer))
        return NULL;
    PyObject *failed = PyList_New(0), *settles = PyList_New(0);
    PyObject *last = Py_None; /* a reference of our own: its flight may go */
    Py_INCREF(last);
    Py_ssize_t done = 0, run = 0, i = 0;
    if (failed == NULL || settles == NULL)
        goto error;
    for (; i < PyList_GET_SIZE(mids); i++) {
        PyObject *mid = PyList_GET_ITEM(mids, i);
        Py_INCREF(mid);
        PyObject *flight = PyDict_GetItemWithError(flights, mid); /* borrowed */
        if (flight == NULL && PyErr_Occurred()) {
            Py_DECREF(mid);
            goto error;
        }
        if (flight != NULL && (!PyTuple_Check(flight) || PyTuple_GET_SIZE(flight) < 2)) {
            Py_DECREF(mid);
            break;
        }
        if (flight == NULL || PyTuple_GET_ITEM(flight, 1) != consumer) {
            int rc = PyList_Append(failed, mid);
            Py_DECREF(mid);
            if (rc < 0)
                goto error;
            continue;
        }
        PyObject *rec = PyTuple_GET_ITEM(flight, 0);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 8) {
            Py_DECREF(mid);
            break;
        }
        PyObject *origin = PyTuple_GET_ITEM(rec, 7);
        Py_INCREF(origin);
        int rc = PyDict_DelItem(flights, mid); /* the flight may be freed here */
        Py_DECREF(mid);
        if (rc < 0) {
            Py_DECREF(origin);
            goto error;
        }
        done++;
        if (origin != last) {
            if (last != Py_None && add_settle(settles, last, run) < 0) {
                Py_DECREF(origin);
                goto error;
            }
            Py_SETREF(last, origin);
            run = 0;
        } else {
            Py_DECREF(origin);
        }
        run++;
    }
    if (last != Py_None && add_settle(settles, last, run) < 0)
        goto error;
    Py_DECREF(last);
    return Py_BuildValue("(nNNn)", done, failed, settles, i);
error:
    Py_DECREF(last);
    Py_XDECREF(failed);
    Py_XDECREF(settles);
    return NULL;
}

static PyObject *fly(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *flights, *recs, *consumer, *deadline;
    if (!PyArg_ParseTuple(args, "O!O!OO:fly", &PyDict_Type, &flights, &PyList_Type, &recs,
                          &consumer, &deadline))
        return NULL;
    /* Ids and flights in lists of our own first: nothing is put where a record fails,
     * and the dict's work cannot change what is put. */
    Py_ssize_t n = PyList_GET_SIZE(recs);
    PyObject *ids = PyList_New(n), *put = PyList_New(n);
    if (ids == NULL || put == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 1) {
            PyErr_Format(PyExc_TypeError, "record %zd is not a tuple with an id", i);
            goto error;
        }
        PyObject *flight = PyTuple_Pack(3, rec, consumer, deadline);
        if (flight == NULL)
            goto error;
        PyList_SET_ITEM(put, i, flight);
        PyObject *mid = PyTuple_GET_ITEM(rec, 0);
        Py_INCREF(mid);
        PyList_SET_ITEM(ids, i, mid);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyDict_SetItem(flights, PyList_GET_ITEM(ids, i), PyList_GET_ITEM(put, i)) < 0)
            goto error;
    Py_DECREF(put);
    return ids;
error:
    Py_XDECREF(ids);
    Py_XDECREF(put);
    return NULL;
}

static PyMethodDef methods[] = {
    {"fin_flights", fin_flights, METH_VARARGS,
     "fin_flights(flights, mids, consumer): done, failed ids, (origin, count) runs, stopped."},
    {"fly", fly, METH_VARARGS,
     "fly(flights, recs, consumer, deadline): each record put in flight; their ids."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "srtm.broker._flights", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__flights(void) { return PyModule_Create(&module); }
