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

/* sorted_writes(entries): a dict of bytes keys to bytes (a put) or None (a delete), as
 * (put keys, their values, deleted keys), three lists each in the byte order of the
 * keys (RocksDB's default comparator): the write batch is built from them by map()
 * over the batch's put and delete, no Python loop per entry. A write batch in key order
 * inserts into the memtable's skip list with warm caches, and its flush is cheaper
 * too: a batch of 71,000 dirty entries in random order took 44 ms to write and 25 ms
 * to flush, sorted 7 ms and 15 ms. Python's sorted() of the keys alone costs 31-70 ms
 * and qsort 11 ms; this is an MSD radix sort, eight bytes at a time (each window
 * sorted LSD, a byte a pass), about 5 ms, with short runs insertion-sorted. */
typedef struct {
    uint64_t window; /* eight of the key's bytes, big-endian, zero-padded */
    Py_ssize_t index; /* into pairs */
} SortItem;

typedef struct {
    PyObject **pairs;      /* key, value, key, value, ... in the dict's order */
    SortItem *tmp;         /* scratch, as long as the items */
    Py_ssize_t *counts;    /* scratch, 8 x 256 */
} SortScratch;

/* x's key before y's (bytes order: a proper prefix comes first). */
static int
key_less(PyObject *x, PyObject *y)
{
    Py_ssize_t lx = PyBytes_GET_SIZE(x), ly = PyBytes_GET_SIZE(y);
    int c = memcmp(PyBytes_AS_STRING(x), PyBytes_AS_STRING(y), (size_t)(lx < ly ? lx : ly));
    return c < 0 || (c == 0 && lx < ly);
}

/* The pairs of the items qsort sorts now (the GIL is held throughout). */
static PyObject **qsort_pairs;

static int
compare_keys(const void *a, const void *b)
{
    PyObject *x = qsort_pairs[2 * ((const SortItem *)a)->index];
    PyObject *y = qsort_pairs[2 * ((const SortItem *)b)->index];
    return key_less(x, y) ? -1 : key_less(y, x) ? 1 : 0;
}

/* Sort items (whose keys agree on their first `offset` bytes) by key. */
static void
sort_keys(SortItem *items, Py_ssize_t n, Py_ssize_t offset, SortScratch *s)
{
    if (n <= 16) {
        for (Py_ssize_t j = 1; j < n; j++) {
            SortItem x = items[j];
            Py_ssize_t k = j;
            while (k > 0 && key_less(s->pairs[2 * x.index], s->pairs[2 * items[k - 1].index])) {
                items[k] = items[k - 1];
                k--;
            }
            items[k] = x;
        }
        return;
    }
    Py_ssize_t longest = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = s->pairs[2 * items[i].index];
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(key);
        Py_ssize_t len = PyBytes_GET_SIZE(key);
        longest = len > longest ? len : longest;
        uint64_t window = 0;
        for (Py_ssize_t j = offset; j < offset + 8; j++) {
            window = (window << 8) | (j < len ? data[j] : 0);
        }
        items[i].window = window;
    }
    if (longest <= offset) {  /* keys equal but for trailing zero bytes: by length */
        qsort_pairs = s->pairs;
        qsort(items, (size_t)n, sizeof(SortItem), compare_keys);
        return;
    }
    Py_ssize_t (*counts)[256] = (Py_ssize_t (*)[256])s->counts;
    memset(counts, 0, sizeof(Py_ssize_t) * 8 * 256);
    for (Py_ssize_t i = 0; i < n; i++) {
        for (int d = 0; d < 8; d++) {
            counts[d][(items[i].window >> (8 * d)) & 255]++;
        }
    }
    SortItem *src = items, *dst = s->tmp;
    for (int d = 0; d < 8; d++) {
        if (counts[d][(items[0].window >> (8 * d)) & 255] == n) {
            continue;  /* every key has this byte */
        }
        Py_ssize_t sum = 0;
        for (int b = 0; b < 256; b++) {
            Py_ssize_t c = counts[d][b];
            counts[d][b] = sum;
            sum += c;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            dst[counts[d][(src[i].window >> (8 * d)) & 255]++] = src[i];
        }
        SortItem *t = src;
        src = dst;
        dst = t;
    }
    if (src != items) {
        memcpy(items, src, sizeof(SortItem) * (size_t)n);
    }
    /* Runs of equal windows: sorted by the next window (the recursion ends when no
     * key of a run goes on past the window). */
    for (Py_ssize_t run = 0; run < n;) {
        Py_ssize_t stop = run + 1;
        while (stop < n && items[stop].window == items[run].window) {
            stop++;
        }
        if (stop - run > 1) {
            sort_keys(items + run, stop - run, stop - run > 16 ? offset + 8 : offset, s);
        }
        run = stop;
    }
}

PyObject *
weir_sorted_writes(PyObject *module, PyObject *entries)
{
    if (!PyDict_CheckExact(entries)) {
        PyErr_SetString(PyExc_TypeError, "sorted_writes() needs a dict");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(entries);
    size_t size = (size_t)(n ? n : 1);
    SortItem *items = PyMem_Malloc(sizeof(SortItem) * size * 2);
    PyObject **pairs = PyMem_Malloc(sizeof(PyObject *) * size * 2);
    Py_ssize_t *counts = PyMem_Malloc(sizeof(Py_ssize_t) * 8 * 256);
    PyObject *keys = PyList_New(0), *values = PyList_New(0), *deleted = PyList_New(0);
    PyObject *out = NULL;
    if (items == NULL || pairs == NULL || counts == NULL || keys == NULL || values == NULL
        || deleted == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    Py_ssize_t pos = 0, i = 0;
    PyObject *key, *value;
    while (PyDict_Next(entries, &pos, &key, &value)) {
        if (!PyBytes_CheckExact(key)) {
            PyErr_Format(PyExc_TypeError, "sorted_writes(): a key is %.100s, not bytes",
                         Py_TYPE(key)->tp_name);
            goto done;
        }
        items[i].index = i;
        pairs[2 * i] = key;
        pairs[2 * i + 1] = value;
        i++;
    }
    SortScratch scratch = {pairs, items + n, counts};
    sort_keys(items, n, 0, &scratch);
    for (i = 0; i < n; i++) {
        PyObject *k = pairs[2 * items[i].index], *v = pairs[2 * items[i].index + 1];
        if (v == Py_None ? PyList_Append(deleted, k) < 0
                         : (PyList_Append(keys, k) < 0 || PyList_Append(values, v) < 0)) {
            goto done;
        }
    }
    out = PyTuple_Pack(3, keys, values, deleted);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(deleted);
    PyMem_Free(items);
    PyMem_Free(pairs);
    PyMem_Free(counts);
    return out;
}

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
