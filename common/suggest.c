/*
 * suggest: the closest known name to a mistyped one (suggest.h).
 */
#include "suggest.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

static int
min3(int a, int b, int c)
{
    int m = a < b ? a : b;

    return m < c ? m : c;
}

int
suggest_distance(const char *a, size_t alen, const char *b, size_t blen)
{
    /* rows i-2, i-1 and i of the programme, row i kept in d[i % 3] */
    int d[3][SUGGEST_MAX_LEN + 1];

    if (alen > SUGGEST_MAX_LEN || blen > SUGGEST_MAX_LEN)
        return INT_MAX;
    for (size_t j = 0; j <= blen; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= alen; i++) {
        int *cur = d[i % 3], *prev = d[(i - 1) % 3], *prev2 = d[(i + 1) % 3];

        cur[0] = (int)i;
        for (size_t j = 1; j <= blen; j++) {
            int cost = a[i - 1] != b[j - 1];

            cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < cur[j])
                cur[j] = prev2[j - 2] + 1;
        }
    }
    return d[alen % 3][blen];
}

void
suggest_init(struct suggest *s, const char *word, size_t len)
{
    s->word = word;
    s->len = len;
    s->best = NULL;
    s->best_dist = INT_MAX;
}

void
suggest_add(struct suggest *s, const char *name)
{
    int dist;

    if (!name)
        return;
    dist = suggest_distance(s->word, s->len, name, strlen(name));
    if (dist < s->best_dist) {
        s->best = name;
        s->best_dist = dist;
    }
}

const char *
suggest_result(const struct suggest *s)
{
    int limit = s->len <= 4 ? 1 : s->len <= 8 ? 2 : 3;

    if (!s->best || s->best_dist == 0 || s->best_dist > limit ||
        (size_t)s->best_dist >= strlen(s->best))
        return NULL;
    return s->best;
}

int
suggest_getopt_error(int opt, char *const *argv, const struct option *lo, struct esd_err *err)
{
    const char *a = optind > 0 ? argv[optind - 1] : NULL, *eq;
    size_t len;
    struct suggest s;

    if (!a || strncmp(a, "--", 2) != 0 || a[2] == '\0') {
        /* a short option: getopt names it in optopt */
        if (opt == ':')
            return err_set(err, -EINVAL, "option '-%c' needs a value", optopt);
        return err_set(err, -EINVAL, "unknown option '-%c'", optopt ? optopt : '?');
    }
    eq = strchr(a + 2, '=');
    len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (opt == ':')
        return err_set(err, -EINVAL, "option '%.*s' needs a value", (int)len + 2, a);
    if (optopt != 0) /* a known option, but with a value it does not take */
        return err_set(err, -EINVAL, "option '%.*s' takes no value", (int)len + 2, a);
    suggest_init(&s, a + 2, len);
    for (; lo->name; lo++)
        suggest_add(&s, lo->name);
    if (suggest_result(&s))
        return err_set(err, -EINVAL, "unknown option '%.*s'; did you mean '--%s'?", (int)len + 2, a,
                       suggest_result(&s));
    return err_set(err, -EINVAL, "unknown or ambiguous option '%.*s'", (int)len + 2, a);
}
