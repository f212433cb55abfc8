/* The hot loop of a full snapshot (weir.state.packed.pack_sources): each canonical
 * entry (prefixed key, encoded value) of one state appended to its key group's buffer
 * as two msgpack bin objects — the bytes msgpack.Packer(use_bin_type=True).pack(key)
 * and .pack(value) write (bin 8 / 16 / 32 by length) — grouped by the key's first two
 * bytes (its key group), in the order met. Keys and values: any bytes-like object. */
#include "_hashcore.h"

#define GROUPS 65536

static int
append_bin(PyObject *buf, const char *data, Py_ssize_t n)
{
    unsigned char head[5];
    Py_ssize_t h;
    if (n < 256) {
        head[0] = 0xc4;
        head[1] = (unsigned char)n;
        h = 2;
    }
    else if (n < 65536) {
        head[0] = 0xc5;
        head[1] = (unsigned char)(n >> 8);
        head[2] = (unsigned char)n;
        h = 3;
    }
    else if (n <= 0xffffffffLL) {
        head[0] = 0xc6;
        head[1] = (unsigned char)(n >> 24);
        head[2] = (unsigned char)(n >> 16);
        head[3] = (unsigned char)(n >> 8);
        head[4] = (unsigned char)n;
        h = 5;
    }
    else {
        PyErr_SetString(PyExc_ValueError, "pack_entries: an entry of 4 GiB or more");
        return -1;
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, old + h + n) < 0) {
        return -1;
    }
    char *p = PyByteArray_AS_STRING(buf) + old;
    memcpy(p, head, (size_t)h);
    memcpy(p + h, data, (size_t)n);
    return 0;
}

/* out[g] = slot, a new reference (NULL: the error already set) that this consumes. */
static int
put_group(PyObject *out, int g, PyObject *slot)
{
    PyObject *group = slot == NULL ? NULL : PyLong_FromLong(g);
    int failed = group == NULL || PyDict_SetItem(out, group, slot) < 0;
    Py_XDECREF(slot);
    Py_XDECREF(group);
    return failed ? -1 : 0;
}

PyObject *
weir_pack_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "pack_entries(entries)");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[0]);
    if (it == NULL) {
        return NULL;
    }
    PyObject **bufs = PyMem_Calloc(GROUPS, sizeof(PyObject *));
    Py_ssize_t *counts = PyMem_Calloc(GROUPS, sizeof(Py_ssize_t));
    PyObject *out = NULL, *item;
    if (bufs == NULL || counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    while ((item = PyIter_Next(it)) != NULL) {
        Py_buffer key, value;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_SetString(PyExc_TypeError,
                            "pack_entries: each entry must be a (key, value) tuple of bytes");
            Py_DECREF(item);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 0), &key, PyBUF_SIMPLE) < 0) {
            Py_DECREF(item);
            goto done;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 1), &value, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&key);
            Py_DECREF(item);
            goto done;
        }
        int failed = 0;
        if (key.len < 2) {
            PyErr_SetString(PyExc_ValueError,
                            "pack_entries: a key shorter than its 2-byte key group");
            failed = 1;
        }
        int group = failed ? 0 : (((const unsigned char *)key.buf)[0] << 8)
                                     | ((const unsigned char *)key.buf)[1];
        if (!failed && bufs[group] == NULL
            && (bufs[group] = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) {
            failed = 1;
        }
        failed = failed || append_bin(bufs[group], key.buf, key.len) < 0
                 || append_bin(bufs[group], value.buf, value.len) < 0;
        PyBuffer_Release(&key);
        PyBuffer_Release(&value);
        Py_DECREF(item);
        if (failed) {
            goto done;
        }
        counts[group]++;
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    out = PyDict_New();
    if (out == NULL) {
        goto done;
    }
    for (int g = 0; g < GROUPS; g++) {
        if (bufs[g] == NULL) {
            continue;
        }
        if (put_group(out, g, Py_BuildValue("(On)", bufs[g], counts[g])) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_DECREF(it);
    if (bufs != NULL) {
        for (int g = 0; g < GROUPS; g++) {
            Py_XDECREF(bufs[g]);
        }
    }
    PyMem_Free(bufs);
    PyMem_Free(counts);
    return out;
}

/* The hot loop of a RocksDB changelog delta (weir.checkpoint.changelog): a dict of
 * prefixed key -> bytes written last (None: deleted) packed by key group into two
 * buffers of msgpack bin objects, every key (the primary keys replaced) and every
 * (key, value) still present, in the dict's order. */
PyObject *
weir_pack_changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack_changes(dict of bytes -> bytes | None)");
        return NULL;
    }
    PyObject **keys = PyMem_Calloc(GROUPS, sizeof(PyObject *));
    PyObject **entries = PyMem_Calloc(GROUPS, sizeof(PyObject *));
    Py_ssize_t *nkeys = PyMem_Calloc(GROUPS, sizeof(Py_ssize_t));
    Py_ssize_t *nentries = PyMem_Calloc(GROUPS, sizeof(Py_ssize_t));
    PyObject *out = NULL, *key, *value;
    Py_ssize_t pos = 0;
    if (keys == NULL || entries == NULL || nkeys == NULL || nentries == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    while (PyDict_Next(args[0], &pos, &key, &value)) {
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) < 2
            || (value != Py_None && !PyBytes_Check(value))) {
            PyErr_SetString(PyExc_TypeError, "pack_changes: keys must be bytes with their "
                                             "key group, values bytes or None");
            goto done;
        }
        const char *k = PyBytes_AS_STRING(key);
        Py_ssize_t kn = PyBytes_GET_SIZE(key);
        int group = (((const unsigned char *)k)[0] << 8) | ((const unsigned char *)k)[1];
        if (keys[group] == NULL) {
            keys[group] = PyByteArray_FromStringAndSize(NULL, 0);
            entries[group] = PyByteArray_FromStringAndSize(NULL, 0);
            if (keys[group] == NULL || entries[group] == NULL) {
                goto done;
            }
        }
        if (append_bin(keys[group], k, kn) < 0) {
            goto done;
        }
        nkeys[group]++;
        if (value != Py_None) {
            if (append_bin(entries[group], k, kn) < 0
                || append_bin(entries[group], PyBytes_AS_STRING(value),
                              PyBytes_GET_SIZE(value)) < 0) {
                goto done;
            }
            nentries[group]++;
        }
    }
    out = PyDict_New();
    if (out == NULL) {
        goto done;
    }
    for (int g = 0; g < GROUPS; g++) {
        if (keys[g] == NULL) {
            continue;
        }
        PyObject *slot = Py_BuildValue("(OnOn)", keys[g], nkeys[g], entries[g], nentries[g]);
        if (put_group(out, g, slot) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    if (keys != NULL && entries != NULL) {
        for (int g = 0; g < GROUPS; g++) {
            Py_XDECREF(keys[g]);
            Py_XDECREF(entries[g]);
        }
    }
    PyMem_Free(keys);
    PyMem_Free(entries);
    PyMem_Free(nkeys);
    PyMem_Free(nentries);
    return out;
}
