// seqlm.decode's compiled frame: one frame of the CTC prefix beam search for the active utterances, the twin
// of seqlm/decode/search.py's Search.frame on the CPU (tests/test_decode.py holds them equal). The
// rules are search.py's; here each utterance's candidates are expanded one by one and merged in a hash table,
// where search.py runs tensor operations over all of them (and bounds which to try). Plain CPython API, no
// torch headers (built by data/native.py, as the other compiled loops).
#include <cmath>
#include <cstring>
#include <vector>

#include "_tables.h"

namespace {

using namespace seqlm_decode;

struct Cand {  // beam k after label c
    int64_t k, c, cols[COLUMNS];
    bool fresh, moved, ends;
    double lm, partial, x;
    int64_t token, group;  // token: the LM token read (-1: none)
};

struct Group {
    int64_t first, rank;  // its first member: the candidate's index, and k * L + c
    double top, total, score;
};

// search.py's expand, word_scores and partial_scores for one candidate
void expand(const Tables &t, const double *sc, const int64_t *in, int64_t k, double lp, Cand &e) {
    int64_t c = e.c;
    e.fresh = c != t.blank && c != in[LAST];
    bool starting = t.starts[c] != 0, starts = starting && e.fresh, grows = e.fresh && !starting;
    bool had = in[PLEN] > 0;
    int64_t text_len = t.text_len[c];
    e.ends = starts && had;
    int64_t *o = e.cols;
    if (t.word_level) {
        e.moved = grows || (starts && (had || text_len > 0));
        int64_t key = e.ends ? step(in[KEY], SPACE) : in[KEY];
        o[KEY] = e.moved ? t.hash(key, c, t.key_codes, t.key_width) : key;
        o[TEXT] = e.ends ? in[KEY] : in[TEXT];
    } else {
        e.moved = e.fresh;
        o[KEY] = e.moved ? t.hash(in[KEY], c, t.key_codes, t.key_width) : in[KEY];
        o[TEXT] = in[TEXT];
    }
    o[PART] = e.fresh ? t.hash(starts ? 0 : in[PART], c, t.part_codes, t.part_width) : in[PART];
    o[PLEN] = (starts ? 0 : in[PLEN]) + (e.fresh ? text_len : 0);
    o[LAST] = c;
    bool prefixed = false;  // some unigram starts with the partial word
    if (t.has_lex && e.fresh) o[NODE] = t.lex_next(in[NODE], c, starts, prefixed);
    else o[NODE] = in[NODE], prefixed = t.has_lex && in[NODE] >= 0 && t.prefix[in[NODE]];
    o[HOT] = t.has_hot && e.fresh ? t.hot.follow(in[HOT], c, starts) : in[HOT];
    o[ROW] = in[ROW];
    double add = 0.0;  // word_scores
    if (t.has_hot && e.ends) add += in[HOT] >= 0 ? t.hot_weight[in[HOT]] : 0.0;
    e.token = -1;
    if (t.has_lm && (t.word_level ? e.ends : e.fresh)) {
        double unknown = 0.0;
        if (t.word_level) {  // the word the partial word spells, <unk> for one the LM does not (Tables.word_tokens)
            int64_t n = in[NODE], w = n >= 0 ? t.word[n] : -1;
            e.token = w >= 0 ? w : t.unk;
            unknown = n >= 0 && t.unigram[n] ? 0.0 : 1.0;
        } else {
            e.token = t.tokens[c];
        }
        double lnp = t.word_level && t.word_lnp ? t.word_lnp[k] : t.lnp(in[ROW], e.token);
        add += t.alpha * (lnp + unknown * (t.unk_offset * LN10)) + t.beta;
    }
    e.lm = sc[1] + add;
    double partial = 0.0;  // partial_scores
    int64_t node = o[NODE], plen = o[PLEN], hot = o[HOT];
    if (t.has_lex) {
        bool off = !prefixed && plen > 0;
        double scale = plen > AVG_WORD ? static_cast<double>(plen) / AVG_WORD : 1.0;
        partial = off ? t.unk_offset * scale : 0.0;
    }
    if (t.has_hot && hot >= 0 && plen > 0) partial = t.hot_min_weight[hot] * static_cast<double>(plen) / t.hot_min_len[hot];
    e.partial = partial;
    e.x = sc[0] + lp;
}

// Candidates and groups share these between utterances: no allocation per frame once grown.
struct Work {
    std::vector<Cand> cand;
    std::vector<Group> groups;
    std::vector<int64_t> table, stamp, order, labels;
    std::vector<char> tried;  // (L,) the labels tried in this frame
    std::vector<double> prefix, repeat, lbs, penalty, share;  // (K,), (L,), (K, labels): search.py's reach, floor
    double everyone = 0.0, best_lm = 0.0;
    int64_t now = 0;

