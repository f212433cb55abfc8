/* weir.state._hashcore: the per-call fast path of the hash-map backend's keyed state.
 *
 * A keyed-state call in pure Python costs a Python frame (about 50 ns here) before it
 * does anything; a bare dict call costs about 20 ns. These types give the hash-map
 * tables (weir/state/hashmap.py) C methods for the calls a record makes most:
 * ValueState.value/update, reducing and aggregating add, ListState.get/add,
 * MapState.get/put.
 *
 * Each method handles only the common case and otherwise calls the table's Python
 * method of the same name prefixed with "_slow_" (which holds the whole semantics:
 * errors without a current key, the serializer's write check of a value type not
 * seen yet, None, entries of unexpected shapes). The fast case is exactly:
 *   - the key context is a KeyCell whose key_bytes is a bytes object, and
 *   - the table's _data is a dict, and
 *   - for writes, type(value) is in the table's _ok set (types the write check has
 *     already accepted), for map keys type(user_key) is in _key_ok (a reduced or
 *     aggregated result of another type goes through the table's Python _check,
 *     since the user's function has already run), and
 *   - for map state, the user key is a str (identity: itself) or an int (identity:
 *     (int, key)); other user keys are encoded by Python.
 * A write adds the prefixed key to _dirty when _dirty is a set (changelog tracking),
 * counting it in _writes; with a nonzero _sample_mask only a sample of the keys goes
 * into the set (a share estimate that costs far less than the exact set; which keys
 * changed is then unknown once anything is written); with a nonzero _dirty_limit the
 * exact record turns into that sample once the set holds that many keys (the next
 * snapshot is a full one anyway: see HashMapKeyedStateBackend.track_changes).
 * Nothing here knows serializers, TTL or snapshots. The key context's C base (KeyCell:
 * the current key, set in C for str and int keys) and the route pass's helpers are in
 * _keycell.c, compiled into this module.
 */
#include "_hashcore.h"

#include <structmember.h>

/* ---------------------------------------------------------------- TableCore */

typedef struct {
    PyObject_HEAD
    PyObject *ctx;     /* the key context (fast path only when a KeyCell) */
    PyObject *data;    /* prefixed key -> value / list / {identity: (user_key, value)} */
    PyObject *ok;      /* value types the write check accepted (a set that only grows) */
    PyObject *key_ok;  /* map state: user-key types the key check accepted (idem) */
    PyObject *ok_last;     /* the type last found in ok (owned), or NULL */
    PyObject *key_ok_last; /* the type last found in key_ok (owned), or NULL */
    PyObject *dirty;   /* prefixed keys written since the last snapshot, or None */
    Py_ssize_t writes;      /* writes recorded in dirty's place (every one counted) */
    Py_ssize_t sample_mask; /* 0: every key into dirty; else only keys whose hash
                               has none of these bits (a sample, for a share estimate) */
    Py_ssize_t dirty_limit; /* > 0: at this many keys in dirty, sample_mask becomes
                               WEIR_SAMPLE_MASK (the exact record stops) */
} TableCore;

/* The sample mask of sampled change tracking: 1 key in 16 (hashmap_tables.SAMPLE_MASK). */
#define WEIR_SAMPLE_MASK 15

static PyObject *str_slow_value, *str_slow_update, *str_slow_get, *str_slow_add,
    *str_slow_put, *str_slow_reduce_add, *str_slow_aggregate_add, *str_check;

static int
table_traverse(TableCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ctx);
    Py_VISIT(self->data);
    Py_VISIT(self->ok);
    Py_VISIT(self->key_ok);
    Py_VISIT(self->ok_last);
    Py_VISIT(self->key_ok_last);
    Py_VISIT(self->dirty);
    return 0;
}

static int
table_clear(TableCore *self)
{
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->data);
    Py_CLEAR(self->ok);
    Py_CLEAR(self->key_ok);
    Py_CLEAR(self->ok_last);
    Py_CLEAR(self->key_ok_last);
    Py_CLEAR(self->dirty);
    return 0;
}

