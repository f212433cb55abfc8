/* What the files of the extension module weir.state._hashcore share: the key
 * context's C base KeyCell (_keycell.c defines it and the route pass's helpers;
 * _hashcore.c's tables read the current key from it and registers the module;
 * _packed.c packs a snapshot's entries). */
#ifndef WEIR_HASHCORE_H
#define WEIR_HASHCORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
    PyObject *key_bytes; /* the current prefixed key (bytes), or a sentinel */
    PyObject *key;       /* the current key (NULL: None) */
    int key_group;       /* the current key's group, -1 without one */
    int max_parallelism; /* the number of key groups (0: not set, Python path only) */
    int kg_start;        /* the subtask's key-group range, both ends included */
    int kg_end;
} KeyCell;

extern PyTypeObject KeyCellType;

/* The RocksDB entry cache's fields and its value state's fast path (_rockscore.c);
 * weir_rockscore_init sets RocksValueCore's base and interns names (-1: error). */
extern PyTypeObject RocksPointCoreType;
extern PyTypeObject RocksValueCoreType;
int weir_rockscore_init(void);

/* Interns the names _keycell.c calls; 0 on success, -1 with an exception. */
int weir_keycell_init(void);

/* route_keys(keys, max_parallelism, parallelism, table) (see _keycell.c). */
PyObject *weir_route_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* int64_range(start, count) (see _keycell.c). */
PyObject *weir_int64_range(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_process_keyed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* tuple_columns(rows, width) (see _keycell.c). */
PyObject *weir_tuple_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* Spark's hash primitives (weir.state.keyhash); in _keycell.c. */
PyObject *weir_py_spark_hash_int(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_py_spark_hash_long(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_py_spark_hash_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_py_common_key_hash(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* pack_changes(written) -> {key group: (keys, count, entries, count)} (see _packed.c). */
PyObject *weir_pack_changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* pack_entries(entries) -> {key group: (bytearray, count)} (see _packed.c). */
PyObject *weir_pack_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* pack_fixed(values, kind, pos, limit) -> (groups, next pos | -1) (see _packed.c). */
PyObject *weir_pack_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* dict_get_numbers / dict_put_numbers: a batch's numbers of a value state (see
 * _batchvalues.c). */
PyObject *weir_dict_get_numbers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_dict_put_numbers(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_dict_append_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_cache_get_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_cache_put_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* load_values(data, entries, decode, scalars, types) -> None (see _unpacked.c). */
PyObject *weir_load_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* load_flat(data, flat, decode, scalars, types) -> None (see _unpacked.c). */
PyObject *weir_load_flat(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *weir_sorted_writes(PyObject *module, PyObject *entries);
/* The object of the msgpack scalar that is exactly n bytes at p; NULL without an
 * error when it is not one (see _unpacked.c; also _rockscore.c's fast path). */
PyObject *weir_msgpack_scalar(const unsigned char *p, Py_ssize_t n);

#endif /* WEIR_HASHCORE_H */