    // the group of (key, label), made if new: open addressing over `table` (stamped, so never cleared)
    int64_t group_of(const Cand &e, size_t n) {
        size_t mask = table.size() - 1;
        size_t i = static_cast<size_t>(step(e.cols[KEY], e.c)) & mask;
        while (stamp[i] == now) {
            const Cand &f = cand[groups[table[i]].first];
            if (f.cols[KEY] == e.cols[KEY] && f.c == e.c) return table[i];
            i = (i + 1) & mask;
        }
        stamp[i] = now, table[i] = static_cast<int64_t>(groups.size());
        groups.push_back({static_cast<int64_t>(n), e.k * static_cast<int64_t>(tried.size()) + e.c, e.x, 0.0, 0.0});
        return table[i];
    }
    void reserve(size_t n) {
        size_t size = 1;
        while (size < 2 * n) size <<= 1;
        if (table.size() < size) table.assign(size, 0), stamp.assign(size, -1);
        now++;
    }
    // beam k after label c, expanded and put in its group; a group's fields are its first member's (by beam,
    // then label: search.py's order)
    void add(const Tables &t, const double *sc, const int64_t *in, const double *lp, int64_t k, int64_t c) {
        cand.emplace_back();
        Cand &e = cand.back();
        e.k = k, e.c = c;
        expand(t, sc + k * 3, in + k * t.W, k, lp[c], e);
        e.group = group_of(e, cand.size() - 1);
        Group &g = groups[e.group];
        g.top = std::max(g.top, e.x);
        if (k * t.L + c < g.rank) g.rank = k * t.L + c, g.first = static_cast<int64_t>(cand.size() - 1);
    }
    // every group's score: ln of its members' summed probability (search.py's _merge) + its LM and partial
    void scores() {
        for (Group &g : groups) g.total = 0.0;
        for (const Cand &e : cand) groups[e.group].total += std::exp(e.x - groups[e.group].top);
        for (Group &g : groups) g.score = (g.top + std::log(g.total)) + (cand[g.first].lm + cand[g.first].partial);
    }
    // a score below which every group is pruned, from the groups so far (their scores can only grow): the
    // K-th best of them, and the best + beam_prune_logp
    // `grown`: the best score of a group that a label continuing a word makes, at least (or -inf)
    double floor(const Tables &t, double grown) {
        if (!std::isfinite(t.bound) || groups.empty()) return -INFINITY;
        scores();
        lbs.clear();
        for (const Group &g : groups) lbs.push_back(g.score);
        double top = *std::max_element(lbs.begin(), lbs.end()), kth = -INFINITY;
        if (static_cast<int64_t>(lbs.size()) >= t.K) {
            std::nth_element(lbs.begin(), lbs.begin() + (t.K - 1), lbs.end(), std::greater<double>());
            kth = lbs[t.K - 1];
        }
        return std::max(kth, std::max(top, grown) + t.beam_prune_logp) - SLACK;
    }
    // (K, labels) the partial word's score after each label that changes the prefix (search.py's partial_scores,
    // as expand computes it); returns the best score a label continuing a word reaches at least (its LM and
    // hotword score stays)
    double penalties(const Tables &t, const double *sc, const int64_t *in, const double *lp) {
        size_t n = labels.size();
        penalty.assign(t.K * n, 0.0);
        double grown = -INFINITY;
        for (int64_t k = 0; k < t.K; k++) {
            if (!(sc[k * 3] > -INFINITY)) continue;
            const int64_t *b = in + k * t.W;
            for (size_t j = 0; j < n; j++) {
                int64_t c = labels[j];
                if (c == t.blank || c == b[LAST]) continue;
                bool starts = t.starts[c] != 0, prefixed = true;
                if (t.has_lex) t.lex_next(b[NODE], c, starts, prefixed);
                int64_t plen = (starts ? 0 : b[PLEN]) + t.text_len[c];
                double scale = plen > AVG_WORD ? static_cast<double>(plen) / AVG_WORD : 1.0;
                double pen = !prefixed && plen > 0 ? t.unk_offset * scale : 0.0;
                int64_t hot = t.has_hot ? t.hot.follow(b[HOT], c, starts) : -1;
                if (hot >= 0 && plen > 0) pen = t.hot_min_weight[hot] * static_cast<double>(plen) / t.hot_min_len[hot];
                penalty[k * n + j] = pen;
                if (!starts) grown = std::max(grown, sc[k * 3] + lp[c] + sc[k * 3 + 1] + pen);
            }
        }
        return grown;
    }
    // what reach needs: each beam's prefix total, each label's best repeating beam, every beam's total
    void bounds(const Tables &t, const double *sc, const int64_t *in) {
        prefix.assign(t.K, -INFINITY), repeat.assign(t.L, -INFINITY);
        double top = -INFINITY;
        best_lm = -INFINITY;
        for (int64_t k = 0; k < t.K; k++)
            if (sc[k * 3] > -INFINITY) top = std::max(top, sc[k * 3]), best_lm = std::max(best_lm, sc[k * 3 + 1]);
        double all = 0.0;
        share.assign(t.K, 0.0);  // each beam's exp(score - top), once (a prefix's total sums those of its beams)
        for (int64_t k = 0; k < t.K; k++)
            if (sc[k * 3] > -INFINITY) all += share[k] = std::exp(sc[k * 3] - top);
        for (int64_t k = 0; k < t.K; k++) {
            if (!(sc[k * 3] > -INFINITY)) continue;
            int64_t last = in[k * t.W + LAST];
            repeat[last] = std::max(repeat[last], sc[k * 3]);
            double sum = 0.0;
            for (int64_t j = 0; j < t.K; j++)
                if (sc[j * 3] > -INFINITY && in[j * t.W + KEY] == in[k * t.W + KEY]) sum += share[j];
            prefix[k] = top + std::log(sum);
        }
        everyone = top + std::log(all);
    }
    // at most the score of any group beam k (ints b) + label c joins, less its partial word's score (`penalties`,
    // known exactly): its members are beams of k's prefix and the one that repeats c (a space at word level:
    // also the beams of k's prefix with the word ended; a longer label: any beam); search.py's Search.reach.
    // `bound` counts two hotword weights (a finished word, a partial one); with labels of one character, the
    // finished word's is known too: the members that end a word end k's (the others add none).
    double reach(const Tables &t, const double *sc, const int64_t *b, int64_t k, int64_t c, double lp) const {
        bool anyone = !t.bound_by_prefix || (t.word_level && t.starts[c] && t.text_len[c] == 0);
        double parents = (anyone ? everyone : prefix[k]) + sc[k * 3 + 1];
        double hot = t.hot_max;
        if (t.bound_by_prefix)
            hot = t.has_hot && t.starts[c] && b[PLEN] > 0 && b[HOT] >= 0 ? t.hot_weight[b[HOT]] : 0.0;
        return std::max(parents, repeat[c] + best_lm) + lp + (t.bound - 2 * t.hot_max) + hot;
    }
};

// The labels tried in this frame, the groups of the candidates that keep their beam's prefix (the blank, its
// last label), whose scores so far bound what is kept from below, and the bounds of the others: returns a score
// below which every group is pruned.
double prepare(const Tables &t, Work &w, const double *sc, const int64_t *in, const double *lp) {
    w.labels.clear();
    int64_t best = std::max_element(lp, lp + t.L) - lp;  // the first of the best
    w.tried.assign(t.L, 0);
    for (int64_t c = 0; c < t.L; c++)
        if (lp[c] >= t.token_min_logp || c == best) w.labels.push_back(c), w.tried[c] = 1;
    w.cand.clear(), w.groups.clear();
    w.reserve(static_cast<size_t>(t.K) * w.labels.size());
    for (int64_t k = 0; k < t.K; k++) {
        if (!(sc[k * 3] > -INFINITY)) continue;
        int64_t last = in[k * t.W + LAST];
        if (w.tried[t.blank]) w.add(t, sc, in, lp, k, t.blank);
        if (last != t.blank && w.tried[last]) w.add(t, sc, in, lp, k, last);
    }
    double sure = w.floor(t, w.penalties(t, sc, in, lp));
    w.bounds(t, sc, in);
    return sure;
}

// Whether beam k + the j-th label tried, which changes its prefix, may join a group that is kept.
bool worth(const Tables &t, const Work &w, const double *sc, const int64_t *in, const double *lp, int64_t k, size_t j,
           double sure) {
    int64_t c = w.labels[j];
    return w.reach(t, sc, in + k * t.W, k, c, lp[c]) + w.penalty[k * w.labels.size() + j] >= sure;
}

// One utterance's frame: candidates expanded and merged, the best groups kept, written to its rows of `out`.
void utterance(const Tables &t, Work &w, const double *sc, const int64_t *in, const double *lp, double *out_sc,
               int64_t *out_in, int64_t *parent, int64_t *label, int64_t *pend) {
    double sure = prepare(t, w, sc, in, lp);
    for (int64_t k = 0; k < t.K; k++) {
        if (!(sc[k * 3] > -INFINITY)) continue;
        int64_t last = in[k * t.W + LAST];
        for (size_t j = 0; j < w.labels.size(); j++) {
            int64_t c = w.labels[j];
            if (c != t.blank && c != last && worth(t, w, sc, in, lp, k, j, sure)) w.add(t, sc, in, lp, k, c);
        }
    }
    w.scores();
    w.order.clear();
    for (size_t i = 0; i < w.groups.size(); i++)
        if (w.groups[i].score > -INFINITY) w.order.push_back(static_cast<int64_t>(i));
    auto better = [&](int64_t a, int64_t b) {  // best first; ties: the earlier candidate
        return w.groups[a].score > w.groups[b].score ||
               (w.groups[a].score == w.groups[b].score && w.groups[a].rank < w.groups[b].rank);
    };
    size_t top = std::min(w.order.size(), static_cast<size_t>(t.K));  // _best
    std::partial_sort(w.order.begin(), w.order.begin() + top, w.order.end(), better);
    w.order.resize(top);
    double floor = top ? w.groups[w.order[0]].score + t.beam_prune_logp : 0.0;
    w.reserve(top);
    int64_t slot = 0;
    for (int64_t gi : w.order) {
        const Group &g = w.groups[gi];
        if (!(g.score >= floor)) break;
        const Cand &e = w.cand[g.first];
        const int64_t *old = in + e.k * t.W;
        int64_t *o = out_in + slot * t.W;
        std::memcpy(o, e.cols, sizeof(e.cols));
        bool push = t.word_level ? e.ends : e.fresh;  // history: the last H words (tokens)
        int64_t unit = t.word_level ? old[PART] : e.c;
        for (int64_t j = 0; j < t.H; j++) o[COLUMNS + j] = push ? (j + 1 < t.H ? old[COLUMNS + j + 1] : unit) : old[COLUMNS + j];
        if (t.prune_history) {  // _drop_same_history: the first of those alike in history, partial word and label
            int64_t h = step(step(0, o[PART]), e.c);
            for (int64_t j = 0; j < t.H; j++) h = step(h, o[COLUMNS + j]);
            size_t mask = w.table.size() - 1, i = static_cast<size_t>(h) & mask;
            bool dup = false;
            while (w.stamp[i] == w.now && !dup) {
                const int64_t *p = out_in + w.table[i] * t.W;
                dup = p[PART] == o[PART] && p[LAST] == o[LAST] &&
                      std::equal(p + COLUMNS, p + COLUMNS + t.H, o + COLUMNS);
                i = (i + 1) & mask;
            }
            if (dup) continue;
            w.stamp[i] = w.now, w.table[i] = slot;
        }
        out_sc[slot * 3] = g.top + std::log(g.total), out_sc[slot * 3 + 1] = e.lm, out_sc[slot * 3 + 2] = e.partial;
        parent[slot] = e.k, label[slot] = e.moved ? e.c : -1;
        pend[slot * 2] = e.token >= 0 ? old[ROW] : -1, pend[slot * 2 + 1] = e.token;
        slot++;
    }
    for (; slot < t.K; slot++) {
        out_sc[slot * 3] = -INFINITY, out_sc[slot * 3 + 1] = 0.0, out_sc[slot * 3 + 2] = 0.0;
        std::memcpy(out_in + slot * t.W, in + slot * t.W, sizeof(int64_t) * t.W);
        parent[slot] = -1, label[slot] = -1, pend[slot * 2] = -1, pend[slot * 2 + 1] = -1;
    }
}

// frame(ints, floats, arrays, scores (U, K, 3), beam ints (U, K, W), lp (A, L), dist or None, slot or None,
//       word_lnp (A, K) or None, out scores (A, K, 3), out ints (A, K, W), parent (A, K), label (A, K),
//       pend (A, K, 2)); dist and slot: the LM pool's, every row a beam may score from read; word_lnp: a sparse
//       pool's scores of the words the beams would end (seqlm.decode.lmpool)
PyObject *frame(PyObject *, PyObject *args) {
    PyObject *ints, *floats, *arrays, *o[11];
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOOOOOOO", &PyTuple_Type, &ints, &PyTuple_Type, &floats, &PyTuple_Type,
                          &arrays, &o[0], &o[1], &o[2], &o[3], &o[4], &o[10], &o[5], &o[6], &o[7], &o[8], &o[9]))
        return NULL;
    Tables t;
    std::deque<View> keep;  // a deque: a View never moves once it holds a buffer
    if (!read_tables(ints, floats, arrays, t, keep)) return NULL;
    View b[11];  // 10: word_lnp, parsed before the outputs
    for (int i = 0; i < 11; i++)
        if (!((i == 3 || i == 4 || i == 10) && o[i] == Py_None) && !b[i].get(o[i], i >= 5 && i < 10)) return NULL;
    if (o[3] != Py_None) {
        if (b[3].b.itemsize == 4) t.dist32 = b[3].at<float>();
        else t.dist64 = b[3].at<double>();
        t.slot = b[4].at<int64_t>();
    }
    int64_t A = b[2].count() / t.L, K = t.K, W = t.W;
    static Work work;
    for (int64_t u = 0; u < A; u++) {
        t.word_lnp = o[10] == Py_None ? nullptr : b[10].at<double>() + u * K;
        utterance(t, work, b[0].at<double>() + u * K * 3, b[1].at<int64_t>() + u * K * W, b[2].at<double>() + u * t.L,
                  b[5].at<double>() + u * K * 3, b[6].at<int64_t>() + u * K * W, b[7].at<int64_t>() + u * K,
                  b[8].at<int64_t>() + u * K, b[9].at<int64_t>() + u * K * 2);
    }
    Py_RETURN_NONE;
}

