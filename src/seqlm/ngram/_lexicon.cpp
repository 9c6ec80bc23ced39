// The compiled Scorer's vocabulary (_scorer.h: Lexicon): built once from the model's stoi dict, so that the
// kenlm calls (_kenlm_calls.cpp) look a word up by its UTF-8 bytes without a Python object per word.
#include "_scorer.h"

#include <stdlib.h>

void lexicon_free(Lexicon *lex) {
    table_free(lex->slots);
    table_free(lex->pool);
    lex->slots = NULL;
    lex->pool = NULL;
    lex->mask = 0;
}

// Every str key of stoi with its id; a word with lone surrogates (no UTF-8) is left to stoi, as is every word
// when an id is not an int below 2^32 - 1 (no lexicon then).
int lexicon_build(Lexicon *lex, PyObject *stoi) {
    lexicon_free(lex);
    Py_ssize_t n = PyDict_Size(stoi), pos = 0, bytes = 0, len;
    uint64_t size = 2;
    while (size < 2 * (uint64_t)n) size <<= 1;
    PyObject *key, *value;
    while (PyDict_Next(stoi, &pos, &key, &value))
        if (PyUnicode_Check(key)) bytes += PyUnicode_GET_LENGTH(key) * 4;  // at most 4 bytes a character
    lex->slots = (LexiconSlot *)table_alloc(sizeof(LexiconSlot) * size);
    lex->pool = (unsigned char *)table_alloc((size_t)bytes + 1);
    if (!lex->slots || !lex->pool) { lexicon_free(lex); PyErr_NoMemory(); return -1; }
    lex->mask = size - 1;
    for (uint64_t i = 0; i < size; i++) lex->slots[i].id = EMPTY;
    uint64_t at = 0;
    for (pos = 0; PyDict_Next(stoi, &pos, &key, &value);) {
        long long id = PyLong_Check(value) ? PyLong_AsLongLong(value) : -1;
        const char *text = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &len) : NULL;
        if (!text) { PyErr_Clear(); continue; }  // lone surrogates: never found by bytes, asked of stoi
        if (id < 0 || id >= (long long)EMPTY) { PyErr_Clear(); lexicon_free(lex); return 0; }  // stoi for all
        uint64_t h = lexicon_hash((const unsigned char *)text, len), i = h & lex->mask;
        while (lex->slots[i].id != EMPTY) i = (i + 1) & lex->mask;
        memcpy(lex->pool + at, text, (size_t)len);
        lex->slots[i] = {h, at, (uint32_t)len, (uint32_t)id};
        at += (uint64_t)len;
    }
    return 0;
}
