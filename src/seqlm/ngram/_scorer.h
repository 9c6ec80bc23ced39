// The per-token walk of seqlm.ngram's compiled Scorer (_native.cpp), shared with its kenlm calls
// (_kenlm_calls.cpp): the tables, one token's probes, and a context read from or written to a Python tuple.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_buffers.h"

#define MAX_ORDERS 63  // orders above the unigrams (NGramModel allows N <= 64)
#define LANES 16       // sentences `stream` walks side by side, so that their cache misses overlap

// A slot of the entry table: the key, its n-gram's id and log10 p side by side, so that a lookup costs one
// cache miss (the slot table alone costs two: the slot, then keys[id]); row EMPTY: an empty slot.
typedef struct {
    int64_t key;
    uint32_t row;
    float prob;
} Entry;
#define EMPTY UINT32_MAX

typedef struct {
    Entry *ent;           // (nent,) keys, ids, log10 p; NULL (the slots are probed) when not wanted or past 2^32-1 keys
    Py_ssize_t nhome;     // home slots: 1.5 x the n-grams, 24 bytes an n-gram, as KenLM's probing tables
    Py_ssize_t nent;      // nhome and a tail that the last clusters run into (probes never wrap around)
    const int64_t *keys;  // (M,) sorted trie keys of this order
    const float *probs;   // (M,) log10 p
    const float *backoff; // back-off of the order below (the context's): the model's, or `own`
    float *own;           // with the entry table: a copy of the back-offs in table_alloc's pages (else NULL)
    const void *slots;    // hash slots (index.py), int32 or int64
    Py_ssize_t nkeys, nbackoff, nslots;
    int slot64, shift;
    uint64_t mask;
} Order;

// Memory for tables probed at random (entry tables, the lexicon): 2 MB aligned and, on Linux, asked for
// transparent huge pages, as KenLM allocates its hash tables: a probe into hundreds of MB of 4 kB pages
// misses the TLB as well as the cache (the profile showed the page walks). NULL when out of memory. Free
// with table_free.
static inline void *table_alloc(size_t bytes) {
    const size_t huge = (size_t)1 << 21;
    if (bytes < huge) return malloc(bytes ? bytes : 1);  // a small model's tables stay in small pages
    size_t size = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, size) != 0) return NULL;
    advise_huge_pages(p, size);
    return p;
}

static inline void table_free(void *p) { free(p); }

// The vocabulary as the compiled calls look words up (_lexicon.cpp): each word's UTF-8 bytes hashed into an
// open-addressing table (at most half full) beside a pool of the words' bytes, compared in full on a hash
// match: one or two cache misses a word, where a dict lookup of a new str costs three (index, entry, key).
typedef struct {
    uint64_t hash, at;  // FNV-1a of the word's bytes; where they start in the pool
    uint32_t len, id;   // id EMPTY: a free slot
} LexiconSlot;

typedef struct {
    LexiconSlot *slots;
    uint64_t mask;
    unsigned char *pool;
} Lexicon;

int lexicon_build(Lexicon *lex, PyObject *stoi);  // 0, or -1 with an exception set
void lexicon_free(Lexicon *lex);

static inline uint64_t lexicon_hash(const unsigned char *p, Py_ssize_t n) {
    uint64_t h = 14695981039346656037ull;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 32);  // the high bits into the low ones the mask keeps
}

// The id of the word whose UTF-8 bytes are p[:n] and hash h (lexicon_hash); -1 if it is not in the vocabulary.
static inline int64_t lexicon_find_hashed(const Lexicon *lex, const unsigned char *p, Py_ssize_t n, uint64_t h) {
    for (uint64_t i = h & lex->mask;; i = (i + 1) & lex->mask) {
        const LexiconSlot *e = &lex->slots[i];
        if (e->id == EMPTY) return -1;
        if (e->hash == h && e->len == (uint64_t)n && memcmp(lex->pool + e->at, p, (size_t)n) == 0) return e->id;
    }
}

static inline int64_t lexicon_find(const Lexicon *lex, const unsigned char *p, Py_ssize_t n) {
    return lexicon_find_hashed(lex, p, n, lexicon_hash(p, n));
}

