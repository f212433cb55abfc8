/* The hot loop of a full snapshot (weir.state.packed.pack_sources): each canonical
 * entry (prefixed key, encoded value) of one state appended to its key group's buffer
 * as two msgpack bin objects — the bytes msgpack.Packer(use_bin_type=True).pack(key)
 * and .pack(value) write (bin 8 / 16 / 32 by length) — grouped by the key's first two
 * bytes (its key group), in the order met. Keys and values: any bytes-like object. */
#include "_hashcore.h"

#define GROUPS 65536

/* The msgpack bin header of n bytes into head; its length (-1: too large, error set). */
static Py_ssize_t
bin_head(unsigned char *head, Py_ssize_t n)
{
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
    return h;
}

static int
append_bin(PyObject *buf, const char *data, Py_ssize_t n)
{
    unsigned char head[5];
    Py_ssize_t h = bin_head(head, n);
    if (h < 0) {
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

/* append_bin of a key, then of a value given in two parts (value, then rest): one
 * resize of the buffer. */
static int
append_pair2(PyObject *buf, const char *key, Py_ssize_t kn, const char *value,
             Py_ssize_t vn, const char *rest, Py_ssize_t rn)
{
    unsigned char khead[5], vhead[5];
    Py_ssize_t kh = bin_head(khead, kn), vh = kh < 0 ? -1 : bin_head(vhead, vn + rn);
    if (vh < 0) {
        return -1;
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, old + kh + kn + vh + vn + rn) < 0) {
        return -1;
    }
    char *p = PyByteArray_AS_STRING(buf) + old;
    memcpy(p, khead, (size_t)kh);
    memcpy(p + kh, key, (size_t)kn);
    memcpy(p + kh + kn, vhead, (size_t)vh);
    memcpy(p + kh + kn + vh, value, (size_t)vn);
    if (rn > 0) {
        memcpy(p + kh + kn + vh + vn, rest, (size_t)rn);
    }
    return 0;
}

static int
append_pair(PyObject *buf, const char *key, Py_ssize_t kn, const char *value,
            Py_ssize_t vn)
{
    return append_pair2(buf, key, kn, value, vn, NULL, 0);
}

/* n big-endian bytes of u after the type byte t into out; the length written. */
static Py_ssize_t
put_be(unsigned char *out, unsigned char t, unsigned long long u, int n)
{
    out[0] = t;
    for (int i = n; i >= 1; i--) {
        out[i] = (unsigned char)u;
        u >>= 8;
    }
    return n + 1;
}

/* The msgpack bytes weir's MsgpackSerializer writes for a value of an exact type
 * None, bool, int (-2**63 .. 2**64 - 1), float, str or bytes (msgpack-python's
 * Packer(use_bin_type=True, strict_types=True): the smallest int format, floats as
 * float 64, str as fixstr / str 8 / 16 / 32 of its UTF-8, bytes as bin 8 / 16 / 32):
 * the head into out (at most 9 bytes) and its length returned; a str's or bytes'
 * body in *body / *bn (else *bn is 0). 0: not such a value (another type, an int
 * out of range, a str without UTF-8), nothing set: the caller encodes it in Python. */
static Py_ssize_t
msgpack_scalar(PyObject *v, unsigned char *out, const char **body, Py_ssize_t *bn)
{
    *bn = 0;
    if (v == Py_None) {
        out[0] = 0xc0;
        return 1;
    }
    if (v == Py_True || v == Py_False) {
        out[0] = v == Py_True ? 0xc3 : 0xc2;
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long d = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (d == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (overflow != 0 || d > 0) {
            if (overflow < 0) {
                return 0;
            }
            unsigned long long u = overflow ? PyLong_AsUnsignedLongLong(v)
                                            : (unsigned long long)d;
            if (u == (unsigned long long)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (u < 128) {
                out[0] = (unsigned char)u;
                return 1;
            }
            return u < 256 ? put_be(out, 0xcc, u, 1)
                 : u < 65536 ? put_be(out, 0xcd, u, 2)
                 : u < 4294967296ULL ? put_be(out, 0xce, u, 4)
                 : put_be(out, 0xcf, u, 8);
        }
        if (d >= -32) {
            out[0] = (unsigned char)(d & 0xff);  /* 0, or a negative fixint */
            return 1;
        }
        unsigned long long u = (unsigned long long)d;
        return d >= -128 ? put_be(out, 0xd0, u, 1)
             : d >= -32768 ? put_be(out, 0xd1, u, 2)
             : d >= -2147483648LL ? put_be(out, 0xd2, u, 4)
             : put_be(out, 0xd3, u, 8);
    }
    if (PyFloat_CheckExact(v)) {
        out[0] = 0xcb;
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(v), (char *)out + 1, 0) < 0) {
            PyErr_Clear();
            return 0;
        }
        return 9;
    }
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
        if (utf8 == NULL) {  /* lone surrogates: Python raises the serializer's error */
            PyErr_Clear();
            return 0;
        }
        if (n > 0xffffffffLL) {
            return 0;
        }
        *body = utf8;
        *bn = n;
        if (n < 32) {
            out[0] = (unsigned char)(0xa0 | n);
            return 1;
        }
        return n < 256 ? put_be(out, 0xd9, (unsigned long long)n, 1)
             : n < 65536 ? put_be(out, 0xda, (unsigned long long)n, 2)
             : put_be(out, 0xdb, (unsigned long long)n, 4);
    }
    if (PyBytes_CheckExact(v)) {
        Py_ssize_t n = PyBytes_GET_SIZE(v);
        if (n > 0xffffffffLL) {
            return 0;
        }
        *body = PyBytes_AS_STRING(v);
        *bn = n;
        return n < 256 ? put_be(out, 0xc4, (unsigned long long)n, 1)
             : n < 65536 ? put_be(out, 0xc5, (unsigned long long)n, 2)
             : put_be(out, 0xc6, (unsigned long long)n, 4);
    }
    return 0;
}

