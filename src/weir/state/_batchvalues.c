/* A batch function's reads and writes of hash-map tables for many keys at once
 * (weir/runtime/batch_state.py): a value state's numbers moved between the table's
 * dict (prefixed key -> Python int or float, as the per-record calls keep them) and
 * one native int64 or float64 buffer, with no Python list in between; a list state's
 * appends (dict_append_many).
 *
 * dict_get_numbers declines (None) when a stored value is not the exact type asked
 * for (a bool, an int for a float column, an int beyond int64, any other object): the
 * caller's general path then converts or raises as Arrow does. dict_put_numbers
 * stores the buffer's values as Python ints or floats; the caller has run the state's
 * write check on that type and records the writes (changelog tracking). */
#include "_hashcore.h"

/* The kind argument: 'i' (int64) or 'f' (float64); 0 with TypeError otherwise. */
static int
number_kind(PyObject *arg)
{
    if (PyUnicode_Check(arg) && PyUnicode_GET_LENGTH(arg) == 1) {
        Py_UCS4 c = PyUnicode_READ_CHAR(arg, 0);
        if (c == 'i' || c == 'f') {
            return (int)c;
        }
    }
    PyErr_SetString(PyExc_TypeError, "kind must be 'i' (int64) or 'f' (float64)");
    return 0;
}

/* dict_get_numbers(data: dict, keys: list[bytes], kind) -> (values: bytearray, validity:
 * bytearray | None, null count) | None: each key's value as a native int64 / float64
 * (0 where absent) and an Arrow validity bitmap (LSB first; None without nulls). */
PyObject *
weir_dict_get_numbers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dict_get_numbers(data: dict, keys: list, kind)");
        return NULL;
    }
    int kind = number_kind(args[2]);
    if (kind == 0) {
        return NULL;
    }
    PyObject *data = args[0], *keys = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *values = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *validity = PyByteArray_FromStringAndSize(NULL, (n + 7) / 8);
    if (values == NULL || validity == NULL) {
        goto fail;
    }
    char *out = PyByteArray_AS_STRING(values);
    unsigned char *bits = (unsigned char *)PyByteArray_AS_STRING(validity);
    memset(bits, 0xff, (size_t)((n + 7) / 8));
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* (no Python code runs in this loop: keys stays as it is; the dict's lookups
         * of bytes keys call no user code) */
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "dict_get_numbers: keys must be bytes");
            goto fail;
        }
        PyObject *value = PyDict_GetItemWithError(data, key);
        int64_t i64 = 0;
        double f64 = 0.0;
        if (value == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            bits[i / 8] &= (unsigned char)~(1u << (i % 8));
            nulls++;
        }
        else if (kind == 'i') {
            if (!PyLong_CheckExact(value)) {
                goto decline;
            }
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow != 0) {
                goto decline;
            }
            i64 = (int64_t)v;
        }
        else {
            if (!PyFloat_CheckExact(value)) {
                goto decline;
            }
            f64 = PyFloat_AS_DOUBLE(value);
        }
        if (kind == 'i') {
            memcpy(out + i * 8, &i64, 8);
        }
        else {
            memcpy(out + i * 8, &f64, 8);
        }
    }
    if (nulls == 0) {
        Py_SETREF(validity, Py_NewRef(Py_None));
    }
    PyObject *result = Py_BuildValue("(NNn)", values, validity, nulls);
    return result;
decline:
    Py_DECREF(values);
    Py_DECREF(validity);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(values);
    Py_XDECREF(validity);
    return NULL;
}

/* dict_put_numbers(data: dict, keys: list[bytes], values, kind) -> None: data[keys[i]]
 * = the i-th native int64 / float64 of values (a contiguous buffer of 8 * len(keys)
 * bytes), as a Python int / float. */
PyObject *
weir_dict_put_numbers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "dict_put_numbers(data: dict, keys: list, values, kind)");
        return NULL;
    }
    int kind = number_kind(args[3]);
    if (kind == 0) {
        return NULL;
    }
    PyObject *data = args[0], *keys = args[1];
    Py_buffer view;
    if (PyObject_GetBuffer(args[2], &view, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (view.len != n * 8) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "dict_put_numbers: %zd keys but %zd bytes of values",
                     n, view.len);
        return NULL;
    }
    const char *in = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(key)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "dict_put_numbers: keys must be bytes");
            return NULL;
        }
        PyObject *value;
        if (kind == 'i') {
            int64_t v;
            memcpy(&v, in + i * 8, 8);
            value = PyLong_FromLongLong((long long)v);
        }
        else {
            double v;
            memcpy(&v, in + i * 8, 8);
            value = PyFloat_FromDouble(v);
        }
        /* (replacing a stored value may run its finalizer: the loop re-reads the
         * list's length, and each key is checked as it is read) */
        if (value == NULL || PyDict_SetItem(data, key, value) < 0) {
            Py_XDECREF(value);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(value);
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* dict_append_many(data: dict, keys: list[bytes], values: list) -> None: values[i]
 * appended to the list data[keys[i]] (a new list where absent), in order: a list
 * state's adds (the caller has run the write check and records the writes). */
PyObject *
weir_dict_append_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !PyList_CheckExact(args[2]) || PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "dict_append_many(data: dict, keys: list, values: list of its length)");
        return NULL;
    }
    PyObject *data = args[0], *keys = args[1], *values = args[2];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys) && i < PyList_GET_SIZE(values); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyList_GET_ITEM(values, i);
        if (!PyBytes_CheckExact(key)) {
            PyErr_SetString(PyExc_TypeError, "dict_append_many: keys must be bytes");
            return NULL;
        }
        PyObject *stored = PyDict_GetItemWithError(data, key);
        if (stored == NULL) {
            if (PyErr_Occurred()) {
                return NULL;
            }
            PyObject *fresh = PyList_New(1);
            if (fresh == NULL) {
                return NULL;
            }
            PyList_SET_ITEM(fresh, 0, Py_NewRef(value));
            int failed = PyDict_SetItem(data, key, fresh);
            Py_DECREF(fresh);
            if (failed < 0) {
                return NULL;
            }
        }
        else if (!PyList_CheckExact(stored)) {
            PyErr_SetString(PyExc_TypeError, "dict_append_many: a stored value is not a list");
            return NULL;
        }
        else if (PyList_Append(stored, value) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}
