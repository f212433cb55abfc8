/* weir.state._hashcore, part 2: the current key in C.
 *
 * KeyCell is the C base of weir.state.keycontext.KeyContext. Its set_current_key
 * makes a str or int key current in C: canonical bytes, key hash and group, the check
 * that this subtask owns the group, the prefixed key (weir/state/_keybytes.h). Any
 * other key, an unencodable one, a group outside the subtask's range, or a cell whose
 * max_parallelism is not set goes to the Python method _slow_set_current_key, which
 * holds the whole semantics (every key type, KeyGroupError, serialization errors).
 *
 * route_keys gives the Spark runtime's route pass the routes of a column of keys in
 * one call (the same encoding and hash), and int64_range its row-order column.
 * spark_hash_int / _long / _bytes are Spark's hash primitives for weir.state.keyhash,
 * common_key_hash its fast path for the common keys.
 */
#include "_hashcore.h"

#include <structmember.h>

#include "_keybytes.h"

static PyObject *str_slow_set_current_key, *str_record_timestamp;

int
weir_keycell_init(void)
{
    str_slow_set_current_key = PyUnicode_InternFromString("_slow_set_current_key");
    str_record_timestamp = PyUnicode_InternFromString("record_timestamp");
    return str_slow_set_current_key == NULL || str_record_timestamp == NULL ? -1 : 0;
}

static int
keycell_traverse(KeyCell *self, visitproc visit, void *arg)
{
    Py_VISIT(self->key_bytes);
    Py_VISIT(self->key);
    return 0;
}

static int
keycell_clear(KeyCell *self)
{
    Py_CLEAR(self->key_bytes);
    Py_CLEAR(self->key);
    return 0;
}

static void
keycell_dealloc(KeyCell *self)
{
    PyObject_GC_UnTrack(self);
    keycell_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
keycell_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    KeyCell *self = (KeyCell *)PyType_GenericNew(type, args, kwds);
    if (self != NULL) {
        self->key_group = -1;
        self->kg_start = 0;
        self->kg_end = -1; /* an empty range until Python sets it */
    }
    return (PyObject *)self;
}

static PyObject *
keycell_set_current_key(KeyCell *self, PyObject *key)
{
    int group = -1;
    PyObject *prefixed = weir_prefixed_key(key, self->max_parallelism, &group);
    if (prefixed == NULL || group < self->kg_start || group > self->kg_end) {
        Py_XDECREF(prefixed);
        return PyObject_CallMethodOneArg((PyObject *)self, str_slow_set_current_key, key);
    }
    Py_XSETREF(self->key_bytes, prefixed);
    Py_XSETREF(self->key, Py_NewRef(key));
    self->key_group = group;
    Py_RETURN_NONE;
}

/* prefixed_keys(keys) -> list of the prefixed keys of a list of keys, each checked as
 * set_current_key checks it (the keys this subtask owns; the rest through
 * _slow_set_current_key, which raises KeyGroupError or encodes any other key type).
 * The cell's current key is left set to the last key's (the caller clears it). */
static PyObject *
keycell_prefixed_keys(KeyCell *self, PyObject *keys)
{
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "prefixed_keys(keys: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        int group = -1;
        PyObject *prefixed = weir_prefixed_key(key, self->max_parallelism, &group);
        if (prefixed == NULL || group < self->kg_start || group > self->kg_end) {
            Py_XDECREF(prefixed);
            Py_INCREF(key);  /* (the slow path may run code that changes the list) */
            PyObject *done = PyObject_CallMethodOneArg((PyObject *)self,
                                                       str_slow_set_current_key, key);
            Py_DECREF(key);
            if (done == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(done);
            prefixed = Py_NewRef(self->key_bytes);
        }
        PyList_SET_ITEM(out, i, prefixed);
    }
    return out;
}

