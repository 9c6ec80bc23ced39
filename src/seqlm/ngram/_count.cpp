// Bounded-memory counting's per-position loops (external.py), each the twin of the numpy it replaces there:
// - chunk_keys: the key `prefix * V + word` of every order-k n-gram ending in a chunk of sentences, read
//   straight from the id cache (the prefix: its rank in the chunk's run of order k-1); numpy built the chunk
//   with its <s> markers and a mask of the positions that end an n-gram first.
// - merge_runs: one step of the k-way merge of an order's sorted runs; numpy concatenated the runs' windows,
//   argsorted them stably and summed the counts of equal keys with a bincount.
// Linked into _seqlm_native with _native.cpp, which registers these functions.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <vector>

namespace {

// Every buffer of one call, released together (the list of runs can be long: one per chunk).
struct BufferList {
    std::vector<Py_buffer> b;
    bool get(PyObject *o, Py_ssize_t itemsize, bool writable = false) {
        b.emplace_back();
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o, &b.back(), flags) < 0) {
            b.pop_back();
            return false;
        }
        if (b.back().itemsize != itemsize) {
            PyErr_Format(PyExc_TypeError, "expected %zd-byte items, got %zd-byte ones", itemsize, b.back().itemsize);
            return false;
        }
        return true;
    }
    template <typename T> T *at(size_t i) const { return static_cast<T *>(b[i].buf); }
    Py_ssize_t len(size_t i) const { return b[i].len / b[i].itemsize; }
    ~BufferList() {
        for (auto &x : b) PyBuffer_Release(&x);
    }
};

// The keys of the chunk's order-k n-grams (k >= 2) in position order, and each one's position in the chunk
// with its <s> markers (sentence s's marker at starts[s] - starts[0] + s). The prefix of the n-gram ending at
// position j is the (k-1)-gram ending at j - 1: for k = 2 the word there (<s> at a sentence's first word);
// else its rank in the chunk's run of order k-1, rank[j - 1] (external.py turns the ranks into merged ids
// after the sort: the run's merged ids increase with its ranks, so both sort alike). Returns P, or -1 for an
// id out of range (an error set).
Py_ssize_t keys_of(const int32_t *ids, const int64_t *starts, Py_ssize_t S, int64_t bos, int k, int64_t V,
                   const int32_t *rank, int64_t *key, int64_t *at, Py_ssize_t P) {
    Py_ssize_t p = 0;
    const int64_t max_prefix = (INT64_MAX - (V - 1)) / V;  // prefix * V + word stays an int64 for any word < V
    for (Py_ssize_t s = 0; s < S; s++) {
        Py_ssize_t w0 = starts[s] - starts[0], n = starts[s + 1] - starts[s], mark = w0 + s;  // n words + </s>
        for (Py_ssize_t d = k - 1; d <= n; d++) {  // d: the word's distance from <s>
            Py_ssize_t j = mark + d;
            int64_t word = ids[w0 + d - 1];
            int64_t prefix = k > 2 ? rank[j - 1] : d == 1 ? bos : ids[w0 + d - 2];
            if (word < 0 || word >= V || prefix < 0 || prefix > max_prefix || p == P) {
                PyErr_SetString(PyExc_ValueError, "chunk_keys: an id out of range, or more n-grams than room");
                return -1;
            }
            key[p] = prefix * V + word;
            at[p++] = j;
        }
    }
    return p;
}

}  // namespace

PyObject *seqlm_chunk_keys(PyObject *, PyObject *args) {
    // chunk_keys(ids i4 (N,), starts i8 (S+1,), bos, k, V, rank i4 (L,) or None, key i8 (P,), at i8 (P,)) -> P:
    // external._chunk_keys' numpy, in one pass over the chunk.
    PyObject *o[5];
    long long bos, V;
    int k;
    if (!PyArg_ParseTuple(args, "OOLiLOOO", &o[0], &o[1], &bos, &k, &V, &o[2], &o[3], &o[4])) return NULL;
    BufferList in;  // ids, starts, key, at[, rank]
    if (!in.get(o[0], 4) || !in.get(o[1], 8) || !in.get(o[3], 8, true) || !in.get(o[4], 8, true)) return NULL;
    bool with_rank = o[2] != Py_None;
    if (with_rank && !in.get(o[2], 4)) return NULL;
    Py_ssize_t S = in.len(1) - 1, N = in.len(0), P = in.len(2);
    const int64_t *starts = in.at<int64_t>(1);
    bool fits = S >= 0 && in.len(3) == P && k >= 2 && V > 0 && (k == 2) == !with_rank;
    for (Py_ssize_t s = 0; fits && s < S; s++) fits = starts[s + 1] >= starts[s];
    if (!fits || starts[S] - starts[0] != N || (with_rank && in.len(4) != N + S)) {
        PyErr_SetString(PyExc_ValueError, "chunk_keys: the arrays do not fit together");
        return NULL;
    }
    Py_ssize_t got = keys_of(in.at<int32_t>(0), starts, S, bos, k, V, with_rank ? in.at<int32_t>(4) : nullptr,
                             in.at<int64_t>(2), in.at<int64_t>(3), P);
    return got < 0 ? NULL : PyLong_FromSsize_t(got);
}