typedef struct {
    PyObject_HEAD
    int64_t V;
    int n, cut;            // orders above the unigrams (N-1); a state keeps at most `cut` ids
    int closed;            // every suffix of every n-gram is listed: a miss ends the walk (finish)
    const float *unigram;  // (V,)
    PyObject *stoi;        // word -> id (BaseScore)
    long unk, bos, eos;    // ids (bos, eos: -1 where not given; the sentence calls need them)
    PyObject *owners;      // the arrays the pointers point into, kept alive
    Lexicon lexicon;       // stoi's words by their UTF-8 bytes (slots NULL: stoi is asked instead)
    Order ord[MAX_ORDERS];
} Scorer;

static inline int64_t slot_at(const Order *o, uint64_t pos) {
    return o->slot64 ? ((const int64_t *)o->slots)[pos] : ((const int32_t *)o->slots)[pos];
}

// An entry table's home slot of key q: its Fibonacci hash scaled to the home slots (any number, not a power of two).
static inline uint64_t entry_home(const Order *o, int64_t q) {
    return (uint64_t)(((unsigned __int128)((uint64_t)q * 0x9E3779B97F4A7C15ULL) * (uint64_t)o->nhome) >> 64);
}

extern PyObject *WORDS;  // interned "words": the State attribute

// The id of key q among o's keys, its probe begun at `pos` holding `hit`; -1 if absent (or the table is corrupt).
static inline int64_t probe(const Order *o, int64_t q, uint64_t pos, int64_t hit) {
    for (;;) {
        if (hit < 0 || hit >= o->nkeys) return -1;
        if (o->keys[hit] == q) return hit;
        if ((Py_ssize_t)++pos >= o->nslots) return -1;
        hit = slot_at(o, pos);
    }
}

// The same search on the entry table, from q's home slot `pos`: the id of key q (its log10 p into *prob), -1 if
// absent. A run of entries is ordered by home slot (build_entries), so an entry whose home lies past q's ends
// a search for an absent key, as an empty slot does: about two slots where plain linear probing at 2/3 full
// reads five (Knuth's (1 + 1 / (1 - a)^2) / 2), within the two cache lines that `begin` prefetched.
static inline int64_t probe_entry(const Order *o, int64_t q, uint64_t pos, float *prob) {
    for (uint64_t home = pos;; pos++) {  // the tail ends with an empty slot: no search runs off the table
        const Entry *e = &o->ent[pos];
        if (e->row == EMPTY) return -1;
        if (e->key == q) { *prob = e->prob; return e->row; }
        if (entry_home(o, e->key) > home) return -1;
    }
}

// One token in flight: the word, its context (ids at orders 1..n) and its probes. The orders' probes do
// not depend on each other (each needs only its own context id), so a token's memory reads are issued in
// rounds (begin: home slots; gather: keys, values, back-offs; finish: the walk), and `stream` runs the
// rounds over several sentences at once, so that their cache misses overlap.
typedef struct {
    int64_t word, ctx[MAX_ORDERS + 1];
    int n;
    uint64_t pos[MAX_ORDERS];
    int64_t hit[MAX_ORDERS];
} Token;

static inline int begin(const Scorer *s, Token *x) {
    if (!s->unigram) { PyErr_SetString(PyExc_RuntimeError, "Scorer is not initialised"); return -1; }
    if (x->word < 0 || x->word >= s->V) { PyErr_SetString(PyExc_IndexError, "word id out of range"); return -1; }
    if (x->n > s->n) x->n = s->n;
    __builtin_prefetch(s->unigram + x->word);
    for (int k = 0; k < x->n; k++) {
        const Order *o = &s->ord[k];
        int64_t c = x->ctx[k];
        if (c < 0) continue;
        if (c >= o->nbackoff) { PyErr_SetString(PyExc_IndexError, "context id out of range"); return -1; }
        __builtin_prefetch(o->backoff + c);  // read by finish unless this order's n-gram is listed
        int64_t q = c * s->V + x->word;
        x->pos[k] = o->ent ? entry_home(o, q) : (((uint64_t)q * 0x9E3779B97F4A7C15ULL) >> o->shift) & o->mask;
        // and the line after the home slot's unless the home slot opens its line: the probe's second or third
        // slot lies there often, and that miss, not prefetched, was 62% of `finish` in perf (the stream on GCIDE)
        if (o->ent) __builtin_prefetch(o->ent + x->pos[k] + 3);
        __builtin_prefetch(o->ent ? (const void *)(o->ent + x->pos[k])
                           : o->slot64 ? (const void *)((const int64_t *)o->slots + x->pos[k])
                                       : (const void *)((const int32_t *)o->slots + x->pos[k]));
    }
    return 0;
}

