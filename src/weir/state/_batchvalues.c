/* A batch function's reads and writes of many keys at once (weir/runtime/batch_state.py):
 * a hash-map value state's numbers moved between the table's dict (prefixed key ->
 * Python int or float, as the per-record calls keep them) and one native int64 or
 * float64 buffer, with no Python list in between; a hash-map list state's appends
 * (dict_append_many); a RocksDB value state's fixed-width values (IntSerializer,
 * FloatSerializer: 8 big-endian bytes) between its entry cache and one native buffer
 * (cache_get_fixed, cache_put_fixed).
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

/* Acquire values (a contiguous buffer) as 8 bytes for each of n keys; -1 with an
 * error set (nothing acquired) otherwise. */
static int
eight_bytes_each(PyObject *values, Py_ssize_t n, const char *who, Py_buffer *view)
{
    if (PyObject_GetBuffer(values, view, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    if (view->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "%s: %zd keys but %zd bytes of values", who, n,
                     view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* 0 when every item of the list keys is a bytes object (prefixed keys); -1 with a
 * TypeError naming who otherwise. The loops below run no code that could change a
 * list the caller made for the call, and re-read its length where a replaced value's
 * finalizer runs. */
static int
bytes_keys(PyObject *keys, const char *who)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        if (!PyBytes_CheckExact(PyList_GET_ITEM(keys, i))) {
            PyErr_Format(PyExc_TypeError, "%s: keys must be bytes", who);
            return -1;
        }
    }
    return 0;
}

/* Row i of a column read is null: its validity bit cleared. */
static inline void
set_null(unsigned char *bits, Py_ssize_t i)
{
    bits[i / 8] &= (unsigned char)~(1u << (i % 8));
}

/* A column of n 8-byte values and its validity bitmap (every bit set), new; -1 with
 * an error set (nothing allocated) otherwise. */
static int
new_column(Py_ssize_t n, PyObject **values, PyObject **validity)
{
    *values = PyByteArray_FromStringAndSize(NULL, n * 8);
    *validity = PyByteArray_FromStringAndSize(NULL, (n + 7) / 8);
    if (*values == NULL || *validity == NULL) {
        Py_CLEAR(*values);
        Py_CLEAR(*validity);
        return -1;
    }
    memset(PyByteArray_AS_STRING(*validity), 0xff, (size_t)((n + 7) / 8));
    return 0;
}

/* The (values, validity or None, null count) result of a column read. */
static PyObject *
column_result(PyObject *values, PyObject *validity, Py_ssize_t nulls)
{
    if (nulls == 0) {
        Py_SETREF(validity, Py_NewRef(Py_None));
    }
    return Py_BuildValue("(NNn)", values, validity, nulls);
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
    PyObject *data = args[0], *keys = args[1], *values, *validity;
    if (bytes_keys(keys, "dict_get_numbers") < 0) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (new_column(n, &values, &validity) < 0) {
        return NULL;
    }
    char *out = PyByteArray_AS_STRING(values);
    unsigned char *bits = (unsigned char *)PyByteArray_AS_STRING(validity);
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* (no Python code runs in this loop: keys stays as it is; the dict's lookups
         * of bytes keys call no user code) */
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyDict_GetItemWithError(data, key);
        if (value == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            set_null(bits, i);
            nulls++;
            memset(out + i * 8, 0, 8);
        }
        else if (kind == 'i') {
            if (!PyLong_CheckExact(value)) {
                goto decline;
            }
            int overflow = 0;
            int64_t i64 = (int64_t)PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow != 0) {
                goto decline;
            }
            memcpy(out + i * 8, &i64, 8);
        }
        else {
            if (!PyFloat_CheckExact(value)) {
                goto decline;
            }
            double f64 = PyFloat_AS_DOUBLE(value);
            memcpy(out + i * 8, &f64, 8);
        }
    }
    return column_result(values, validity, nulls);
decline:
    Py_DECREF(values);
    Py_DECREF(validity);
    Py_RETURN_NONE;
fail:
    Py_DECREF(values);
    Py_DECREF(validity);
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
    if (bytes_keys(keys, "dict_put_numbers") < 0) {
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (eight_bytes_each(args[2], n, "dict_put_numbers", &view) < 0) {
        return NULL;
    }
    const char *in = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
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
    if (bytes_keys(keys, "dict_append_many") < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys) && i < PyList_GET_SIZE(values); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyList_GET_ITEM(values, i);
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

/* cache_get_fixed(cache: dict, keys: list[bytes], kind, complete: bool) -> (values,
 * validity, null count) | None: each key's stored 8 big-endian bytes (a RocksDB entry
 * cache: prefixed key -> bytes, None where known absent) as native int64 ('i') or
 * float64 ('f'), null where absent. A key the cache does not hold is absent when
 * complete; otherwise, or for a stored value not of 8 bytes, None (the caller reads
 * through the table). */
PyObject *
weir_cache_get_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "cache_get_fixed(cache: dict, keys: list, kind, complete)");
        return NULL;
    }
    if (number_kind(args[2]) == 0) {
        return NULL;
    }
    int complete = PyObject_IsTrue(args[3]);
    if (complete < 0) {
        return NULL;
    }
    PyObject *cache = args[0], *keys = args[1], *values, *validity;
    if (bytes_keys(keys, "cache_get_fixed") < 0) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (new_column(n, &values, &validity) < 0) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(values);
    unsigned char *bits = (unsigned char *)PyByteArray_AS_STRING(validity);
    Py_ssize_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *data = PyDict_GetItemWithError(cache, key);
        uint64_t u = 0;
        if (data == NULL && PyErr_Occurred()) {
            goto fail;
        }
        if ((data == NULL && complete) || data == Py_None) {
            set_null(bits, i);
            nulls++;
        }
        else if (data == NULL || !PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) != 8) {
            Py_DECREF(values);
            Py_DECREF(validity);
            Py_RETURN_NONE;
        }
        else {
            const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
            for (int j = 0; j < 8; j++) {
                u = (u << 8) | b[j];
            }
        }
        memcpy(out + i * 8, &u, 8); /* (the bits of an int64 or a double, native order) */
    }
    return column_result(values, validity, nulls);
fail:
    Py_DECREF(values);
    Py_DECREF(validity);
    return NULL;
}

/* cache_put_fixed(cache: dict, record: dict, keys: list[bytes], values) -> None: the
 * i-th 8 bytes of values (a contiguous buffer of 8 * len(keys) bytes, already the
 * stored big-endian form) stored for keys[i] in the entry cache and in the record of
 * writes (the dirty entries or the change record): one bytes object, two dict stores. */
PyObject *
weir_cache_put_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[1])
        || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "cache_put_fixed(cache: dict, record: dict, keys: list, values)");
        return NULL;
    }
    PyObject *cache = args[0], *record = args[1], *keys = args[2];
    if (bytes_keys(keys, "cache_put_fixed") < 0) {
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (eight_bytes_each(args[3], n, "cache_put_fixed", &view) < 0) {
        return NULL;
    }
    const char *in = (const char *)view.buf;
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_INCREF(key); /* (a replaced value's finalizer cannot take it from us) */
        PyObject *data = PyBytes_FromStringAndSize(in + i * 8, 8);
        int failed = data == NULL || PyDict_SetItem(cache, key, data) < 0
                     || PyDict_SetItem(record, key, data) < 0;
        Py_XDECREF(data);
        Py_DECREF(key);
        if (failed) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}
