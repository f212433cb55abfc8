/* weir.state._hashcore.RocksPointCore / RocksValueCore: the per-call fast path of a RocksDB value
 * state's entry cache (weir/state/rocksdb_tables.py).
 *
 * The RocksDB backend's value table reads and writes through a dict of stored bytes
 * (the entry cache) and records each write in a second dict: the dirty entries, or,
 * while changelog changes are tracked, the change record (_written). In Python each
 * of value() and update() costs a frame and a dozen bytecodes around two dict calls
 * and the serializer's call; here they cost the dict calls and the serializer's.
 *
 * Only the common case is handled, and everything else calls the table's Python
 * method of the same name prefixed with "_slow_" (which holds the whole semantics:
 * no current key, a key not in the cache, None, a serializer that raises). The fast
 * case is exactly:
 *   - the key context is a KeyCell whose key_bytes is a bytes object, and
 *   - the table's _cache is a dict holding the current key, and
 *   - for update, the value is not None, the serializer's encode (_fast_encode)
 *     returns without an exception, and _written is a dict (changes tracked) or
 *     _dirty is (not tracked).
 * value() decodes the cached bytes with _fast_decode (a cached None: no entry).
 * With _fast_scalars set (the default MsgpackSerializer, which the Python side checks)
 * a value that is one msgpack scalar is decoded here, and an int (of int64 or uint64
 * range) or a float is encoded here, to the bytes msgpack's Packer gives; any other
 * value goes through _fast_decode / _fast_encode.
 * Eviction, flushes, RocksDB reads and the cache's completeness are all Python's.
 */
#include "_hashcore.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *ctx;     /* the key context (fast path only when a KeyCell) */
    PyObject *cache;   /* prefixed key -> stored bytes (None: absent) */
    PyObject *dirty;   /* prefixed key -> bytes written since the last flush */
    PyObject *written; /* the change record (a dict) while tracked, else None */
    PyObject *encode;  /* the serializer's encode */
    PyObject *decode;  /* the serializer's decode */
    char scalars;      /* msgpack scalars decoded, ints and floats encoded in C */
} PointCore;

static PyObject *str_slow_value, *str_slow_update;

static int
point_traverse(PointCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ctx);
    Py_VISIT(self->cache);
    Py_VISIT(self->dirty);
    Py_VISIT(self->written);
    Py_VISIT(self->encode);
    Py_VISIT(self->decode);
    return 0;
}

static int
point_clear(PointCore *self)
{
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->dirty);
    Py_CLEAR(self->written);
    Py_CLEAR(self->encode);
    Py_CLEAR(self->decode);
    return 0;
}

static void
point_dealloc(PointCore *self)
{
    PyObject_GC_UnTrack(self);
    point_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* T_OBJECT_EX: CPython specializes attribute access from Python code only for these
 * (the Python side of the table reads these fields on every call it makes). */
static PyMemberDef point_members[] = {
    {"_ctx", T_OBJECT_EX, offsetof(PointCore, ctx), 0, "The key context."},
    {"_cache", T_OBJECT_EX, offsetof(PointCore, cache), 0, "The entry cache."},
    {"_dirty", T_OBJECT_EX, offsetof(PointCore, dirty), 0, "Entries not flushed yet."},
    {"_written", T_OBJECT_EX, offsetof(PointCore, written), 0,
     "The change record while changes are tracked, else None."},
    {"_fast_encode", T_OBJECT_EX, offsetof(PointCore, encode), 0, "The serializer's encode."},
    {"_fast_decode", T_OBJECT_EX, offsetof(PointCore, decode), 0, "The serializer's decode."},
    {"_fast_scalars", T_BOOL, offsetof(PointCore, scalars), 0,
     "Whether msgpack scalars are decoded, ints and floats encoded, in C."},
    {NULL},
};

/* The current prefixed key (borrowed), or NULL when the fast path does not apply. */
static inline PyObject *
point_key(PointCore *self)
{
    PyObject *ctx = self->ctx;
    if (ctx == NULL || !(Py_TYPE(ctx)->tp_base == &KeyCellType  /* KeyContext */
                         || PyObject_TypeCheck(ctx, &KeyCellType))) {
        return NULL;
    }
    PyObject *key = ((KeyCell *)ctx)->key_bytes;
    if (key == NULL || !PyBytes_CheckExact(key) || self->cache == NULL
        || !PyDict_CheckExact(self->cache)) {
        return NULL;
    }
    return key;
}

/* NULL with an Exception (not BaseException) cleared: the slow path redoes the call
 * and raises its own, checked error. Else the pending error stays (returns 0). */
static inline int
cleared_exception(void)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

/* ``n`` as msgpack's Packer packs it (bytes, new reference); NULL without an error
 * for anything but an exact int of int64 or uint64 range or an exact float. The
 * int's format is msgpack's (pack_template.h): a fixint if it fits, else the smallest
 * of uint 8..64 (non-negative) or int 8..64 (negative), big-endian. */
static PyObject *
pack_number(PyObject *n)
{
    unsigned char b[9];
    unsigned long long bits;  /* the payload, two's complement for a negative int */
    int width;                /* payload bytes after the tag b[0] */
    if (PyFloat_CheckExact(n)) {
        b[0] = 0xcb;  /* float 64: use_single_float=False packs every float so */
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(n), (char *)b + 1, 0) < 0) {
            return NULL;
        }
        return PyBytes_FromStringAndSize((const char *)b, 9);
    }
    if (!PyLong_CheckExact(n)) {
        return NULL;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (overflow > 0) {  /* above int64: uint64 */
        bits = PyLong_AsUnsignedLongLong(n);
        if (bits == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();  /* out of range: Python's encode says so */
            return NULL;
        }
        b[0] = 0xcf;
        width = 8;
    }
    else if (overflow < 0 || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return NULL;
    }
    else if (v >= -32 && v < 128) {  /* positive or negative fixint */
        b[0] = (unsigned char)(signed char)v;
        return PyBytes_FromStringAndSize((const char *)b, 1);
    }
    else if (v < 0) {
        bits = (unsigned long long)v;
        width = v >= -128 ? 1 : v >= -32768 ? 2 : v >= -2147483648LL ? 4 : 8;
        b[0] = width == 1 ? 0xd0 : width == 2 ? 0xd1 : width == 4 ? 0xd2 : 0xd3;
    }
    else {
        bits = (unsigned long long)v;
        width = bits < (1ULL << 8) ? 1 : bits < (1ULL << 16) ? 2 : bits < (1ULL << 32) ? 4 : 8;
        b[0] = width == 1 ? 0xcc : width == 2 ? 0xcd : width == 4 ? 0xce : 0xcf;
    }
    for (int i = width; i >= 1; i--, bits >>= 8) {
        b[i] = (unsigned char)bits;
    }
    return PyBytes_FromStringAndSize((const char *)b, 1 + width);
}