// Whether a label that ends a word (a space, a ▁ piece) is tried in frame lp (L,): one at or above token_min_logp,
// or the best (prepare's choice); in most frames of most utterances none is, and then no beam reads the LM.
bool may_end(const Tables &t, const double *lp) {
    int64_t best = std::max_element(lp, lp + t.L) - lp;
    for (int64_t c = 0; c < t.L; c++)
        if (t.starts[c] && (lp[c] >= t.token_min_logp || c == best)) return true;
    return false;
}

// wanted(ints, floats, arrays, scores (U, K, 3), beam ints (U, K, W), lp (A, L), rows out, tokens out, index out,
//        pair out, each (A * K,)) -> (n, m): at word level, the n (LM row, word) pairs the frame may score (expand's
//        word, <unk> for one the LM does not spell), each once an utterance (beams alike but for their last label
//        share one), and the m beams that read them: beam index[i] = u * K + k reads pair pair[i]. A beam reads
//        one when it is live, has a partial word and a label that ends a word is tried in its utterance. The LM
//        pool scores or reads the pairs before `frame` (seqlm.decode.compiled).
PyObject *wanted(PyObject *, PyObject *args) {
    PyObject *ints, *floats, *arrays, *o[7];
    if (!PyArg_ParseTuple(args, "O!O!O!OOOOOOO", &PyTuple_Type, &ints, &PyTuple_Type, &floats, &PyTuple_Type,
                          &arrays, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    Tables t;
    std::deque<View> keep;
    if (!read_tables(ints, floats, arrays, t, keep)) return NULL;
    View b[7];
    for (int i = 0; i < 7; i++)
        if (!b[i].get(o[i], i >= 3)) return NULL;
    int64_t A = b[2].count() / t.L, K = t.K, W = t.W, n = 0, m = 0;
    for (int i = 3; i < 7; i++)
        if (b[i].count() < A * K) {
            PyErr_SetString(PyExc_ValueError, "wanted: the outputs hold fewer than A * K pairs");
            return NULL;
        }
    const double *sc = b[0].at<double>();
    const int64_t *in = b[1].at<int64_t>();
    int64_t *rows = b[3].at<int64_t>(), *tokens = b[4].at<int64_t>(), *index = b[5].at<int64_t>();
    int64_t *pair = b[6].at<int64_t>();
    for (int64_t u = 0; u < A; u++) {
        if (!t.word_level || !may_end(t, b[2].at<double>() + u * t.L)) continue;
        int64_t first = n;  // this utterance's pairs: rows[first:n]
        for (int64_t k = 0; k < K; k++) {
            const int64_t *x = in + (u * K + k) * W;
            if (!(sc[(u * K + k) * 3] > -INFINITY) || x[PLEN] <= 0) continue;
            int64_t node = x[NODE], w = node >= 0 && t.word ? t.word[node] : -1, token = w >= 0 ? w : t.unk;
            int64_t p = first;
            while (p < n && !(rows[p] == x[ROW] && tokens[p] == token)) p++;
            if (p == n) rows[n] = x[ROW], tokens[n] = token, n++;
            index[m] = u * K + k, pair[m] = p, m++;
        }
    }
    return Py_BuildValue("(LL)", static_cast<long long>(n), static_cast<long long>(m));
}

PyMethodDef methods[] = {
    {"frame", frame, METH_VARARGS, "one frame of the CTC prefix beam search (seqlm/decode/search.py's twin)"},
    {"wanted", wanted, METH_VARARGS, "the (LM row, word) pairs a frame may score at word level"},
    {NULL, NULL, 0, NULL},
};

struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_seqlm_decode", NULL, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__seqlm_decode(void) { return PyModule_Create(&module); }