static inline void gather(const Scorer *s, Token *x) {
    for (int k = 0; k < x->n; k++) {
        const Order *o = &s->ord[k];
        if (x->ctx[k] < 0 || o->ent) continue;
        int64_t h = x->hit[k] = x->pos[k] < (uint64_t)o->nslots ? slot_at(o, x->pos[k]) : -1;
        if (h >= 0 && h < o->nkeys) {
            __builtin_prefetch(o->keys + h);
            __builtin_prefetch(o->probs + h);
        }
    }
}

// log10 p and the matched length; x->ctx becomes the context after the word (cut to the matched length).
static inline void finish(const Scorer *s, Token *x, double *logp, int *length) {
    int64_t after[MAX_ORDERS + 1];
    float prob[MAX_ORDERS + 1];
    int len = 1;
    after[0] = x->word;
    prob[0] = s->unigram[x->word];
    for (int k = 0; k < x->n; k++) {
        int64_t c = x->ctx[k];
        const Order *o = &s->ord[k];
        if (c < 0)
            after[k + 1] = -1;
        else if (o->ent)
            after[k + 1] = probe_entry(o, c * s->V + x->word, x->pos[k], &prob[k + 1]);
        else if ((after[k + 1] = probe(o, c * s->V + x->word, x->pos[k], x->hit[k])) >= 0)
            prob[k + 1] = o->probs[after[k + 1]];
        if (after[k + 1] >= 0)
            len = k + 2;
        else if (s->closed && c >= 0)
            break;  // every suffix of a listed n-gram is listed (query.with_suffix_blanks): nothing longer is
    }
    // the longest match's log10 p plus the back-offs of the contexts above it, added in the same order as
    // score_word (which also adds those below and then overwrites them): the same double, fewer reads
    double lp = (double)prob[len - 1];
    for (int k = len - 1; k < x->n; k++)
        if (x->ctx[k] >= 0) lp += s->ord[k].backoff[x->ctx[k]];
    *logp = lp;
    *length = len;
    x->n = len < s->cut ? len : s->cut;
    for (int i = 0; i < x->n; i++) x->ctx[i] = after[i];
}

static inline int step(const Scorer *s, Token *x, double *logp, int *length) {
    if (begin(s, x) < 0) return -1;
    gather(s, x);
    finish(s, x, logp, length);
    return 0;
}

static inline int read_context(PyObject *t, int64_t *ctx, int *n, int limit) {
    if (!PyTuple_Check(t)) { PyErr_SetString(PyExc_TypeError, "a state's words must be a tuple"); return -1; }
    Py_ssize_t len = PyTuple_GET_SIZE(t);
    *n = (int)(len < limit ? len : limit);
    for (int i = 0; i < *n; i++) {
        ctx[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (ctx[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static inline PyObject *make_context(const int64_t *after, int m) {
    PyObject *t = PyTuple_New(m);
    for (int i = 0; t && i < m; i++) {
        PyObject *v = PyLong_FromLongLong(after[i]);
        if (!v) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

// _kenlm_calls.cpp: kenlm.Model's calls on the Scorer
PyObject *Scorer_base_score(Scorer *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *Scorer_full_scores(Scorer *self, PyObject *args);
PyObject *Scorer_sentence_score(Scorer *self, PyObject *args);
PyObject *Scorer_kenlm_full_scores(Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *Scorer_kenlm_score(Scorer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *Scorer_encode(Scorer *self, PyObject *sentences);