/* Append result's items (a list, a tuple or any iterable) to out. */
static int
extend_outputs(PyObject *out, PyObject *result)
{
    if (PyList_CheckExact(result) || PyTuple_CheckExact(result)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(result);
        PyObject **items = PySequence_Fast_ITEMS(result);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyList_Append(out, items[i]) < 0) {
                return -1;
            }
        }
        return 0;
    }
    PyObject *it = PyObject_GetIter(result);
    if (it == NULL) {
        return -1;
    }
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        int failed = PyList_Append(out, item);
        Py_DECREF(item);
        if (failed < 0) {
            Py_DECREF(it);
            return -1;
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

/* process_keyed(cell, values, keys, timestamps, operator, process, out, cleaners,
 * on_record): KeyedOperator.process_keyed's loop. For each record, in step: the next
 * value of the iterator values (one per record, so its length left says which record
 * raised), keys[i] made current as set_current_key does, operator.record_timestamp set
 * to timestamps[i] (when it is another object than the last), process(value, operator)
 * with its outputs appended to out, and on_record() while the list cleaners is not
 * empty. keys and timestamps are lists of one length; values must have as many
 * (ValueError otherwise, as zip(strict=True)). */
PyObject *
weir_process_keyed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyObject_TypeCheck(args[0], &KeyCellType) || !PyList_CheckExact(args[2])
        || !PyList_CheckExact(args[3]) || !PyList_CheckExact(args[6])
        || !PyList_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "process_keyed(cell: KeyCell, values: iterator, keys: list, timestamps: "
                        "list, operator, process, out: list, cleaners: list, on_record)");
        return NULL;
    }
    KeyCell *cell = (KeyCell *)args[0];
    PyObject *values = args[1], *keys = args[2], *times = args[3], *op = args[4];
    PyObject *process = args[5], *out = args[6], *cleaners = args[7], *on_record = args[8];
    if (!PyIter_Check(values)) {
        PyErr_SetString(PyExc_TypeError, "process_keyed: values must be an iterator");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(times) != n) {
        PyErr_SetString(PyExc_ValueError, "process_keyed: keys and timestamps differ in length");
        return NULL;
    }
    PyObject *last_ts = NULL; /* (borrowed from times, which the caller holds) */
    for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(keys); i++) {
        PyObject *value = PyIter_Next(values);
        if (value == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "process_keyed: fewer values than keys");
            }
            return NULL;
        }
        PyObject *key = Py_NewRef(PyList_GET_ITEM(keys, i));
        PyObject *done = keycell_set_current_key(cell, key);
        Py_DECREF(key);
        if (done == NULL) {
            Py_DECREF(value);
            return NULL;
        }
        Py_DECREF(done);
        PyObject *ts = PyList_GET_ITEM(times, i);
        if (ts != last_ts) {
            if (PyObject_SetAttr(op, str_record_timestamp, ts) < 0) {
                Py_DECREF(value);
                return NULL;
            }
            last_ts = ts;
        }
        PyObject *argv[2] = {value, op};
        PyObject *result = PyObject_Vectorcall(process, argv, 2, NULL);
        Py_DECREF(value);
        if (result == NULL) {
            return NULL;
        }
        int failed = result != Py_None && extend_outputs(out, result) < 0;
        Py_DECREF(result);
        if (failed) {
            return NULL;
        }
        if (PyList_GET_SIZE(cleaners)) {
            PyObject *cleaned = PyObject_CallNoArgs(on_record);
            if (cleaned == NULL) {
                return NULL;
            }
            Py_DECREF(cleaned);
        }
    }
    PyObject *extra = PyIter_Next(values);
    if (extra != NULL) {
        Py_DECREF(extra);
        PyErr_SetString(PyExc_ValueError, "process_keyed: more values than keys");
        return NULL;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMemberDef keycell_members[] = {
    {"key_bytes", T_OBJECT_EX, offsetof(KeyCell, key_bytes), 0,
     "The current key's prefixed bytes (2-byte key group + canonical key bytes)."},
    {"key", T_OBJECT, offsetof(KeyCell, key), 0, "The current key (None without one)."},
    {"key_group", T_INT, offsetof(KeyCell, key_group), 0,
     "The current key's group (-1 without one)."},
    {"max_parallelism", T_INT, offsetof(KeyCell, max_parallelism), 0,
     "The number of key groups."},
    {"_kg_start", T_INT, offsetof(KeyCell, kg_start), 0,
     "First key group of this subtask's range."},
    {"_kg_end", T_INT, offsetof(KeyCell, kg_end), 0, "Last key group of this subtask's range."},
    {NULL},
};

static PyMethodDef keycell_methods[] = {
    {"set_current_key", (PyCFunction)keycell_set_current_key, METH_O,
     "Make key current; raises KeyGroupError if another subtask owns it."},
    {"prefixed_keys", (PyCFunction)keycell_prefixed_keys, METH_O,
     "The prefixed keys of a list of keys, each checked as set_current_key checks it."},
    {NULL},
};

PyTypeObject KeyCellType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "weir.state._hashcore.KeyCell",
    .tp_doc = "The current key where C code reads it directly (KeyContext's base).",
    .tp_basicsize = sizeof(KeyCell),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = keycell_new,
    .tp_traverse = (traverseproc)keycell_traverse,
    .tp_clear = (inquiry)keycell_clear,
    .tp_dealloc = (destructor)keycell_dealloc,
    .tp_members = keycell_members,
    .tp_methods = keycell_methods,
};