static void
table_dealloc(TableCore *self)
{
    PyObject_GC_UnTrack(self);
    table_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* T_OBJECT_EX, not T_OBJECT: CPython specializes attribute access from Python code
 * (LOAD_ATTR_SLOT, STORE_ATTR_SLOT) only for T_OBJECT_EX members; the Python side
 * of the tables reads these fields on every call it makes. */
static PyMemberDef table_members[] = {
    {"_ctx", T_OBJECT_EX, offsetof(TableCore, ctx), 0, "The key context."},
    {"_data", T_OBJECT_EX, offsetof(TableCore, data), 0, "The state's entries."},
    {"_dirty", T_OBJECT_EX, offsetof(TableCore, dirty), 0, "Keys written (or None)."},
    {"_writes", T_PYSSIZET, offsetof(TableCore, writes), 0,
     "Writes since the tracked keys last started over (all keys, sampled or not)."},
    {"_sample_mask", T_PYSSIZET, offsetof(TableCore, sample_mask), 0,
     "0: every written key is tracked; else only those whose hash has none of its bits."},
    {"_dirty_limit", T_PYSSIZET, offsetof(TableCore, dirty_limit), 0,
     "> 0: once _dirty holds this many keys, only a sample is tracked (SAMPLE_MASK)."},
    {NULL},
};

static PyObject *
get_field(PyObject *field)
{
    return Py_NewRef(field != NULL ? field : Py_None);
}

static PyObject *
table_get_ok(TableCore *self, void *Py_UNUSED(closure))
{
    return get_field(self->ok);
}

static int
table_set_ok(TableCore *self, PyObject *value, void *Py_UNUSED(closure))
{
    Py_XINCREF(value);
    Py_XSETREF(self->ok, value);
    Py_CLEAR(self->ok_last);  /* a new set: nothing known accepted yet */
    return 0;
}

static PyObject *
table_get_key_ok(TableCore *self, void *Py_UNUSED(closure))
{
    return get_field(self->key_ok);
}

static int
table_set_key_ok(TableCore *self, PyObject *value, void *Py_UNUSED(closure))
{
    Py_XINCREF(value);
    Py_XSETREF(self->key_ok, value);
    Py_CLEAR(self->key_ok_last);
    return 0;
}

static PyGetSetDef table_getset[] = {
    {"_ok", (getter)table_get_ok, (setter)table_set_ok,
     "Value types already accepted (a set that only grows).", NULL},
    {"_key_ok", (getter)table_get_key_ok, (setter)table_set_key_ok,
     "User-key types already accepted (a set that only grows).", NULL},
    {NULL},
};

/* The current prefixed key (borrowed), or NULL when the fast path does not apply. */
static inline PyObject *
current_key(TableCore *self)
{
    PyObject *ctx = self->ctx;
    if (ctx == NULL || !(Py_TYPE(ctx)->tp_base == &KeyCellType  /* KeyContext */
                         || PyObject_TypeCheck(ctx, &KeyCellType))) {
        return NULL;
    }
    PyObject *key = ((KeyCell *)ctx)->key_bytes;
    if (key == NULL || !PyBytes_CheckExact(key) || self->data == NULL
        || !PyDict_CheckExact(self->data)) {
        return NULL;
    }
    return key;
}

/* 1: type(value) is in the accepted set; 0: not (or no set); -1: error. The type
 * last found is remembered (owned, so its address cannot be reused by another type):
 * the sets only grow, so it stays accepted until the set itself is replaced. */
static inline int
accepted(PyObject *types, PyObject **last, PyObject *value)
{
    PyObject *type = (PyObject *)Py_TYPE(value);
    if (type == *last) {
        return 1;
    }
    if (types == NULL || !PyAnySet_Check(types)) {
        return 0;
    }
    int found = PySet_Contains(types, type);
    if (found == 1) {
        Py_XSETREF(*last, Py_NewRef(type));
    }
    return found;
}

/* A write of key: counted, and key added to the tracked set (all keys, or with a
 * sample mask only those whose hash has none of its bits: a bytes key's hash is
 * cached by the dict store before, so the test costs no hashing); at the table's
 * dirty limit the record turns sampled. The tables' Python methods record their
 * writes through it too (TableCore._mark). */
static inline int
mark_dirty(TableCore *self, PyObject *key)
{
    if (self->dirty != NULL && PySet_Check(self->dirty)) {
        self->writes++;
        if (self->sample_mask != 0) {
            Py_hash_t hash = PyObject_Hash(key);
            if (hash == -1) {
                return -1;
            }
            if ((hash & self->sample_mask) != 0) {
                return 0;
            }
        }
        if (PySet_Add(self->dirty, key) < 0) {
            return -1;
        }
        if (self->dirty_limit > 0 && self->sample_mask == 0
            && PySet_GET_SIZE(self->dirty) >= self->dirty_limit) {
            self->sample_mask = WEIR_SAMPLE_MASK;
        }
    }
    return 0;
}

/* A type with TableCore's layout: TableCore itself and its three subtypes. */
#define TABLE_TYPE(NAME, DOC, ...)                                                \
    {                                                                             \
        PyVarObject_HEAD_INIT(NULL, 0)                                            \
        .tp_name = "weir.state._hashcore." NAME,                                  \
        .tp_doc = DOC,                                                            \
        .tp_basicsize = sizeof(TableCore),                                        \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, \
        .tp_new = PyType_GenericNew,                                              \
        .tp_traverse = (traverseproc)table_traverse,                              \
        .tp_clear = (inquiry)table_clear,                                         \
        .tp_dealloc = (destructor)table_dealloc,                                  \
        __VA_ARGS__                                                               \
    }

/* _mark(key: bytes): mark_dirty of one key (the tables' Python methods' writes:
 * weir/state/hashmap_tables.py). */
static PyObject *
table_mark(TableCore *self, PyObject *key)
{
    if (!PyBytes_CheckExact(key)) {
        PyErr_SetString(PyExc_TypeError, "_mark: a key is bytes");
        return NULL;
    }
    if (mark_dirty(self, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* _mark_many(keys: list[bytes]): mark_dirty of each key in turn (a batch function's
 * writes and deletes: weir/runtime/batch_state.py). */
static PyObject *
table_mark_many(TableCore *self, PyObject *keys)
{
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "_mark_many(keys: list)");
        return NULL;
    }
    if (self->dirty == NULL || !PySet_Check(self->dirty)) {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = Py_NewRef(PyList_GET_ITEM(keys, i));
        PyObject *done = table_mark(self, key);
        Py_DECREF(key);
        if (done == NULL) {
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
}

static PyMethodDef table_methods[] = {
    {"_mark", (PyCFunction)table_mark, METH_O,
     "Record a write of a key when changes are tracked (mark_dirty: counted, the key "
     "tracked, or only sampled; at the dirty limit the record turns sampled)."},
    {"_mark_many", (PyCFunction)table_mark_many, METH_O,
     "Record a write of each of a list of keys, as a single write records its key."},
    {NULL},
};

static PyTypeObject TableCoreType = TABLE_TYPE(
    "TableCore", "Fields shared by the hash-map tables' C fast paths.",
    .tp_members = table_members, .tp_getset = table_getset, .tp_methods = table_methods);

/* The table's Python method ``name`` called with the same arguments. */
static PyObject *
call_slow(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *method = PyObject_GetAttr(self, name);
    if (method == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(method, args, nargs, NULL);
    Py_DECREF(method);
    return result;
}

/* ---------------------------------------------------------------- ValueCore */

static PyObject *
value_value(TableCore *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *key = current_key(self);
    if (key == NULL) {
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_value);
    }
    PyObject *value = PyDict_GetItemWithError(self->data, key);
    if (value == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return Py_NewRef(value);
}

static PyObject *
value_update(TableCore *self, PyObject *value)
{
    PyObject *key = current_key(self);
    int ok = key == NULL ? 0 : accepted(self->ok, &self->ok_last, value);
    if (ok < 0) {
        return NULL;
    }
    if (!ok) {
        return PyObject_CallMethodOneArg((PyObject *)self, str_slow_update, value);
    }
    if (PyDict_SetItem(self->data, key, value) < 0 || mark_dirty(self, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Store ``result`` (a new reference, consumed) for ``key`` after the write check:
 * types not accepted yet go through the table's Python ``_check``. */
static PyObject *
store_checked(TableCore *self, PyObject *key, PyObject *result)
{
    int ok = accepted(self->ok, &self->ok_last, result);
    if (ok == 0) {
        PyObject *check = PyObject_GetAttr((PyObject *)self, str_check);
        PyObject *checked = check == NULL ? NULL : PyObject_CallOneArg(check, result);
        Py_XDECREF(check);
        ok = checked == NULL ? -1 : 1;
        Py_XDECREF(checked);
    }
    if (ok < 0 || PyDict_SetItem(self->data, key, result) < 0 || mark_dirty(self, key) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* reduce_add(function, value): store function(current, value), or value. */
static PyObject *
value_reduce_add(TableCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *key = nargs == 2 ? current_key(self) : NULL;
    if (key == NULL) {
        return call_slow((PyObject *)self, str_slow_reduce_add, args, nargs);
    }
    PyObject *current = PyDict_GetItemWithError(self->data, key);
    PyObject *result;
    if (current == NULL || current == Py_None) {  /* a stored None counts as absent */
        if (PyErr_Occurred()) {
            return NULL;
        }
        result = Py_NewRef(args[1]);
    }
    else {
        PyObject *call_args[2] = {Py_NewRef(current), args[1]};
        result = PyObject_Vectorcall(args[0], call_args, 2, NULL);
        Py_DECREF(call_args[0]);
        if (result == NULL) {
            return NULL;
        }
    }
    return store_checked(self, key, result);
}

/* aggregate_add(add, create, value): store add(value, current or create()). */
static PyObject *
value_aggregate_add(TableCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *key = nargs == 3 ? current_key(self) : NULL;
    if (key == NULL) {
        return call_slow((PyObject *)self, str_slow_aggregate_add, args, nargs);
    }
    PyObject *acc = PyDict_GetItemWithError(self->data, key);
    if (acc == NULL || acc == Py_None) {  /* a stored None counts as absent */
        if (PyErr_Occurred() || (acc = PyObject_CallNoArgs(args[1])) == NULL) {
            return NULL;
        }
    }
    else {
        Py_INCREF(acc);
    }
    PyObject *call_args[2] = {args[2], acc};
    PyObject *result = PyObject_Vectorcall(args[0], call_args, 2, NULL);
    Py_DECREF(acc);
    if (result == NULL) {
        return NULL;
    }
    return store_checked(self, key, result);
}

static PyMethodDef value_methods[] = {
    {"value", (PyCFunction)value_value, METH_NOARGS, "The current key's value (None if none)."},
    {"update", (PyCFunction)value_update, METH_O, "Set the current key's value."},
    {"reduce_add", (PyCFunction)(void (*)(void))value_reduce_add, METH_FASTCALL,
     "Reducing state: store function(current, value), or value, in one lookup."},
    {"aggregate_add", (PyCFunction)(void (*)(void))value_aggregate_add, METH_FASTCALL,
     "Aggregating state: store add(value, current or create()) in one lookup."},
    {NULL},
};

static PyTypeObject ValueCoreType = TABLE_TYPE(
    "ValueCore", "C fast paths of the hash map's value state (value, update, reduce_add, aggregate_add).",
    .tp_methods = value_methods);

/* ----------------------------------------------------------------- ListCore */

static PyObject *
list_get(TableCore *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *key = current_key(self);
    if (key == NULL) {
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_get);
    }
    PyObject *stored = PyDict_GetItemWithError(self->data, key);
    if (stored == NULL) {
        return PyErr_Occurred() ? NULL : PyList_New(0);
    }
    if (!PyList_CheckExact(stored)) {
        return PyObject_CallMethodNoArgs((PyObject *)self, str_slow_get);
    }
    return PyList_GetSlice(stored, 0, PyList_GET_SIZE(stored));
}

static PyObject *
list_add(TableCore *self, PyObject *value)
{
    PyObject *key = current_key(self);
    int ok = key == NULL ? 0 : accepted(self->ok, &self->ok_last, value);
    if (ok < 0) {
        return NULL;
    }
    PyObject *stored = NULL;
    if (ok) {
        stored = PyDict_GetItemWithError(self->data, key);
        if (stored == NULL && PyErr_Occurred()) {
            return NULL;
        }
        if (stored != NULL && !PyList_CheckExact(stored)) {
            ok = 0;
        }
    }
    if (!ok) {
        return PyObject_CallMethodOneArg((PyObject *)self, str_slow_add, value);
    }
    if (stored == NULL) {
        PyObject *fresh = PyList_New(1);
        if (fresh == NULL) {
            return NULL;
        }
        PyList_SET_ITEM(fresh, 0, Py_NewRef(value));
        int failed = PyDict_SetItem(self->data, key, fresh) < 0;
        Py_DECREF(fresh);
        if (failed) {
            return NULL;
        }
    }
    else if (PyList_Append(stored, value) < 0) {
        return NULL;
    }
    if (mark_dirty(self, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef list_methods[] = {
    {"get", (PyCFunction)list_get, METH_NOARGS, "A copy of the current key's list."},
    {"add", (PyCFunction)list_add, METH_O, "Append a value to the current key's list."},
    {NULL},
};

static PyTypeObject ListCoreType = TABLE_TYPE(
    "ListCore", "C fast path of the hash map's list state (get, add).",
    .tp_methods = list_methods);

/* ------------------------------------------------------------------ MapCore */

/* A new reference to the identity of a str or int user key; NULL without an error
 * for any other type (Python encodes it). */
static inline PyObject *
identity_of(PyObject *user_key)
{
    if (PyUnicode_CheckExact(user_key)) {
        return Py_NewRef(user_key);
    }
    if (PyLong_CheckExact(user_key)) {
        return PyTuple_Pack(2, (PyObject *)&PyLong_Type, user_key);
    }
    return NULL;
}

static PyObject *
map_get(TableCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        goto slow;  /* Python raises the TypeError */
    }
    PyObject *key = current_key(self);
    PyObject *user_key = args[0];
    PyObject *dflt = nargs == 2 ? args[1] : Py_None;
    if (key == NULL || !(PyUnicode_CheckExact(user_key) || PyLong_CheckExact(user_key))) {
        goto slow;
    }
    PyObject *entries = PyDict_GetItemWithError(self->data, key);
    if (entries == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(dflt);
    }
    if (!PyDict_CheckExact(entries)) {
        goto slow;
    }
    PyObject *identity = identity_of(user_key);
    if (identity == NULL) {
        return NULL;  /* PyTuple_Pack failed: str/int never reach here otherwise */
    }
    PyObject *pair = PyDict_GetItemWithError(entries, identity);
    Py_DECREF(identity);
    if (pair == NULL) {
        return PyErr_Occurred() ? NULL : Py_NewRef(dflt);
    }
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
        goto slow;
    }
    return Py_NewRef(PyTuple_GET_ITEM(pair, 1));
slow:
    return call_slow((PyObject *)self, str_slow_get, args, nargs);
}

static PyObject *
map_put(TableCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        return call_slow((PyObject *)self, str_slow_put, args, nargs);  /* TypeError */
    }
    PyObject *user_key = args[0], *value = args[1];
    PyObject *key = current_key(self);
    int ok = key == NULL ? 0 : accepted(self->key_ok, &self->key_ok_last, user_key);
    if (ok > 0) {
        ok = accepted(self->ok, &self->ok_last, value);
    }
    if (ok < 0) {
        return NULL;
    }
    PyObject *entries = NULL;
    if (ok) {
        entries = PyDict_GetItemWithError(self->data, key);
        if (entries == NULL && PyErr_Occurred()) {
            return NULL;
        }
        if ((entries != NULL && !PyDict_CheckExact(entries))
            || !(PyUnicode_CheckExact(user_key) || PyLong_CheckExact(user_key))) {
            ok = 0;
        }
    }
    if (!ok) {
        return call_slow((PyObject *)self, str_slow_put, args, nargs);
    }
    PyObject *identity = identity_of(user_key);
    if (identity == NULL) {
        return NULL;
    }
    if (entries != NULL) {
        /* An entry's pair that nothing but this map references (no snapshot copy, no
         * items() list holds it) is rewritten in place instead of allocating a new
         * one, as zip() reuses its result tuple; tracked by the GC once it can hold
         * a container. */
        PyObject *old = PyDict_GetItemWithError(entries, identity);
        if (old == NULL && PyErr_Occurred()) {
            Py_DECREF(identity);
            return NULL;
        }
        if (old != NULL && PyTuple_CheckExact(old) && PyTuple_GET_SIZE(old) == 2
            && Py_REFCNT(old) == 1) {
            PyObject *old_key = PyTuple_GET_ITEM(old, 0);
            PyObject *old_value = PyTuple_GET_ITEM(old, 1);
            PyTuple_SET_ITEM(old, 0, Py_NewRef(user_key));
            PyTuple_SET_ITEM(old, 1, Py_NewRef(value));
            if (!PyObject_GC_IsTracked(old)) {
                PyObject_GC_Track(old);
            }
            Py_DECREF(old_key);
            Py_DECREF(old_value);
            Py_DECREF(identity);
            if (mark_dirty(self, key) < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    PyObject *pair = PyTuple_Pack(2, user_key, value);
    if (pair == NULL) {
        Py_DECREF(identity);
        return NULL;
    }
    int failed;
    if (entries == NULL) {
        PyObject *fresh = PyDict_New();
        failed = fresh == NULL || PyDict_SetItem(fresh, identity, pair) < 0
                 || PyDict_SetItem(self->data, key, fresh) < 0;
        Py_XDECREF(fresh);
    }
    else {
        failed = PyDict_SetItem(entries, identity, pair) < 0;
    }
    Py_DECREF(identity);
    Py_DECREF(pair);
    if (failed || mark_dirty(self, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))map_get, METH_FASTCALL,
     "The value of a user key under the current key (default if absent)."},
    {"put", (PyCFunction)(void (*)(void))map_put, METH_FASTCALL,
     "Set the value of a user key under the current key."},
    {NULL},
};

static PyTypeObject MapCoreType = TABLE_TYPE(
    "MapCore", "C fast path of the hash map's map state (get, put).",
    .tp_methods = map_methods);

/* ------------------------------------------------------------------- module */

static PyMethodDef module_methods[] = {
    {"route_keys", (PyCFunction)(void (*)(void))weir_route_keys, METH_FASTCALL,
     "route_keys(keys, max_parallelism, parallelism, table) -> (int32 routes, slow "
     "positions): the route of each str or int key (see _keycell.c)."},
    {"process_keyed", (PyCFunction)(void (*)(void))weir_process_keyed, METH_FASTCALL,
     "process_keyed(cell, values, keys, timestamps, operator, process, out, cleaners, "
     "on_record): KeyedOperator.process_keyed's loop."},
    {"int64_range", (PyCFunction)(void (*)(void))weir_int64_range, METH_FASTCALL,
     "int64_range(start, count) -> bytearray of count native int64s from start."},
    {"dict_get_numbers", (PyCFunction)(void (*)(void))weir_dict_get_numbers, METH_FASTCALL,
     "dict_get_numbers(data, keys, kind) -> (values, validity, nulls) or None: a batch's "
     "int64 / float64 values of a value state (see _batchvalues.c)."},
    {"dict_put_numbers", (PyCFunction)(void (*)(void))weir_dict_put_numbers, METH_FASTCALL,
     "dict_put_numbers(data, keys, values, kind) -> None: a batch's int64 / float64 "
     "values stored as Python ints / floats (see _batchvalues.c)."},
    {"dict_append_many", (PyCFunction)(void (*)(void))weir_dict_append_many, METH_FASTCALL,
     "dict_append_many(data, keys, values) -> None: each value appended to its key's list "
     "(see _batchvalues.c)."},
    {"cache_get_fixed", (PyCFunction)(void (*)(void))weir_cache_get_fixed, METH_FASTCALL,
     "cache_get_fixed(cache, keys, kind, complete) -> (values, validity, nulls) or None: "
     "a RocksDB entry cache's 8-byte values as one native buffer (see _batchvalues.c)."},
    {"cache_put_fixed", (PyCFunction)(void (*)(void))weir_cache_put_fixed, METH_FASTCALL,
     "cache_put_fixed(cache, record, keys, values) -> None: 8-byte values stored in the "
     "entry cache and the record of writes (see _batchvalues.c)."},
    {"tuple_columns", (PyCFunction)(void (*)(void))weir_tuple_columns, METH_FASTCALL,
     "tuple_columns(rows, width) -> the rows' columns if all are tuples of width, else None."},
    {"spark_hash_int", (PyCFunction)(void (*)(void))weir_py_spark_hash_int, METH_FASTCALL,
     "spark_hash_int(value, seed) -> Spark's Murmur3 hashInt, unsigned."},
    {"spark_hash_long", (PyCFunction)(void (*)(void))weir_py_spark_hash_long, METH_FASTCALL,
     "spark_hash_long(value, seed) -> Spark's Murmur3 hashLong, unsigned."},
    {"spark_hash_bytes", (PyCFunction)(void (*)(void))weir_py_spark_hash_bytes, METH_FASTCALL,
     "spark_hash_bytes(data, seed) -> Spark's Murmur3 hashUnsafeBytes, unsigned."},
    {"common_key_hash", (PyCFunction)(void (*)(void))weir_py_common_key_hash, METH_FASTCALL,
     "common_key_hash(key, seed) -> the key hash of None/str/int64/tuples of them, or None."},
    {"pack_changes", (PyCFunction)(void (*)(void))weir_pack_changes, METH_FASTCALL,
     "pack_changes(written) -> {key group: (keys, count, entries, count)}: a changelog "
     "delta's primary keys and entries as msgpack bin objects (see _packed.c)"},
    {"pack_entries", (PyCFunction)(void (*)(void))weir_pack_entries, METH_FASTCALL,
     "pack_entries(entries) -> {key group: (bytearray, count)}: each (key, value) as two "
     "msgpack bin objects, grouped by the key's first two bytes (see _packed.c)."},
    {"pack_fixed", (PyCFunction)(void (*)(void))weir_pack_fixed, METH_FASTCALL,
     "pack_fixed(values, kind, pos, limit) -> (groups, next pos or -1): pack_entries of "
     "a dict of int (kind 0), float (kind 1) or msgpack scalar (kind 2) values, encoded "
     "in C (see _packed.c)."},
    {"load_values", (PyCFunction)(void (*)(void))weir_load_values, METH_FASTCALL,
     "load_values(data, entries, decode, scalars, types) -> None: each (key, raw) decoded "
     "into data (msgpack scalars in C when scalars is true), its type added to types "
     "(see _unpacked.c)."},
    {"load_flat", (PyCFunction)(void (*)(void))weir_load_flat, METH_FASTCALL,
     "load_flat(data, flat, decode, scalars, types) -> None: load_values of the list "
     "[key0, raw0, key1, raw1, ...] (see _unpacked.c)."},
    {"sorted_writes", (PyCFunction)weir_sorted_writes, METH_O,
     "sorted_writes(entries) -> (keys, values, deleted): a dict of bytes keys to bytes "
     "or None as puts and deletes, each in the keys' byte order (see _rockscore.c)."},
    {NULL},
};

static struct PyModuleDef hashcore_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "weir.state._hashcore",
    .m_doc = "C fast paths of the hash-map backend's keyed-state calls and of the "
             "current key.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__hashcore(void)
{
    ValueCoreType.tp_base = &TableCoreType;
    ListCoreType.tp_base = &TableCoreType;
    MapCoreType.tp_base = &TableCoreType;
    if (weir_rockscore_init() < 0) {
        return NULL;
    }
    PyTypeObject *types[] = {&KeyCellType, &TableCoreType, &ValueCoreType, &ListCoreType,
                             &MapCoreType, &RocksPointCoreType, &RocksValueCoreType};
    const char *names[] = {"KeyCell", "TableCore", "ValueCore", "ListCore", "MapCore",
                           "RocksPointCore", "RocksValueCore"};
    const size_t ntypes = sizeof(types) / sizeof(types[0]);
    for (size_t i = 0; i < ntypes; i++) {
        if (PyType_Ready(types[i]) < 0) {
            return NULL;
        }
    }
    if (weir_keycell_init() < 0
        || (str_slow_value = PyUnicode_InternFromString("_slow_value")) == NULL
        || (str_slow_update = PyUnicode_InternFromString("_slow_update")) == NULL
        || (str_slow_get = PyUnicode_InternFromString("_slow_get")) == NULL
        || (str_slow_add = PyUnicode_InternFromString("_slow_add")) == NULL
        || (str_slow_put = PyUnicode_InternFromString("_slow_put")) == NULL
        || (str_slow_reduce_add = PyUnicode_InternFromString("_slow_reduce_add")) == NULL
        || (str_slow_aggregate_add = PyUnicode_InternFromString("_slow_aggregate_add")) == NULL
        || (str_check = PyUnicode_InternFromString("_check")) == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&hashcore_module);
    if (module == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < ntypes; i++) {
        if (PyModule_AddObjectRef(module, names[i], (PyObject *)types[i]) < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(module, "SAMPLE_MASK", WEIR_SAMPLE_MASK) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
