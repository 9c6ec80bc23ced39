// What one frame of seqlm.decode's compiled search reads (_search.cpp): the decoder's tables (labels, hashes,
// tries, settings; decoder.py's Tables, packed by compiled.py) taken from Python buffers, and the hash step of
// hashing.py. Plain CPython API, no torch headers.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <deque>

namespace seqlm_decode {

const double LN10 = 2.302585092994046;
const int64_t SPACE = ' ' + 1;  // hashing.py's SPACE
const uint64_t MUL = 0x5851F42D4C957F2Dull;
enum { KEY, TEXT, PART, PLEN, LAST, NODE, HOT, ROW, COLUMNS };  // beams.py's COLUMNS
const int AVG_WORD = 6;
const double SLACK = 1e-9;  // groups are pruned by bounds only when this far below a sure floor (rounding)

inline int64_t step(int64_t h, int64_t symbol) {  // hashing.py's step
    uint64_t x = (static_cast<uint64_t>(h) ^ static_cast<uint64_t>(symbol)) * MUL;
    return static_cast<int64_t>(x ^ ((x >> 29) & 0x7FFFFFFFFull));
}

struct View {  // a C-contiguous buffer of a Python object
    Py_buffer b{};
    bool ok = false;
    ~View() {
        if (ok) PyBuffer_Release(&b);
    }
    bool get(PyObject *o, bool writable = false) {
        ok = PyObject_GetBuffer(o, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) == 0;
        return ok;
    }
    template <class T> T *at() const { return static_cast<T *>(b.buf); }
    Py_ssize_t count() const { return b.itemsize ? b.len / b.itemsize : 0; }
};

struct Trie {  // lexicon.py's Trie: dense children (N, L) int32, else sorted keys node * L + label -> child
    const int32_t *dense = nullptr;
    const int64_t *keys = nullptr, *child = nullptr, *start = nullptr;
    Py_ssize_t nkeys = 0;
    int64_t labels = 0;
    int64_t follow(int64_t node, int64_t c, bool starts) const {
        if (starts) return start[c];
        if (node < 0) return -1;
        int64_t q = node * labels + c;
        if (dense) return dense[q];
        const int64_t *at = std::lower_bound(keys, keys + nkeys, q);
        return at != keys + nkeys && *at == q ? child[at - keys] : -1;
    }
};

struct Tables {
    int64_t L, K, H, W, blank, unk, V;
    bool word_level, has_lex, has_hot, has_lm, prune_history, bound_by_prefix;
    // bound: the most a label adds to a beam's LM and hotword score, + ln 2 (decoder.py's Tables.bound); inf: none
    // hot_max: the largest hotword weight (or 0), of which `bound` counts two (a finished word, a partial one)
    double alpha, beta, unk_offset, token_min_logp, beam_prune_logp, bound, hot_max;
    const int64_t *starts, *text_len, *part_codes, *key_codes, *tokens;
    int64_t part_width, key_width;
    Trie lex, hot;
    const int64_t *word, *unigram, *prefix;  // lexicon.py's Lexicon, per node
    const double *hot_weight, *hot_min_len, *hot_min_weight;  // lexicon.py's Hotwords, per node
    // token level: the LM pool's distributions (rows, V), float32 or float64, and its row -> distribution row;
    // word level from a sparse pool: (K,) this utterance's ln p of each beam's partial word as its next word (what a
    // space would score), else the pool's rows as at token level
    const float *dist32 = nullptr;
    const double *dist64 = nullptr, *word_lnp = nullptr;
    const int64_t *slot = nullptr;

    int64_t hash(int64_t h, int64_t c, const int64_t *codes, int64_t width) const {
        for (int64_t j = 0; j < width && codes[c * width + j] >= 0; j++) h = step(h, codes[c * width + j]);
        return h;
    }
    // the lexicon's node after label c at `node`, and whether some unigram starts with it (Lexicon.prefix); the
    // dense table holds child * 2 + that bit, so that one load answers both
    int64_t lex_next(int64_t node, int64_t c, bool starts, bool &prefixed) const {
        if (lex.dense && !starts) {
            int32_t v = node >= 0 ? lex.dense[node * L + c] : -1;
            prefixed = v >= 0 && (v & 1);
            return v >= 0 ? v >> 1 : -1;
        }
        int64_t n = lex.follow(node, c, starts);
        prefixed = n >= 0 && prefix[n];
        return n;
    }
    double lnp(int64_t row, int64_t token) const {
        int64_t at = slot[row] * V + token;
        return dist32 ? static_cast<double>(dist32[at]) : dist64[at];
    }
};

inline bool read_trie(PyObject *spec, Trie &trie, std::deque<View> &keep, int64_t labels) {
    // spec: (dense (N, L) int32 or None, keys, child, start)
    PyObject *dense = PyTuple_GetItem(spec, 0);
    trie.labels = labels;
    if (dense != Py_None) {
        keep.emplace_back();
        if (!keep.back().get(dense)) return false;
        trie.dense = keep.back().at<int32_t>();
    }
    const int64_t **to[] = {&trie.keys, &trie.child, &trie.start};
    for (int i = 0; i < 3; i++) {
        keep.emplace_back();
        if (!keep.back().get(PyTuple_GetItem(spec, i + 1))) return false;
        *to[i] = keep.back().at<int64_t>();
        if (i == 0) trie.nkeys = keep.back().count();
    }
    return true;
}

inline bool read_tables(PyObject *ints, PyObject *floats, PyObject *arrays, Tables &t, std::deque<View> &keep) {
    int64_t v[12];
    for (int i = 0; i < 12; i++) v[i] = PyLong_AsLongLong(PyTuple_GetItem(ints, i));
    t.L = v[0], t.K = v[1], t.H = v[2], t.blank = v[3], t.unk = v[4], t.V = v[5];
    t.word_level = v[6], t.has_lex = v[7], t.has_hot = v[8], t.has_lm = v[9], t.prune_history = v[10];
    t.bound_by_prefix = v[11];
    t.W = COLUMNS + t.H;
    double *f[] = {&t.alpha, &t.beta, &t.unk_offset, &t.token_min_logp, &t.beam_prune_logp, &t.bound, &t.hot_max};
    for (int i = 0; i < 7; i++) *f[i] = PyFloat_AsDouble(PyTuple_GetItem(floats, i));
    if (PyErr_Occurred()) return false;
    // arrays: starts, text_len, part_codes, key_codes, tokens, word, unigram, prefix (int64), hot_weight,
    // hot_min_len, hot_min_weight (float64), then the tries' tuples (lexicon, hotwords)
    const int64_t **i8[] = {&t.starts, &t.text_len, &t.part_codes, &t.key_codes, &t.tokens, &t.word, &t.unigram,
                            &t.prefix};
    for (int i = 0; i < 8; i++) {
        keep.emplace_back();
        if (!keep.back().get(PyTuple_GetItem(arrays, i))) return false;
        *i8[i] = keep.back().at<int64_t>();
        if (i == 2) t.part_width = keep.back().count() / t.L;
        if (i == 3) t.key_width = keep.back().count() / t.L;
    }
    const double **f8[] = {&t.hot_weight, &t.hot_min_len, &t.hot_min_weight};
    for (int i = 0; i < 3; i++) {
        keep.emplace_back();
        if (!keep.back().get(PyTuple_GetItem(arrays, 8 + i))) return false;
        *f8[i] = keep.back().at<double>();
    }
    return read_trie(PyTuple_GetItem(arrays, 11), t.lex, keep, t.L) &&
           read_trie(PyTuple_GetItem(arrays, 12), t.hot, keep, t.L);
}

}  // namespace seqlm_decode