/* ----------------------------------------------------------------- routes */

/* route_keys(keys: list, max_parallelism: int, parallelism: int, table: tuple[int])
 * -> (routes: bytearray, slow: list[int]).
 *
 * routes holds one native int32 per key: table[group * parallelism // max_parallelism]
 * for a str or int key; slow lists the positions of every other key (their routes are
 * 0: the caller computes them in Python). */
PyObject *
weir_route_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_Check(args[0]) || !PyLong_Check(args[1])
        || !PyLong_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "route_keys(keys: list, max_parallelism: int, parallelism: int, "
                        "table: tuple)");
        return NULL;
    }
    PyObject *keys = args[0], *table = args[3];
    long maxp = PyLong_AsLong(args[1]);
    long p = PyLong_AsLong(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (maxp <= 0 || maxp > 32768 || p <= 0 || p > maxp || PyTuple_GET_SIZE(table) != p) {
        PyErr_SetString(PyExc_ValueError,
                        "route_keys: need 0 < parallelism <= max_parallelism <= 32768 "
                        "and one table entry per subtask");
        return NULL;
    }
    int32_t *routes_of = PyMem_Malloc(sizeof(int32_t) * (size_t)p);
    if (routes_of == NULL) {
        return PyErr_NoMemory();
    }
    for (long i = 0; i < p; i++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(table, i));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(routes_of);
            return NULL;
        }
        routes_of[i] = (int32_t)v;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *routes = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    PyObject *slow = PyList_New(0);
    if (routes == NULL || slow == NULL) {
        goto fail;
    }
    int32_t *out = (int32_t *)PyByteArray_AS_STRING(routes);
    for (Py_ssize_t j = 0; j < n; j++) {
        int group = weir_key_group(PyList_GET_ITEM(keys, j), maxp);
        if (group < 0) {
            out[j] = 0;
            PyObject *at = PyLong_FromSsize_t(j);
            int failed = at == NULL || PyList_Append(slow, at) < 0;
            Py_XDECREF(at);
            if (failed) {
                goto fail;
            }
            continue;
        }
        out[j] = routes_of[(long long)group * p / maxp];
    }
    PyMem_Free(routes_of);
    PyObject *result = PyTuple_Pack(2, routes, slow);
    Py_DECREF(routes);
    Py_DECREF(slow);
    return result;
fail:
    PyMem_Free(routes_of);
    Py_XDECREF(routes);
    Py_XDECREF(slow);
    return NULL;
}

/* int64_range(start: int, count: int) -> bytearray: count native int64s start,
 * start + 1, ... (an Arrow int64 column's buffer). */
PyObject *
weir_int64_range(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "int64_range(start: int, count: int)");
        return NULL;
    }
    long long start = PyLong_AsLongLong(args[0]);
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0 || count > PY_SSIZE_T_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "int64_range: count out of range");
        return NULL;
    }
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * 8);
    if (out == NULL) {
        return NULL;
    }
    int64_t *p = (int64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        p[i] = (int64_t)(start + i);
    }
    return out;
}

/* tuple_columns(rows: list, width: int) -> list of width lists, the i-th holding each
 * row's i-th item, when every row is a tuple of exactly width items; else None (the
 * caller's checked path says what does not fit). Transposes a function's output rows
 * for Arrow in one pass, without an iterator or a type scan per row. */
