/* Canonical key bytes and key groups of str and int keys, in C (weir.state.keygroups
 * is the specification; tests/test_hashcore.py checks these against it).
 *
 * A key's canonical bytes are its msgpack encoding (use_bin_type): for a str, UTF-8
 * after a fixstr / str8 / str16 / str32 header; for an int in [-2**63, 2**64), the
 * smallest of positive / negative fixint, uint8..64, int8..64. Its key group is its
 * key hash (weir.state.keyhash: Spark's hash() of the key as a Spark value, here of a
 * str's UTF-8 or an int as a long) modulo max_parallelism, and the prefixed key is
 * the group as two big-endian bytes followed by the canonical bytes.
 *
 * The functions here decline (weir_prefixed_key: NULL *without* an exception set;
 * weir_key_group: -1) when the key is not an exact str or int, or cannot be encoded
 * here (a str with lone surrogates, an int out of range): the caller then takes weir's
 * Python path, which encodes every other key and raises the errors.
 */
#ifndef WEIR_KEYBYTES_H
#define WEIR_KEYBYTES_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t
weir_rotl32(uint32_t x, int r)
{
    return (x << r) | (x >> (32 - r));
}

/* Spark's Murmur3_x86_32 (org.apache.spark.unsafe.hash.Murmur3_x86_32), the hash of
 * Spark's hash() function: weir's key hash (weir.state.keyhash is the specification). */
#define WEIR_KEY_SEED 42u

static inline uint32_t
weir_mix_k1(uint32_t k1)
{
    k1 *= 0xcc9e2d51u;
    k1 = weir_rotl32(k1, 15);
    return k1 * 0x1b873593u;
}

static inline uint32_t
weir_mix_h1(uint32_t h1, uint32_t k1)
{
    h1 ^= k1;
    h1 = weir_rotl32(h1, 13);
    return h1 * 5 + 0xe6546b64u;
}

static inline uint32_t
weir_fmix(uint32_t h1, uint32_t length)
{
    h1 ^= length;
    h1 ^= h1 >> 16;
    h1 *= 0x85ebca6bu;
    h1 ^= h1 >> 13;
    h1 *= 0xc2b2ae35u;
    h1 ^= h1 >> 16;
    return h1;
}

/* Spark's hashInt (an int, boolean or date). */
static inline uint32_t
weir_spark_hash_int(uint32_t value, uint32_t seed)
{
    return weir_fmix(weir_mix_h1(seed, weir_mix_k1(value)), 4);
}

/* Spark's hashLong (a long, double bits, timestamp). */
static inline uint32_t
weir_spark_hash_long(uint64_t value, uint32_t seed)
{
    uint32_t h1 = weir_mix_h1(seed, weir_mix_k1((uint32_t)value));
    h1 = weir_mix_h1(h1, weir_mix_k1((uint32_t)(value >> 32)));
    return weir_fmix(h1, 8);
}

/* Spark's hashUnsafeBytes (a string's UTF-8, a binary): 4-byte blocks little-endian,
 * then each remaining byte, sign-extended, as a block of its own (not the reference
 * murmur3 tail). */
static inline uint32_t
weir_spark_hash_bytes(const uint8_t *data, Py_ssize_t len, uint32_t seed)
{
    uint32_t h1 = seed;
    Py_ssize_t aligned = len - len % 4;
    for (Py_ssize_t i = 0; i < aligned; i += 4) {
        const uint8_t *b = data + i;
        uint32_t k1 = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16)
                      | ((uint32_t)b[3] << 24);
        h1 = weir_mix_h1(h1, weir_mix_k1(k1));
    }
    for (Py_ssize_t i = aligned; i < len; i++) {
        h1 = weir_mix_h1(h1, weir_mix_k1((uint32_t)(int32_t)(int8_t)data[i]));
    }
    return weir_fmix(h1, (uint32_t)len);
}

/* The msgpack header of an int key and its size (1..9 bytes into out); 0 if the key
 * is not an int msgpack can hold. *hash is the key's hash: Spark's hashLong of an int
 * in [-2**63, 2**63), hashUnsafeBytes of the 9 canonical bytes above. */