PyObject *seqlm_merge_runs(PyObject *, PyObject *args) {
    // merge_runs(parts [i8 (n_i, fields)], keys i8 (M,), counts i8 (M,), suffix i8 (M,), maps [i8 (n_i,)] or
    //            None, base, fields) -> m: the parts' rows (key, count, suffix), or (key, count << 32 | suffix)
    // with fields = 2, each part sorted by strictly increasing key, merged: keys[:m] their distinct keys in
    // order, counts the sums, suffix the first part's; maps[i][j] = base + the merged index of part i's row j.
    PyObject *parts, *maps, *o[3];
    long long base;
    int fields;
    if (!PyArg_ParseTuple(args, "O!OOOOLi", &PyList_Type, &parts, &o[0], &o[1], &o[2], &maps, &base, &fields))
        return NULL;
    if (fields != 2 && fields != 3) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: rows of 2 or 3 fields");
        return NULL;
    }
    Py_ssize_t K = PyList_GET_SIZE(parts);
    bool with_maps = maps != Py_None;
    if (with_maps && (!PyList_Check(maps) || PyList_GET_SIZE(maps) != K)) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: one map per part, in a list");
        return NULL;
    }
    BufferList in;  // keys, counts, suffix, then each part and its map
    for (int i = 0; i < 3; i++)
        if (!in.get(o[i], 8, true)) return NULL;
    Py_ssize_t M = in.len(0);
    struct Head { const int64_t *row, *end; int64_t *map; };
    std::vector<Head> heads(K);
    for (Py_ssize_t i = 0; i < K; i++) {
        size_t at = in.b.size();
        if (!in.get(PyList_GET_ITEM(parts, i), 8) || (with_maps && !in.get(PyList_GET_ITEM(maps, i), 8, true)))
            return NULL;
        Py_ssize_t n = in.len(at);
        if (n % fields || (with_maps && in.len(at + 1) != n / fields)) {
            PyErr_SetString(PyExc_ValueError, "merge_runs: a part is not rows of `fields`, or its map another length");
            return NULL;
        }
        heads[i] = {in.at<int64_t>(at), in.at<int64_t>(at) + n, with_maps ? in.at<int64_t>(at + 1) : nullptr};
    }
    if (in.len(1) != M || in.len(2) != M) {
        PyErr_SetString(PyExc_ValueError, "merge_runs: keys, counts and suffix differ in length");
        return NULL;
    }
    int64_t *keys = in.at<int64_t>(0), *counts = in.at<int64_t>(1), *suffix = in.at<int64_t>(2);
    Py_ssize_t m = 0;
    for (;; m++) {
        int64_t low = INT64_MAX;
        bool any = false;
        for (auto &h : heads)
            if (h.row < h.end && (!any || h.row[0] < low)) low = h.row[0], any = true;
        if (!any) break;
        if (m == M) {
            PyErr_SetString(PyExc_ValueError, "merge_runs: more distinct keys than room");
            return NULL;
        }
        keys[m] = low;
        counts[m] = 0;
        bool first = true;
        for (auto &h : heads) {
            if (h.row == h.end || h.row[0] != low) continue;
            counts[m] += fields == 3 ? h.row[1] : h.row[1] >> 32;
            if (first) suffix[m] = fields == 3 ? h.row[2] : h.row[1] & 0xFFFFFFFF, first = false;
            if (h.map) *h.map++ = base + m;
            h.row += fields;
            if (h.row < h.end && h.row[0] <= low) {
                PyErr_SetString(PyExc_ValueError, "merge_runs: a part's keys do not increase");
                return NULL;
            }
        }
    }
    return PyLong_FromSsize_t(m);
}
