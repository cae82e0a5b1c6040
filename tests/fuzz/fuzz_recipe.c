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
    /* the split: both halves are recipes again (pyyaml_emit's text reads
     * back), the shards' half with no global stage left */
    pol.global_stage = true;
    if (recipe_parse((const char *)data, size, "fuzz.yaml", &pol, &r, &err) == 0) {
        if (r.split > r.nprocess || (r.split < r.nprocess) != (r.shards_yaml != NULL))
            abort();
        if (r.shards_yaml) {
            struct recipe h;
            struct esd_err herr;

            pol.global_stage = false;
            /* (-ENOMEM: the node budget, which text with its aliases
             * expanded may pass) */
            if (recipe_parse(r.shards_yaml, strlen(r.shards_yaml), "shards.yaml", &pol, &h, &herr) <
                0) {
                if (herr.code != -ENOMEM)
                    abort();
            } else {
                recipe_free(&h);
            }
            pol.global_stage = true;
            if (recipe_parse(r.global_yaml, strlen(r.global_yaml), "global.yaml", &pol, &h, &herr) <
                0) {
                if (herr.code != -ENOMEM)
                    abort();
            } else {
                if (h.split != 0)
                    abort();
                recipe_free(&h);
            }
        }
        recipe_free(&r);
    }
    /* the name rule on arbitrary bytes */
    memcpy(name, data, n);
    name[n] = '\0';
    if (recipe_classify(name) > 0)
        abort();
    return 0;
}