/* The buffers of the key groups met so far, in pages of 256 groups allocated when a
 * group of theirs is first met (a call costs what its entries cost, not a table of
 * every possible group): per group a buffer and its count, and for pack_changes a
 * second pair. Zero-initialize (`Table t = {{NULL}};`); release() frees it. */
typedef struct {
    PyObject *buf, *buf2;
    Py_ssize_t count, count2;
} Slot;

#define PAGE 256

typedef struct {
    Slot *pages[GROUPS / PAGE];
} Table;

/* The slot of group g, its buffer(s) created (NULL: the error set). */
static Slot *
slot_of(Table *t, int g, int pairs)
{
    Slot *page = t->pages[g / PAGE];
    if (page == NULL) {
        page = PyMem_Calloc(PAGE, sizeof(Slot));
        if (page == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        t->pages[g / PAGE] = page;
    }
    Slot *slot = &page[g % PAGE];
    if (slot->buf == NULL && (slot->buf = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) {
        return NULL;
    }
    if (pairs == 2 && slot->buf2 == NULL
        && (slot->buf2 = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) {
        return NULL;
    }
    return slot;
}

/* {group: (buffer, count)} of every group met, or with pairs == 2 {group: (buffer,
 * count, buffer2, count2)} (NULL: the error set). */
static PyObject *
collect(Table *t, int pairs)
{
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    for (int p = 0; p < GROUPS / PAGE; p++) {
        if (t->pages[p] == NULL) {
            continue;
        }
        for (int i = 0; i < PAGE; i++) {
            Slot *s = &t->pages[p][i];
            if (s->buf == NULL) {
                continue;
            }
            PyObject *value = pairs == 2
                ? Py_BuildValue("(OnOn)", s->buf, s->count, s->buf2, s->count2)
                : Py_BuildValue("(On)", s->buf, s->count);
            PyObject *group = value == NULL ? NULL : PyLong_FromLong(p * PAGE + i);
            int failed = group == NULL || PyDict_SetItem(out, group, value) < 0;
            Py_XDECREF(value);
            Py_XDECREF(group);
            if (failed) {
                Py_DECREF(out);
                return NULL;
            }
        }
    }
    return out;
}

static void
release(Table *t)
{
    for (int p = 0; p < GROUPS / PAGE; p++) {
        if (t->pages[p] == NULL) {
            continue;
        }
        for (int i = 0; i < PAGE; i++) {
            Py_XDECREF(t->pages[p][i].buf);
            Py_XDECREF(t->pages[p][i].buf2);
        }
        PyMem_Free(t->pages[p]);
        t->pages[p] = NULL;
    }
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
    Table table = {{NULL}};
    PyObject *out = NULL, *item;
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
        Slot *slot = failed ? NULL : slot_of(&table, group, 1);
        failed = slot == NULL
                 || append_pair(slot->buf, key.buf, key.len, value.buf, value.len) < 0;
        PyBuffer_Release(&key);
        PyBuffer_Release(&value);
        Py_DECREF(item);
        if (failed) {
            goto done;
        }
        slot->count++;
    }
    if (!PyErr_Occurred()) {
        out = collect(&table, 1);
    }
done:
    Py_DECREF(it);
    release(&table);
    return out;
}

/* The hot loop of a hash-map full snapshot of a state whose serializer C can encode (weir.state.backend.EncodedValues): up to `limit` entries of a dict of prefixed
 * key -> Python int (kind 0: IntSerializer, big-endian int64), int / float (kind 1:
 * FloatSerializer, big-endian IEEE double) or msgpack scalar (kind 2: MsgpackSerializer
 * of None, bool, int, float, str, bytes; msgpack_scalar) from dict position `pos`, packed as
 * pack_entries packs their encoded (key, value) — the same bytes, no bytes object or
 * tuple per entry. Returns (groups, the next position or -1 at the end). A value of
 * another type, or an int beyond 64 bits, raises TypeError: the caller encodes the
 * state the general way, which names the value. */
PyObject *
weir_pack_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyLong_Check(args[1])
        || !PyLong_Check(args[2]) || !PyLong_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "pack_fixed(values: dict, kind, pos, limit)");
        return NULL;
    }
    long kind = PyLong_AsLong(args[1]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (kind < 0 || kind > 2 || pos < 0 || limit < 1) {
        PyErr_SetString(PyExc_ValueError, "pack_fixed: kind 0, 1 or 2, pos >= 0, limit >= 1");
        return NULL;
    }
    Table table = {{NULL}};
    PyObject *out = NULL, *groups = NULL, *key, *value;
    Py_ssize_t n = 0;
    int more = 0;
    while (PyDict_Next(args[0], &pos, &key, &value)) {
        if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) < 2) {
            PyErr_SetString(PyExc_TypeError, "pack_fixed: keys must be bytes with their "
                                             "key group");
            goto done;
        }
        unsigned char data[9];
        const char *body = NULL;
        Py_ssize_t dn = 8, bn = 0;
        if (kind == 2) {
            dn = msgpack_scalar(value, data, &body, &bn);
            if (dn == 0) {
                PyErr_SetString(PyExc_TypeError, "pack_fixed: not a msgpack scalar");
                goto done;
            }
        }
        else if (kind == 0) {
            if (!PyLong_Check(value)) {
                PyErr_SetString(PyExc_TypeError, "pack_fixed: not an int");
                goto done;
            }
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) {
                goto done;
            }
            unsigned long long u = (unsigned long long)v;
            for (int i = 7; i >= 0; i--) {
                data[i] = (unsigned char)u;
                u >>= 8;
            }
        }
        else {
            if (!PyFloat_CheckExact(value) && !PyLong_Check(value)) {
                PyErr_SetString(PyExc_TypeError, "pack_fixed: not a float or an int");
                goto done;
            }
            double d = PyFloat_AsDouble(value);
            if (d == -1.0 && PyErr_Occurred()) {
                goto done;
            }
            if (PyFloat_Pack8(d, (char *)data, 0) < 0) {
                goto done;
            }
        }
        const char *k = PyBytes_AS_STRING(key);
        int group = (((const unsigned char *)k)[0] << 8) | ((const unsigned char *)k)[1];
        Slot *slot = slot_of(&table, group, 1);
        if (slot == NULL
            || append_pair2(slot->buf, k, PyBytes_GET_SIZE(key), (const char *)data, dn,
                            body, bn) < 0) {
            goto done;
        }
        slot->count++;
        if (++n == limit) {
            more = 1;
            break;
        }
    }
    groups = collect(&table, 1);
    if (groups != NULL) {
        out = Py_BuildValue("(Nn)", groups, more ? pos : (Py_ssize_t)-1);
    }
done:
    release(&table);
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
    Table table = {{NULL}};
    PyObject *out = NULL, *key, *value;
    Py_ssize_t pos = 0;
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
        Slot *slot = slot_of(&table, group, 2);
        if (slot == NULL || append_bin(slot->buf, k, kn) < 0) {
            goto done;
        }
        slot->count++;
        if (value != Py_None) {
            if (append_pair(slot->buf2, k, kn, PyBytes_AS_STRING(value),
                            PyBytes_GET_SIZE(value)) < 0) {
                goto done;
            }
            slot->count2++;
        }
    }
    out = collect(&table, 2);
done:
    release(&table);
    return out;
}
