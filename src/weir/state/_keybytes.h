/* Canonical key bytes and key groups of str and int keys, in C (weir.state.keygroups
 * is the specification; tests/test_hashcore.py checks these against it).
 *
 * A key's canonical bytes are its msgpack encoding (use_bin_type): for a str, UTF-8
 * after a fixstr / str8 / str16 / str32 header; for an int in [-2**63, 2**64), the
 * smallest of positive / negative fixint, uint8..64, int8..64. Its key group is
 * murmur3_x86_32(bytes, seed 0) modulo max_parallelism, and the prefixed key is the
 * group as two big-endian bytes followed by the canonical bytes.
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

/* MurmurHash3_x86_32 (Austin Appleby's reference; blocks read little-endian). */
static inline uint32_t
weir_murmur3_32(const uint8_t *data, Py_ssize_t len, uint32_t seed)
{
    const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
    uint32_t h1 = seed;
    Py_ssize_t nblocks = len / 4;
    for (Py_ssize_t i = 0; i < nblocks; i++) {
        const uint8_t *b = data + i * 4;
        uint32_t k1 = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16)
                      | ((uint32_t)b[3] << 24);
        k1 *= c1;
        k1 = weir_rotl32(k1, 15);
        k1 *= c2;
        h1 ^= k1;
        h1 = weir_rotl32(h1, 13);
        h1 = h1 * 5 + 0xe6546b64u;
    }
    const uint8_t *tail = data + nblocks * 4;
    uint32_t k1 = 0;
    switch (len & 3) {
    case 3:
        k1 ^= (uint32_t)tail[2] << 16;
        /* fall through */
    case 2:
        k1 ^= (uint32_t)tail[1] << 8;
        /* fall through */
    case 1:
        k1 ^= tail[0];
        k1 *= c1;
        k1 = weir_rotl32(k1, 15);
        k1 *= c2;
        h1 ^= k1;
    }
    h1 ^= (uint32_t)len;
    h1 ^= h1 >> 16;
    h1 *= 0x85ebca6bu;
    h1 ^= h1 >> 13;
    h1 *= 0xc2b2ae35u;
    h1 ^= h1 >> 16;
    return h1;
}

/* The msgpack header of an int key and its size (1..9 bytes into out); 0 if the key
 * is not an int msgpack can hold. */
static inline int
weir_int_header(PyObject *key, uint8_t out[9])
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    uint64_t u;
    int width;
    if (overflow > 0) {
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
        u = (uint64_t)v;
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
        return 1;
    }
    else {
        u = (uint64_t)v;
        if (v < (1LL << 16)) {
            out[0] = v < (1LL << 8) ? 0xcc : 0xcd;
            width = v < (1LL << 8) ? 1 : 2;
        }
        else {
            out[0] = v < (1LL << 32) ? 0xce : 0xcf;
            width = v < (1LL << 32) ? 4 : 8;
        }
    }
    for (int i = 0; i < width; i++) {
        out[1 + i] = (uint8_t)(u >> (8 * (width - 1 - i)));
    }
    return 1 + width;
}

/* The canonical bytes of an exact str or int key as a msgpack header (head[0 ..
 * *head_len)) followed by a body (*body, *body_len: a str's UTF-8, borrowed from the
 * str; none for an int). 0 when Python must encode the key (see the top). */
static inline int
weir_key_parts(PyObject *key, uint8_t head[9], int *head_len, const char **body,
               Py_ssize_t *body_len)
{
    *body = NULL;
    *body_len = 0;
    if (PyLong_CheckExact(key)) {
        *head_len = weir_int_header(key, head);
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
    if (max_parallelism <= 0 || !weir_key_parts(key, head, &head_len, &body, &body_len)) {
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
    int g = (int)(weir_murmur3_32(p + 2, head_len + body_len, 0) % (uint32_t)max_parallelism);
    p[0] = (uint8_t)(g >> 8);
    p[1] = (uint8_t)g;
    *group = g;
    return out;
}

/* The key group of an exact str or int key (no bytes object made; keys up to
 * ``WEIR_STACK_KEY`` bytes hashed from the stack); -1 when Python must do it, -2 on
 * a memory error (exception set). */
#define WEIR_STACK_KEY 512
static inline int
weir_key_group(PyObject *key, long max_parallelism)
{
    uint8_t head[9];
    int head_len;
    const char *body;
    Py_ssize_t body_len;
    if (max_parallelism <= 0 || !weir_key_parts(key, head, &head_len, &body, &body_len)) {
        return -1;
    }
    uint8_t stack[WEIR_STACK_KEY];
    Py_ssize_t total = head_len + body_len;
    uint8_t *buf = total <= WEIR_STACK_KEY ? stack : PyMem_Malloc(total);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -2;
    }
    memcpy(buf, head, head_len);
    if (body_len) {
        memcpy(buf + head_len, body, body_len);
    }
    uint32_t hash = weir_murmur3_32(buf, total, 0);
    if (buf != stack) {
        PyMem_Free(buf);
    }
    return (int)(hash % (uint32_t)max_parallelism);
}

#endif /* WEIR_KEYBYTES_H */