static PyObject *
point_value(PointCore *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *key = point_key(self);
    if (key == NULL || self->decode == NULL) {
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_value);
    }
    PyObject *data = PyDict_GetItemWithError(self->cache, key);
    if (data == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_value);
    }
    if (data == Py_None) {
        Py_RETURN_NONE;
    }
    if (self->scalars && PyBytes_CheckExact(data)) {
        PyObject *scalar = weir_msgpack_scalar((const unsigned char *)PyBytes_AS_STRING(data),
                                               PyBytes_GET_SIZE(data));
        if (scalar != NULL || PyErr_Occurred()) {
            return scalar;
        }
    }
    Py_INCREF(data);  /* the decoder is Python code: the cache may change under it */
    PyObject *value = PyObject_CallOneArg(self->decode, data);
    Py_DECREF(data);
    if (value == NULL && cleared_exception()) {
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_value);
    }
    return value;
}

static PyObject *
point_update(PointCore *self, PyObject *value)
{
    PyObject *key = point_key(self);
    if (key == NULL || value == Py_None || self->encode == NULL) {
        return PyObject_CallMethodOneArg((PyObject *)self, str_slow_update, value);
    }
    int cached = PyDict_Contains(self->cache, key);
    if (cached <= 0) {  /* not cached (an eviction to consider): Python's */
        return cached < 0 ? NULL
                          : PyObject_CallMethodOneArg((PyObject *)self, str_slow_update, value);
    }
    Py_INCREF(key);  /* the encoder is Python code: it may change the current key */
    PyObject *data = self->scalars ? pack_number(value) : NULL;
    if (data == NULL && !PyErr_Occurred()) {
        data = PyObject_CallOneArg(self->encode, value);
    }
    PyObject *result = NULL;
    if (data == NULL) {
        if (cleared_exception()) {
            result = PyObject_CallMethodOneArg((PyObject *)self, str_slow_update, value);
        }
        Py_DECREF(key);
        return result;
    }
    PyObject *record = self->written != NULL && PyDict_CheckExact(self->written)
                           ? self->written : self->dirty;
    if (record == NULL || !PyDict_CheckExact(record) || self->cache == NULL
        || !PyDict_CheckExact(self->cache)) {  /* (fields the encoder may have replaced) */
        result = PyObject_CallMethodOneArg((PyObject *)self, str_slow_update, value);
    }
    else if (PyDict_SetItem(self->cache, key, data) == 0
             && PyDict_SetItem(record, key, data) == 0) {
        result = Py_NewRef(Py_None);
    }
    Py_DECREF(data);
    Py_DECREF(key);
    return result;
}

static PyMethodDef point_methods[] = {
    {"value", (PyCFunction)point_value, METH_NOARGS, "The current key's value, or None."},
    {"update", (PyCFunction)point_update, METH_O, "Set the current key's value."},
    {NULL},
};

/* A type with PointCore's layout: RocksPointCore (the fields) and RocksValueCore. */
#define POINT_TYPE(NAME, DOC, ...)                                                \
    {                                                                             \
        PyVarObject_HEAD_INIT(NULL, 0)                                            \
        .tp_name = "weir.state._hashcore." NAME,                                  \
        .tp_doc = DOC,                                                            \
        .tp_basicsize = sizeof(PointCore),                                        \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, \
        .tp_new = PyType_GenericNew,                                              \
        .tp_traverse = (traverseproc)point_traverse,                              \
        .tp_clear = (inquiry)point_clear,                                         \
        .tp_dealloc = (destructor)point_dealloc,                                  \
        __VA_ARGS__                                                               \
    }

PyTypeObject RocksPointCoreType = POINT_TYPE(
    "RocksPointCore", "Fields of a RocksDB value or list state's entry cache.",
    .tp_members = point_members);

PyTypeObject RocksValueCoreType = POINT_TYPE(
    "RocksValueCore", "The C fast path of a RocksDB value state's entry cache.",
    .tp_methods = point_methods);

int
weir_rockscore_init(void)
{
    RocksValueCoreType.tp_base = &RocksPointCoreType;
    if ((str_slow_value = PyUnicode_InternFromString("_slow_value")) == NULL
        || (str_slow_update = PyUnicode_InternFromString("_slow_update")) == NULL) {
        return -1;
    }
    return 0;
}