PyObject *
weir_tuple_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "tuple_columns(rows: list, width: int)");
        return NULL;
    }
    PyObject *rows = args[0];
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows);
    if (width < 0) {
        Py_RETURN_NONE;
    }
    PyObject *columns = PyList_New(width);
    if (columns == NULL) {
        return NULL;
    }
    for (Py_ssize_t j = 0; j < width; j++) {
        PyObject *column = PyList_New(n);
        if (column == NULL) {
            Py_DECREF(columns);
            return NULL;
        }
        PyList_SET_ITEM(columns, j, column);
    }
    /* each row checked as it is read (nothing below allocates or runs Python code,
     * so rows cannot change in between); a list's unset items are NULL, which its
     * deallocation skips */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != width) {
            Py_DECREF(columns);
            Py_RETURN_NONE;
        }
        for (Py_ssize_t j = 0; j < width; j++) {
            PyList_SET_ITEM(PyList_GET_ITEM(columns, j), i,
                            Py_NewRef(PyTuple_GET_ITEM(row, j)));
        }
    }
    return columns;
}

/* spark_hash_int(value, seed) / spark_hash_long(value, seed): Spark's hashInt and
 * hashLong of the value's low 32 / 64 bits (two's complement), as an unsigned int. */
static int
weir_hash_args(PyObject *const *args, Py_ssize_t nargs, const char *usage,
               unsigned long long *value, uint32_t *seed)
{
    if (nargs != 2 || !PyLong_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    *value = PyLong_AsUnsignedLongLongMask(args[0]);
    *seed = (uint32_t)PyLong_AsUnsignedLongMask(args[1]);
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *
weir_py_spark_hash_int(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long value;
    uint32_t seed;
    if (weir_hash_args(args, nargs, "spark_hash_int(value: int, seed: int)", &value, &seed)) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(weir_spark_hash_int((uint32_t)value, seed));
}

PyObject *
weir_py_spark_hash_long(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long value;
    uint32_t seed;
    if (weir_hash_args(args, nargs, "spark_hash_long(value: int, seed: int)", &value, &seed)) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(weir_spark_hash_long((uint64_t)value, seed));
}

/* spark_hash_bytes(data, seed): Spark's hashUnsafeBytes of a bytes object. */
PyObject *
weir_py_spark_hash_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "spark_hash_bytes(data: bytes, seed: int)");
        return NULL;
    }
    uint32_t seed = (uint32_t)PyLong_AsUnsignedLongMask(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromUnsignedLong(weir_spark_hash_bytes(
        (const uint8_t *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), seed));
}

/* The key hash of None, an exact str, an int in int64 or an exact tuple of those, in
 * *out; 0 for any other key (and lone surrogates), which Python hashes. */
static int
weir_common_key_hash(PyObject *key, uint32_t seed, uint32_t *out)
{
    if (key == Py_None) {
        *out = seed;
        return 1;
    }
    if (PyUnicode_CheckExact(key)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(key, &n);
        if (utf8 == NULL) {
            PyErr_Clear();
            return 0;
        }
        *out = weir_spark_hash_bytes((const uint8_t *)utf8, n, seed);
        return 1;
    }
    if (PyLong_CheckExact(key)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *out = weir_spark_hash_long((uint64_t)v, seed);
        return 1;
    }
    if (PyTuple_CheckExact(key)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(key); i++) {
            if (!weir_common_key_hash(PyTuple_GET_ITEM(key, i), seed, &seed)) {
                return 0;
            }
        }
        *out = seed;
        return 1;
    }
    return 0;
}

/* common_key_hash(key, seed) -> int | None: weir.state.keyhash's key hash of the
 * common keys (None, str, int64, tuples of them); None for the others. */
PyObject *
weir_py_common_key_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "common_key_hash(key, seed: int)");
        return NULL;
    }
    uint32_t seed = (uint32_t)PyLong_AsUnsignedLongMask(args[1]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    uint32_t hash;
    if (!weir_common_key_hash(args[0], seed, &hash)) {
        Py_RETURN_NONE;
    }
    return PyLong_FromUnsignedLong(hash);
}
