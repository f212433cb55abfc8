/* The hot loop of a hash-map restore (HashMapValueTable.load, in
 * weir/state/hashmap_tables.py): each restored (prefixed key, encoded value) of a
 * value state decoded and stored in the table's dict. A value of the default MsgpackSerializer that is one msgpack scalar —
 * nil, bool, int, float 32 / 64, str (UTF-8), bin — is decoded here, to the object
 * msgpack.unpackb(raw=False) gives; every other value (arrays, maps, extension types,
 * invalid UTF-8, trailing bytes, another serializer) is passed to the serializer's
 * decode, whose result or error is the one Python would give. */
#include "_hashcore.h"

static unsigned long long
be(const unsigned char *p, int n)
{
    unsigned long long u = 0;
    for (int i = 0; i < n; i++) {
        u = (u << 8) | p[i];
    }
    return u;
}

/* The object of a msgpack scalar that is exactly the n bytes at p (new reference);
 * NULL without an error set when it is not one (the caller decodes it in Python);
 * NULL with an error set on failure (out of memory). Also the RocksDB value state's
 * fast path (_rockscore.c). */
PyObject *
weir_msgpack_scalar(const unsigned char *p, Py_ssize_t n)
{
    if (n < 1) {
        return NULL;
    }
    unsigned char t = p[0];
    Py_ssize_t need, len;
    if (t <= 0x7f || t >= 0xe0) {  /* positive and negative fixint */
        return n == 1 ? PyLong_FromLong(t <= 0x7f ? (long)t : (long)(signed char)t) : NULL;
    }
    switch (t) {
    case 0xc0:
        return n == 1 ? Py_NewRef(Py_None) : NULL;
    case 0xc2:
    case 0xc3:
        return n == 1 ? Py_NewRef(t == 0xc3 ? Py_True : Py_False) : NULL;
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {  /* uint 8 .. 64 */
        int w = 1 << (t - 0xcc);
        return n == 1 + w ? PyLong_FromUnsignedLongLong(be(p + 1, w)) : NULL;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {  /* int 8 .. 64 */
        int w = 1 << (t - 0xd0);
        if (n != 1 + w) {
            return NULL;
        }
        unsigned long long u = be(p + 1, w);
        long long v = w == 1 ? (long long)(signed char)u
                    : w == 2 ? (long long)(short)u
                    : w == 4 ? (long long)(int)u : (long long)u;
        return PyLong_FromLongLong(v);
    }
    case 0xca:  /* float 32: msgpack-python gives a Python float of its value */
        if (n != 5) {
            return NULL;
        }
        {
            double d = PyFloat_Unpack4((const char *)p + 1, 0);
            return d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
        }
    case 0xcb:
        if (n != 9) {
            return NULL;
        }
        {
            double d = PyFloat_Unpack8((const char *)p + 1, 0);
            return d == -1.0 && PyErr_Occurred() ? NULL : PyFloat_FromDouble(d);
        }
    case 0xd9: case 0xda: case 0xdb:  /* str 8 / 16 / 32 */
    case 0xc4: case 0xc5: case 0xc6: {  /* bin 8 / 16 / 32 */
        int w = 1 << ((t >= 0xd9 ? t - 0xd9 : t - 0xc4));
        if (n < 1 + w) {
            return NULL;
        }
        len = (Py_ssize_t)be(p + 1, w);
        need = 1 + w;
        break;
    }
    default:
        if (t >= 0xa0 && t <= 0xbf) {  /* fixstr */
            len = t & 0x1f;
            need = 1;
            break;
        }
        return NULL;  /* arrays, maps, extension types: Python */
    }
    if (n != need + len) {
        return NULL;
    }
    if (t >= 0xc4 && t <= 0xc6) {
        return PyBytes_FromStringAndSize((const char *)p + need, len);
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p + need, len, NULL);
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();  /* Python's decode raises the serializer's own error */
    }
    return s;
}

/* data[key] = the value of raw (in C when scalars and raw is a bytes object of one
 * msgpack scalar, else decode(raw)), type(value) added to types unless it is *last
 * (updated); 0, or -1 with an exception set. */
static int
load_one(PyObject *data, PyObject *key, PyObject *raw, PyObject *decode, int scalars,
         PyObject *types, PyTypeObject **last)
{
    PyObject *value = NULL;
    if (scalars && PyBytes_CheckExact(raw)) {
        value = weir_msgpack_scalar((const unsigned char *)PyBytes_AS_STRING(raw),
                                     PyBytes_GET_SIZE(raw));
        if (value == NULL && PyErr_Occurred()) {
            return -1;
        }
    }
    if (value == NULL) {
        value = PyObject_CallOneArg(decode, raw);
    }
    int failed = value == NULL || PyDict_SetItem(data, key, value) < 0;
    if (!failed && Py_TYPE(value) != *last) {
        *last = Py_TYPE(value);
        failed = PySet_Add(types, (PyObject *)*last) < 0;
    }
    Py_XDECREF(value);
    return failed ? -1 : 0;
}

static int
load_args(const char *name, PyObject *const *args, Py_ssize_t nargs, int *scalars)
{
    if (nargs != 5 || !PyDict_Check(args[0]) || !PySet_Check(args[4])) {
        PyErr_Format(PyExc_TypeError,
                     "%s(data: dict, entries, decode, scalars: bool, types: set)", name);
        return -1;
    }
    *scalars = PyObject_IsTrue(args[3]);
    return *scalars < 0 ? -1 : 0;
}

/* load_values(data, entries, decode, scalars, types): for each (key, raw) of the
 * iterable entries, data[key] = the decoded value — in C when scalars is true and raw
 * is a bytes object of one msgpack scalar, else decode(raw) — and type(value) added
 * to the set types. An exception of decode propagates (the caller names the state). */
PyObject *
weir_load_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int scalars;
    if (load_args("load_values", args, nargs, &scalars) < 0) {
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[1]);
    if (it == NULL) {
        return NULL;
    }
    PyTypeObject *last = NULL;
    PyObject *entry;
    while ((entry = PyIter_Next(it)) != NULL) {
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_TypeError, "load_values: entries must be (key, raw) pairs");
            break;
        }
        int failed = load_one(args[0], PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1),
                              args[2], scalars, args[4], &last);
        Py_DECREF(entry);
        if (failed) {
            break;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* load_flat(data, flat, decode, scalars, types): load_values of the list
 * [key0, raw0, key1, raw1, ...] as a restore unpacks it, without a tuple per entry. */
PyObject *
weir_load_flat(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int scalars;
    if (load_args("load_flat", args, nargs, &scalars) < 0) {
        return NULL;
    }
    PyObject *flat = args[1];
    if (!PyList_CheckExact(flat) || PyList_GET_SIZE(flat) % 2 != 0) {
        PyErr_SetString(PyExc_TypeError, "load_flat: flat must be a list [key, raw, ...]");
        return NULL;
    }
    PyTypeObject *last = NULL;
    /* the list's length is read each time: decode may run Python that changes it */
    for (Py_ssize_t i = 0; i + 1 < PyList_GET_SIZE(flat); i += 2) {
        PyObject *key = Py_NewRef(PyList_GET_ITEM(flat, i));
        PyObject *raw = Py_NewRef(PyList_GET_ITEM(flat, i + 1));
        int failed = load_one(args[0], key, raw, args[2], scalars, args[4], &last);
        Py_DECREF(key);
        Py_DECREF(raw);
        if (failed) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
}
