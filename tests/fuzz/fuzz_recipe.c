/*
 * fuzz_recipe: libFuzzer target for the recipe loader. Any input must be
 * accepted or refused with a message, within the node and depth bounds,
 * without leaks or undefined behaviour; accepted recipes must satisfy the
 * invariants the rest of esd relies on. A smaller node budget than the
 * default keeps each run quick while still reaching the budget's edge.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recipe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct strv allow, deny;

static void
lists_init(void)
{
    if (allow.n)
        return;
    strv_push(&allow, "foo_op");
    strv_push(&allow, "document_deduplicator");
    strv_push(&deny, "bad_mapper");
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct recipe_policy pol = { &allow, &deny, { 0, 20000, 0 }, false };
    struct recipe r;
    struct esd_err err;
    char name[64];
    size_t n = size < sizeof(name) - 1 ? size : sizeof(name) - 1;

    lists_init();
    if (recipe_parse((const char *)data, size, "fuzz.yaml", &pol, &r, &err) == 0) {
        if (!r.executor_type || r.media_keys.n < 1 || r.media_keys.n > 3)
            abort();
        for (size_t i = 1; i < r.index_keys.n; i++)
            if (strcmp(r.index_keys.v[i - 1], r.index_keys.v[i]) >= 0)
                abort();
        recipe_free(&r);
    } else if (!err.msg[0] || err.code >= 0) {
        abort();
    }
    /* the name rule on arbitrary bytes */
    memcpy(name, data, n);
    name[n] = '\0';
    if (recipe_classify(name) > 0)
        abort();
    return 0;
}