static inline int
weir_int_header(PyObject *key, uint8_t out[9], uint32_t *hash)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    uint64_t u = (uint64_t)v;
    int width;
    if (overflow > 0) { /* [2**63, 2**64): uint64 */
        u = PyLong_AsUnsignedLongLong(key);
        if (u == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        out[0] = 0xcf;
        width = 8;
    }
    else if (overflow < 0) {
        return 0;
    }
    else if (v < -(1LL << 5)) {
        if (v < -(1LL << 15)) {
            out[0] = v < -(1LL << 31) ? 0xd3 : 0xd2;
            width = v < -(1LL << 31) ? 8 : 4;
        }
        else {
            out[0] = v < -(1LL << 7) ? 0xd1 : 0xd0;
            width = v < -(1LL << 7) ? 2 : 1;
        }
    }
    else if (v < (1LL << 7)) {
        out[0] = (uint8_t)(int8_t)v; /* positive or negative fixint */
        *hash = weir_spark_hash_long(u, WEIR_KEY_SEED);
        return 1;
    }
    else if (v < (1LL << 16)) {
        out[0] = v < (1LL << 8) ? 0xcc : 0xcd;
        width = v < (1LL << 8) ? 1 : 2;
    }
    else {
        out[0] = v < (1LL << 32) ? 0xce : 0xcf;
        width = v < (1LL << 32) ? 4 : 8;
    }
    for (int i = 0; i < width; i++) {
        out[1 + i] = (uint8_t)(u >> (8 * (width - 1 - i)));
    }
    *hash = overflow > 0 ? weir_spark_hash_bytes(out, 9, WEIR_KEY_SEED)
                         : weir_spark_hash_long(u, WEIR_KEY_SEED);
    return 1 + width;
}

/* The canonical bytes of an exact str or int key as a msgpack header (head[0 ..
 * *head_len)) followed by a body (*body, *body_len: a str's UTF-8, borrowed from the
 * str; none for an int), and the key's hash (Spark's hash of a str: its UTF-8). 0 when
 * Python must encode the key (see the top). */
static inline int
weir_key_parts(PyObject *key, uint8_t head[9], int *head_len, const char **body,
               Py_ssize_t *body_len, uint32_t *hash)
{
    *body = NULL;
    *body_len = 0;
    if (PyLong_CheckExact(key)) {
        *head_len = weir_int_header(key, head, hash);
        return *head_len != 0;
    }
    if (!PyUnicode_CheckExact(key)) {
        return 0;
    }
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(key, &n);
    if (utf8 == NULL) {
        PyErr_Clear(); /* lone surrogates: Python raises the key error */
        return 0;
    }
    if (n < 32) {
        head[0] = (uint8_t)(0xa0 | n);
        *head_len = 1;
    }
    else if (n <= 0xff) {
        head[0] = 0xd9;
        head[1] = (uint8_t)n;
        *head_len = 2;
    }
    else if (n <= 0xffff) {
        head[0] = 0xda;
        head[1] = (uint8_t)(n >> 8);
        head[2] = (uint8_t)n;
        *head_len = 3;
    }
    else if ((uint64_t)n <= 0xffffffffu) {
        head[0] = 0xdb;
        for (int i = 0; i < 4; i++) {
            head[1 + i] = (uint8_t)((uint64_t)n >> (8 * (3 - i)));
        }
        *head_len = 5;
    }
    else {
        return 0;
    }
    *body = utf8;
    *body_len = n;
    *hash = weir_spark_hash_bytes((const uint8_t *)utf8, n, WEIR_KEY_SEED);
    return 1;
}

/* The prefixed key (new reference) of an exact str or int key, its group in *group;
 * NULL without an exception when Python must do it (see the top). */
static inline PyObject *
weir_prefixed_key(PyObject *key, long max_parallelism, int *group)
{
    uint8_t head[9];
    int head_len;
    const char *body;
    Py_ssize_t body_len;
    uint32_t hash;
    if (max_parallelism <= 0
        || !weir_key_parts(key, head, &head_len, &body, &body_len, &hash)) {
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 2 + head_len + body_len);
    if (out == NULL) {
        PyErr_Clear();
        return NULL;
    }
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    memcpy(p + 2, head, head_len);
    if (body_len) {
        memcpy(p + 2 + head_len, body, body_len);
    }
    int g = (int)(hash % (uint32_t)max_parallelism);
    p[0] = (uint8_t)(g >> 8);
    p[1] = (uint8_t)g;
    *group = g;
    return out;
}

/* The key group of an exact str or int key (no bytes object made); -1 when Python
 * must do it. */
static inline int
weir_key_group(PyObject *key, long max_parallelism)
{
    uint8_t head[9];
    int head_len;
    const char *body;
    Py_ssize_t body_len;
    uint32_t hash;
    if (max_parallelism <= 0
        || !weir_key_parts(key, head, &head_len, &body, &body_len, &hash)) {
        return -1;
    }
    return (int)(hash % (uint32_t)max_parallelism);
}

#endif /* WEIR_KEYBYTES_H */
