// seqlm.kenlm.State in C (_state.cpp): what a decoder keeps between per-word calls, as kenlm's own State is a
// C struct. An n-gram model's state is its context ids (query.State's `words` tuple), held inline so that
// Scorer.base_score reads and writes them without a Python object per call; anything else a scorer keeps
// there (a neural model's history node, a tuple too long or not of ids) is held as the object itself.
#pragma once
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define STATE_IDS 15  // context ids held inline: models up to order 16

typedef struct {
    PyObject_HEAD
    int n;                   // ids held inline in ids[:n]; -1: `other` holds the words
    int64_t ids[STATE_IDS];
    PyObject *other;         // the words when they are not ids held inline
} StateObject;

extern PyTypeObject StateType;

// Register StateType on the module as "State" (0, or -1 with an exception set).
int add_state_type(PyObject *module);
