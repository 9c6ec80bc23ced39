// Sorting n-gram keys, the bulk of counting (counts.py, external.py): numpy 1.x sorts int64 with an
// introsort and argsorts with a comparison sort, 8-9 s for 12.5M keys here; a least-significant-digit
// radix sort of non-negative keys takes a few passes over the array, each a histogram and a scatter.
// Twins in counts.py (numpy's sort / stable argsort) give the same arrays; tests hold them equal.
// Linked into _seqlm_native with _native.cpp, which registers these functions.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "_buffers.h"

namespace {

constexpr int DIGIT = 11;  // 2048 buckets: the counters stay in L1
constexpr int64_t BUCKETS = int64_t{1} << DIGIT;

// The digit passes that are not constant over all keys (a constant digit moves nothing), counted per pass.
std::vector<int> passes(const int64_t *key, Py_ssize_t n, std::vector<std::vector<int64_t>> &count) {
    uint64_t all_or = 0, all_and = ~uint64_t{0};
    for (Py_ssize_t i = 0; i < n; i++) {
        all_or |= static_cast<uint64_t>(key[i]);
        all_and &= static_cast<uint64_t>(key[i]);
    }
    std::vector<int> todo;
    for (int shift = 0; shift < 64 && (all_or >> shift); shift += DIGIT) {
        uint64_t mask = (BUCKETS - 1) << shift;
        if ((all_or & mask) != (all_and & mask)) todo.push_back(shift);
    }
    count.assign(todo.size(), std::vector<int64_t>(BUCKETS, 0));
    for (Py_ssize_t i = 0; i < n; i++)
        for (size_t p = 0; p < todo.size(); p++) count[p][(static_cast<uint64_t>(key[i]) >> todo[p]) & (BUCKETS - 1)]++;
    for (auto &c : count) {  // counts -> start offsets
        int64_t at = 0;
        for (auto &x : c) {
            int64_t here = x;
            x = at;
            at += here;
        }
    }
    return todo;
}

// Stable LSD radix sort of key[0..n) (non-negative), carrying idx along when given; the result ends up in
// key / idx (copied back from the scratch arrays after an odd number of passes).
void radix(int64_t *key, int64_t *idx, int64_t *key_tmp, int64_t *idx_tmp, Py_ssize_t n) {
    std::vector<std::vector<int64_t>> count;
    std::vector<int> todo = passes(key, n, count);
    int64_t *src = key, *dst = key_tmp, *isrc = idx, *idst = idx_tmp;
    for (size_t p = 0; p < todo.size(); p++) {
        int shift = todo[p];
        int64_t *at = count[p].data();
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t j = at[(static_cast<uint64_t>(src[i]) >> shift) & (BUCKETS - 1)]++;
            dst[j] = src[i];
            if (isrc) idst[j] = isrc[i];
        }
        std::swap(src, dst);
        std::swap(isrc, idst);
    }
    if (src != key) {
        memcpy(key, src, n * sizeof(int64_t));
        if (idx) memcpy(idx, isrc, n * sizeof(int64_t));
    }
}

bool non_negative(const int64_t *key, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (key[i] < 0) return false;
    return true;
}

}  // namespace

PyObject *seqlm_radix_sort(PyObject *, PyObject *args) {
    // radix_sort(key i8 (n,) writable, scratch i8 (n,) writable, perm i8 (n,) writable or None, perm scratch)
    // sorts key in place (keys >= 0); with perm: perm = the stable argsort of the keys as given.
    PyObject *o[4];
    if (!PyArg_ParseTuple(args, "OOOO", &o[0], &o[1], &o[2], &o[3])) return NULL;
    Buffers in;  // key, scratch[, perm, perm scratch]
    bool with_perm = o[2] != Py_None;
    for (int i = 0; i < (with_perm ? 4 : 2); i++)
        if (!in.get(o[i], true)) return NULL;
    Py_ssize_t n = in.len_i8(0);
    if (in.len_i8(1) < n || (with_perm && (in.len_i8(2) != n || in.len_i8(3) < n))) {
        PyErr_SetString(PyExc_ValueError, "radix_sort: the arrays' sizes differ");
        return NULL;
    }
    if (!non_negative(in.i8(0), n)) {
        PyErr_SetString(PyExc_ValueError, "radix_sort: keys must be non-negative");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS;
    int64_t *perm = with_perm ? in.i8(2) : nullptr;
    for (Py_ssize_t i = 0; perm && i < n; i++) perm[i] = i;
    radix(in.i8(0), perm, in.i8(1), with_perm ? in.i8(3) : nullptr, n);
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}
