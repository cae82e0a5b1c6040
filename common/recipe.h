/*
 * recipe: loads a Data-Juicer YAML recipe with pyyaml (pyyaml.h, PyYAML's
 * safe_load bit for bit) and validates it for per-shard execution (spec
 * §7), with bounded memory and time whatever the input (size cap, node
 * budget counted through aliases, depth cap).
 *
 * esd has no Python operator registry, so operators are classified by
 * Data-Juicer's naming convention: names ending in "_mapper" or "_filter"
 * are shard-safe; names ending in "_deduplicator", "_selector", "_grouper"
 * or "_aggregator", or containing "deduplicator", "global_" or
 * "full_dataset_" need the whole dataset and are refused; anything else is
 * refused as unknown. A few registered operators whose class says otherwise
 * than their name are built-in exceptions (recipe.c's builtin_deny and
 * builtin_allow tables, checked against the real registry by
 * tests/integration/real_registry.sh). A deny list (always refused) and an
 * allow list (accepted whatever the name) given by the caller take
 * precedence over both, deny first.
 *
 * The rules read the mapping safe_load would return (pyyaml.h: YAML 1.1
 * scalar types, merge keys honoured, later duplicate keys win), so "truthy"
 * means what it means to the reference.
 */
#ifndef ESD_RECIPE_H
#define ESD_RECIPE_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

struct recipe_limits {
    size_t max_bytes; /* file size cap; default RECIPE_MAX_BYTES */
    size_t max_nodes; /* nodes visited, aliases counted at every use */
    size_t max_depth; /* nesting of sequences/mappings */
};

#define RECIPE_MAX_BYTES (4u << 20)
#define RECIPE_MAX_NODES 200000u
#define RECIPE_MAX_DEPTH 64u

struct recipe_policy {
    const struct strv *allow;    /* may be NULL */
    const struct strv *deny;     /* may be NULL */
    struct recipe_limits limits; /* zero fields take the defaults */
    bool global_stage;           /* split instead of refusing whole-dataset operators */
};

struct recipe {
    char *executor_type;               /* "default" (also when absent) or "ray" */
    char *dataset_path;                /* recipe value as written; NULL if absent/null */
    bool dataset_path_valid;           /* a non-empty, non-whitespace string */
    char *ray_address;                 /* Python str() of the recipe's ray_address; NULL if absent
                             or null */
    char *ray_address_repr;            /* its Python repr(), for the override warning */
    struct strv ops;                   /* operator names, in process order */
    struct strv media_keys;            /* image_key, audio_key, video_key (defaults images,
                               audios, videos), deduplicated, in that order */
    struct strv index_keys;            /* distinct non-null index_key values of operator
                               args, sorted */
    struct strv custom_operator_paths; /* as written */
    struct strv warnings;              /* executor warning, then save_dir warnings in
                             operator order */
    /* The split (pol->global_stage): the process items [0, split) run per
     * shard, [split, nprocess) once on the merged result. */
    size_t nprocess;        /* items of the process list */
    size_t split;           /* the first that needs the whole dataset; nprocess if none */
    struct strv global_ops; /* the names of the items from split on */
    char *shards_yaml;      /* split < nprocess: the recipe with process [0, split) */
    char *global_yaml;      /* split < nprocess: the recipe with process [split, nprocess) */
};

/*
 * Loads and validates the recipe at path. On success *ret is filled (the
 * caller calls recipe_free). On failure err names the file, and the line
 * where one applies ("invalid YAML in r.yaml:3: …", "Unknown operator
 * 'foo_op' in r.yaml:7; cannot prove it is shard-safe", …); *ret untouched.
 * pol may be NULL (no lists, default limits).
 */
int recipe_load(const char *path, const struct recipe_policy *pol, struct recipe *ret,
                struct esd_err *err);

/* The same on a buffer; name is used in messages. */
int recipe_parse(const char *data, size_t len, const char *name, const struct recipe_policy *pol,
                 struct recipe *ret, struct esd_err *err);

/*
 * With pol->global_stage, the first process item that needs the whole
 * dataset (a whole-dataset or denied name, is_global_operation set, or a
 * fused operator holding one) does not refuse the recipe: it and every item
 * after it form the global stage, which must still name known operators.
 * shards_yaml and global_yaml are then the user's recipe, every other key
 * kept, with its process list cut at the split (pyyaml_emit's flow text,
 * which PyYAML and Data-Juicer read as the same values).
 */

/*
 * The name rule alone (without the lists): 0 shard-safe, -EPERM whole-
 * dataset, -ENOENT unknown.
 */
int recipe_classify(const char *op);

/*
 * The decision recipe_parse makes for an operator name: the caller's deny
 * list, the caller's allow list, the built-in exceptions, then the name
 * rule. Returns 0 shard-safe, -EPERM whole-dataset or denied, -ENOENT
 * unknown (also for NULL). pol may be NULL (no caller lists).
 */
int recipe_verdict(const char *op, const struct recipe_policy *pol);

void recipe_free(struct recipe *r);

#endif
