/*
 * suggest: "did you mean" for mistyped commands and options. The caller
 * offers each name it knows; the closest one by Damerau-Levenshtein
 * distance (optimal string alignment: insertions, deletions,
 * substitutions and swaps of adjacent characters each cost one) wins if
 * it is close enough for the length of the typed word. esctl and esd use
 * it; nothing here prints.
 */
#ifndef ESD_SUGGEST_H
#define ESD_SUGGEST_H

#include <getopt.h>
#include <stddef.h>

#include "util.h"

struct suggest {
    const char *word; /* what was typed, len bytes (not necessarily NUL-ended) */
    size_t len;
    const char *best; /* the closest candidate so far, or NULL */
    int best_dist;
};

/* The edit distance of a (alen bytes) and b (blen bytes); case matters.
 * Words longer than SUGGEST_MAX_LEN count as far from everything. */
#define SUGGEST_MAX_LEN 64
int suggest_distance(const char *a, size_t alen, const char *b, size_t blen);

/* Starts a search for the name closest to word[0..len). */
void suggest_init(struct suggest *s, const char *word, size_t len);

/* Offers one known name (kept by pointer: it must outlive s). A name at
 * the same distance as an earlier one does not replace it. */
void suggest_add(struct suggest *s, const char *name);

/* The closest name offered if it is close enough (at most 1 edit for words
 * of up to 4 characters, 2 up to 8, 3 beyond, and fewer edits than the
 * name has characters), else NULL. An exact match is no suggestion. */
const char *suggest_result(const struct suggest *s);

/*
 * The message for getopt_long's complaint, run with opterr = 0 and an
 * optstring starting with ':', right after it returned opt ('?' or ':')
 * for argv with the long options lo: "unknown option '--wath'; did you
 * mean '--watch'?", "option '--config' needs a value", ... Returns -EINVAL
 * with the message in err.
 */
int suggest_getopt_error(int opt, char *const *argv, const struct option *lo, struct esd_err *err);

#endif
