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

namespace {

// The runs of equal keys of a sorted array, where element i has key key_of(i) at position pos_of(i) (the stable
// order: within a run positions ascend). Without uniq (nullptr) only their number M is counted; else each
// run's key, first position and length go to uniq, first, count (each of m = M entries), and inverse[position]
// = its run's number where inverse is given. -1 where positions run past n or the runs are not m.
template <typename Key, typename Pos>
Py_ssize_t runs(Py_ssize_t n, Key key_of, Pos pos_of, int64_t *uniq, int64_t *first, int64_t *count,
                int64_t *inverse, Py_ssize_t m) {
    Py_ssize_t M = 0;
    if (!uniq) {
        for (Py_ssize_t i = 0; i < n; i++) M += i == 0 || key_of(i) != key_of(i - 1);
        return M;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t key = key_of(i), pos = pos_of(i);
        bool opens = i == 0 || key != uniq[M - 1];
        if (pos < 0 || pos >= n || (opens && M == m)) return -1;
        if (opens) {
            uniq[M] = key;
            first[M] = pos;
            count[M++] = 0;
        }
        count[M - 1]++;
        if (inverse) inverse[pos] = M - 1;
    }
    return M == m ? M : -1;
}

}  // namespace

PyObject *seqlm_sorted_runs(PyObject *, PyObject *args) {
    // sorted_runs(work i8 (P,), bits, perm i8 (P,) or None, uniq i8 (M,) or None, first, count, inverse or None)
    // -> M: the runs of equal keys that counts.unique reads after its sort, in one pass where numpy took a
    // dozen (shift, mask, compare, nonzero, gather, cumsum, scatter, diff). Without perm, `work` holds sorted
    // `key << bits | position` values (the packed sort); with it, sorted keys and perm their stable argsort
    // (bits unused). With uniq None only M is counted; else uniq, first (the run's first position) and count
    // (its length) get M entries each, and inverse[position] = the position's run.
    PyObject *o[6];
    int bits;
    if (!PyArg_ParseTuple(args, "OiOOOOO", &o[0], &bits, &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    Buffers in;  // work[, perm][, uniq, first, count[, inverse]]
    bool packed = o[1] == Py_None, fill = o[2] != Py_None, with_inverse = fill && o[5] != Py_None;
    if (!in.get(o[0]) || (!packed && !in.get(o[1]))) return NULL;
    for (int i = 2; fill && i < (with_inverse ? 6 : 5); i++)
        if (!in.get(o[i], true)) return NULL;
    Py_ssize_t n = in.len_i8(0), m = fill ? in.len_i8(packed ? 1 : 2) : 0;
    int at = packed ? 1 : 2;  // uniq's buffer
    if ((packed && (bits < 1 || bits > 62)) || (!packed && in.len_i8(1) != n) ||
        (fill && (in.len_i8(at + 1) != m || in.len_i8(at + 2) != m || (with_inverse && in.len_i8(at + 3) != n)))) {
        PyErr_SetString(PyExc_ValueError, "sorted_runs: the arrays' sizes (or bits) do not fit");
        return NULL;
    }
    const int64_t *work = in.i8(0), *perm = packed ? nullptr : in.i8(1), mask = (int64_t{1} << bits) - 1;
    int64_t *uniq = fill ? in.i8(at) : nullptr, *first = fill ? in.i8(at + 1) : nullptr;
    int64_t *count = fill ? in.i8(at + 2) : nullptr, *inverse = with_inverse ? in.i8(at + 3) : nullptr;
    Py_ssize_t M = packed ? runs(n, [&](Py_ssize_t i) { return work[i] >> bits; },
                                 [&](Py_ssize_t i) { return work[i] & mask; }, uniq, first, count, inverse, m)
                          : runs(n, [&](Py_ssize_t i) { return work[i]; }, [&](Py_ssize_t i) { return perm[i]; },
                                 uniq, first, count, inverse, m);
    if (M < 0) {
        PyErr_SetString(PyExc_ValueError, "sorted_runs: the runs do not match the arrays given");
        return NULL;
    }
    return PyLong_FromSsize_t(M);
}
