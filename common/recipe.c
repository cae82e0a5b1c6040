/*
 * recipe: decides whether a Data-Juicer YAML recipe can run per shard (spec
 * §7). The recipe is loaded by pyyaml (pyyaml.h), which refuses what
 * PyYAML's safe_load would refuse and reads the tree as the dict safe_load
 * would have returned; the rules of §7 are applied to that mapping here:
 * executor_type, process and its operators (the one verdict on each name),
 * custom_operator_paths, the media keys, dataset_path and ray_address.
 */
#include "recipe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pyyaml.h"

/* Python's str.isspace() for the code point starting at s; its length or 0. */
static size_t
py_space(const unsigned char *s, size_t n)
{
    unsigned cp;

    if (*s < 0x80)
        return (*s >= 0x09 && *s <= 0x0d) || (*s >= 0x1c && *s <= 0x20);
    if (n >= 2 && *s == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n < 3 || (*s & 0xf0) != 0xe0)
        return 0;
    cp = ((unsigned)(*s & 0x0f) << 12) | ((unsigned)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return 3;
    return 0;
}

static bool
py_blank(const char *s, size_t n)
{
    size_t i = 0, k;

    while (i < n && (k = py_space((const unsigned char *)s + i, n - i)))
        i += k;
    return i == n;
}

/* A string value to keep; C strings cannot hold the NULs YAML allows. */
static int
keep_str(struct pyyaml_doc *d, const struct pyyaml_node *nd, const char *what, char **ret,
         struct esd_err *err)
{
    if (memchr(nd->val, '\0', nd->len))
        return err_set(err, -EINVAL, "recipe %s:%lu: %s contains a NUL character", d->name,
                       nd->line, what);
    *ret = xstrndup(nd->val, nd->len);
    return 0;
}

static int
check_executor(struct pyyaml_doc *d, struct recipe *r, struct esd_err *err)
{
    const struct pyyaml_node *v = pyyaml_map_get(d->root, "executor_type", NULL);
    char *got;
    int rc;

    if (v && !pyyaml_str_is(v, "default") && !pyyaml_str_is(v, "ray")) {
        got = pyyaml_msg_repr(v);
        rc =
            err_set(err, -EINVAL, "recipe %s:%lu: executor_type must be 'default' or 'ray', got %s",
                    d->name, v->line, got);
        free(got);
        return rc;
    }
    r->executor_type = xstrdup(v ? v->val : "default");
    if (strcmp(r->executor_type, "default") == 0)
        strv_push(&r->warnings, "recipe executor_type=default will be overridden with "
                                "executor_type=ray for shard workers");
    return 0;
}

/* custom_operator_paths (or the dashed spelling): falsy, a string or strings. */
static int
check_custom_paths(struct pyyaml_doc *d, struct recipe *r, struct esd_err *err)
{
    const char *key = "custom_operator_paths";
    const struct pyyaml_node *v = pyyaml_map_get(d->root, key, NULL);
    char *s;
    int rc;

    if (!v || !pyyaml_truthy(v)) {
        key = "custom-operator-paths";
        v = pyyaml_map_get(d->root, key, NULL);
    }
    if (!v || !pyyaml_truthy(v))
        return 0;
    if (pyyaml_is_str(v)) {
        if ((rc = keep_str(d, v, key, &s, err)) < 0)
            return rc;
        strv_push_owned(&r->custom_operator_paths, s);
        return 0;
    }
    if (v->kind != PYYAML_SEQ)
        goto bad;
    for (size_t i = 0; i < v->n; i++) {
        if (!pyyaml_is_str(v->kids[i]))
            goto bad;
        if ((rc = keep_str(d, v->kids[i], key, &s, err)) < 0)
            return rc;
        strv_push_owned(&r->custom_operator_paths, s);
    }
    return 0;
bad:
    return err_set(err, -EINVAL, "recipe %s:%lu: %s must be a string or a list of strings", d->name,
                   v->line, key);
}

/*
 * Built-in exceptions to the name rule (recipe_classify), for operators of
 * Data-Juicer's registry whose name says something else than the
 * reference's test (a Mapper or Filter subclass, no truthy
 * is_global_operation, none of "deduplicator", "global_", "full_dataset_"
 * in the lower-cased name). Taken from Data-Juicer 1.6.1 with
 * tests/tools/dj-operators; tests/integration/real_registry.sh checks that
 * esd and the reference agree on every registered operator. Exact names,
 * as registered. The caller's lists take precedence over both.
 */

/* Registered operators the reference accepts but the name rule refuses. */
static const char *const builtin_allow[] = {
    /*
     * Class FusedSequentialBatchOp is a Mapper subclass but its name ends in
     * "_op". It runs the batch-local mappers and filters given in its
     * op_specs argument one after the other, which neither the reference
     * nor esd inspects.
     */
    "fused_sequential_batch_op",
    /*
     * Class GeneralFusedOP is a Mapper subclass but its name ends in "_op".
     * It runs the operators of its fused_op_list argument on each batch;
     * those are not inspected either.
     */
    "general_fused_op",
};

/*
 * Registered operators the reference refuses as whole-dataset where the name
 * rule would accept them or call them unknown (then esd's refusal says what
 * the reference's says).
 */
static const char *const builtin_deny[] = {
    /*
     * Classes LLMRayVLLMEnginePipeline, RayRepartitionPipeline and
     * VLMRayVLLMEnginePipeline are Pipeline subclasses, neither Mapper nor
     * Filter; their names end in "_pipeline", which the name rule does not
     * know. Repartitioning in particular works on the whole dataset.
     */
    "llm_ray_vllm_engine_pipeline",
    "ray_repartition_pipeline",
    "vlm_ray_vllm_engine_pipeline",
};

/* How an operator name is judged, and by what (for the messages). */
enum verdict { V_SAFE, V_WHOLE, V_UNKNOWN, V_DENIED };

static bool
in_table(const char *const *table, size_t n, const char *op)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i], op) == 0)
            return true;
    return false;
}

#define IN_TABLE(t, op) in_table((t), sizeof(t) / sizeof((t)[0]), (op))

/*
 * The one place that decides whether an operator may run per shard: the
 * caller's deny list, the caller's allow list, the built-in deny and allow
 * tables, then the name rule.
 */
static enum verdict
verdict(const char *op, const struct recipe_policy *pol)
{
    if (!op)
        return V_UNKNOWN;
    if (pol && pol->deny && strv_contains(pol->deny, op))
        return V_DENIED;
    if (pol && pol->allow && strv_contains(pol->allow, op))
        return V_SAFE;
    if (IN_TABLE(builtin_deny, op))
        return V_WHOLE;
    if (IN_TABLE(builtin_allow, op))
        return V_SAFE;
    switch (recipe_classify(op)) {
    case 0:
        return V_SAFE;
    case -EPERM:
        return V_WHOLE;
    default:
        return V_UNKNOWN;
    }
}

int
recipe_verdict(const char *op, const struct recipe_policy *pol)
{
    switch (verdict(op, pol)) {
    case V_SAFE:
        return 0;
    case V_UNKNOWN:
        return -ENOENT;
    default:
        return -EPERM;
    }
}

/* The keys of a process item: the first, the value of the last, and
 * whether any differs from the first. */
struct opscan {
    const struct pyyaml_node *key;
    const struct pyyaml_node *val;
    bool several;
};

static bool
opscan_pair(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg)
{
    struct opscan *s = arg;

    if (!s->key) {
        s->key = k;
    } else if (!pyyaml_key_equal(s->key, k)) {
        s->several = true;
        return false;
    }
    s->val = v;
    return true;
}

/*
 * Operators that run other operators given in their arguments: those are
 * checked as if they stood in the process list themselves (the reference
 * checks only the outer name, so a deduplicator could hide inside).
 */
static const char *const fused_lists[][2] = {
    { "general_fused_op", "fused_op_list" },
    { "fused_sequential_batch_op", "op_specs" },
};

static int check_op(struct pyyaml_doc *d, const struct recipe_policy *pol, size_t idx,
                    const struct pyyaml_node *item, bool tail, struct recipe *r,
                    struct esd_err *err);

/*
 * Whether a process item needs the whole dataset: its name (verdict), its
 * is_global_operation, or an operator it runs. A malformed item is not:
 * check_op says what is wrong with it.
 */
static bool
item_global(const struct recipe_policy *pol, const struct pyyaml_node *item)
{
    struct opscan s = { NULL, NULL, false };
    const struct pyyaml_node *v, *list;
    enum verdict vd;

    if (item->kind != PYYAML_MAP)
        return false;
    pyyaml_map_each(item, opscan_pair, &s);
    if (!s.key || s.several || !pyyaml_is_str(s.key) || memchr(s.key->val, '\0', s.key->len))
        return false;
    vd = verdict(s.key->val, pol);
    if (vd == V_WHOLE || vd == V_DENIED)
        return true;
    if (s.val->kind != PYYAML_MAP)
        return false;
    if ((v = pyyaml_map_get(s.val, "is_global_operation", NULL)) && pyyaml_truthy(v))
        return true;
    for (size_t f = 0; f < sizeof(fused_lists) / sizeof(fused_lists[0]); f++) {
        if (strcmp(s.key->val, fused_lists[f][0]) != 0 ||
            !(list = pyyaml_map_get(s.val, fused_lists[f][1], NULL)) || list->kind != PYYAML_SEQ)
            continue;
        for (size_t i = 0; i < list->n; i++)
            if (item_global(pol, list->kids[i]))
                return true;
    }
    return false;
}

static int
check_fused(struct pyyaml_doc *d, const struct recipe_policy *pol, size_t idx, const char *name,
            const struct pyyaml_node *args, bool tail, struct recipe *r, struct esd_err *err)
{
    for (size_t f = 0; f < sizeof(fused_lists) / sizeof(fused_lists[0]); f++) {
        const struct pyyaml_node *list, *k;
        int rc;

        if (strcmp(name, fused_lists[f][0]) != 0 ||
            !(list = pyyaml_map_get(args, fused_lists[f][1], &k)) || pyyaml_is_null(list))
            continue;
        if (list->kind != PYYAML_SEQ)
            return err_set(err, -EINVAL, "Operator '%s' in %s:%lu: %s must be a list", name,
                           d->name, k->line, fused_lists[f][1]);
        for (size_t i = 0; i < list->n; i++)
            if ((rc = check_op(d, pol, idx, list->kids[i], tail, r, err)) < 0)
                return rc;
    }
    return 0;
}

/* One process item; tail: it runs in the global stage, once on the whole
 * dataset, where only an unknown name is refused. */
static int
check_op(struct pyyaml_doc *d, const struct recipe_policy *pol, size_t idx,
         const struct pyyaml_node *item, bool tail, struct recipe *r, struct esd_err *err)
{
    struct opscan s = { NULL, NULL, false };
    const struct pyyaml_node *args, *k, *v;
    const char *name;
    unsigned long line;
    char *shown = NULL, *ikey;
    int rc = 0;

    if (item->kind == PYYAML_MAP)
        pyyaml_map_each(item, opscan_pair, &s);
    if (!s.key || s.several)
        return err_set(err, -EINVAL, "process[%zu] in %s:%lu must contain exactly one operator",
                       idx, d->name, item->line);
    line = s.key->line;
    args = s.val;
    if (!pyyaml_is_str(s.key) || memchr(s.key->val, '\0', s.key->len)) {
        shown = pyyaml_msg_str(s.key);
        rc = err_set(err, -EINVAL, "Unknown operator '%s' in %s:%lu; cannot prove it is shard-safe",
                     shown, d->name, line);
        free(shown);
        return rc;
    }
    name = s.key->val;
    if (!pyyaml_is_null(args) && args->kind != PYYAML_MAP)
        return err_set(err, -EINVAL,
                       "Operator '%s' in %s:%lu: its arguments must be a mapping or null, not a %s",
                       name, d->name, args->line, pyyaml_kind_name(args));
    switch (verdict(name, pol)) {
    case V_SAFE:
        break;
    case V_DENIED:
    case V_WHOLE:
        if (tail)
            break;
        if (verdict(name, pol) == V_WHOLE)
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu requires or may require whole-dataset "
                           "semantics and cannot run per shard",
                           name, d->name, line);
        return err_set(err, -EINVAL,
                       "Operator '%s' in %s:%lu is denied by configuration and cannot run per "
                       "shard",
                       name, d->name, line);
    case V_UNKNOWN:
        return err_set(err, -EINVAL,
                       "Unknown operator '%s' in %s:%lu; cannot prove it is shard-safe", name,
                       d->name, line);
    }
    if (args->kind == PYYAML_MAP && tail) {
        if ((v = pyyaml_map_get(args, "index_key", NULL)) && !pyyaml_is_null(v) &&
            (!pyyaml_is_str(v) || !v->len))
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu: index_key must be a non-empty string", name,
                           d->name, v->line);
    } else if (args->kind == PYYAML_MAP) {
        if ((v = pyyaml_map_get(args, "is_global_operation", &k)) && pyyaml_truthy(v))
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu requires or may require whole-dataset "
                           "semantics and cannot run per shard (is_global_operation is set)",
                           name, d->name, k->line);
        if ((v = pyyaml_map_get(args, "stats_export_path", &k)) && pyyaml_truthy(v))
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu sets stats_export_path, which cannot be used "
                           "per shard",
                           name, d->name, k->line);
        if ((v = pyyaml_map_get(args, "save_dir", NULL)) && pyyaml_truthy(v)) {
            /* the reference's words: the warning is kept in the manifest */
            struct buf w;

            buf_init(&w);
            buf_puts(&w, "operator ");
            py_repr_str(name, strlen(name), &w);
            buf_puts(&w, " uses an explicit save_dir; the caller must ensure generated "
                         "filenames do not collide across shards");
            strv_push_owned(&r->warnings, buf_steal(&w));
        }
        if ((v = pyyaml_map_get(args, "index_key", NULL)) && !pyyaml_is_null(v)) {
            if (!pyyaml_is_str(v) || !v->len)
                return err_set(err, -EINVAL,
                               "Operator '%s' in %s:%lu: index_key must be a non-empty string",
                               name, d->name, v->line);
            if ((rc = keep_str(d, v, "index_key", &ikey, err)) < 0)
                return rc;
            strv_push_owned(&r->index_keys, ikey);
        }
    }
    strv_push(&r->ops, name);
    /* the operators it runs follow it */
    return args->kind == PYYAML_MAP ? check_fused(d, pol, idx, name, args, tail, r, err) : 0;
}

static bool
part_pair(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg)
{
    struct buf *o = arg;

    if (pyyaml_str_is(k, "process"))
        return true;
    if (k->kind == PYYAML_SCALAR && k->type == PYYAML_STR && k->len <= 128 &&
        !memchr(k->val, '\n', k->len)) {
        pyyaml_emit(k, o);
        buf_puts(o, ": ");
    } else {
        buf_puts(o, "? ");
        pyyaml_emit(k, o);
        buf_puts(o, "\n: ");
    }
    pyyaml_emit(v, o);
    buf_putc(o, '\n');
    return true;
}

/* The recipe with its process list cut to the items [from, to). */
static char *
part_text(const struct pyyaml_doc *d, const struct pyyaml_node *proc, size_t from, size_t to,
          const char *what)
{
    struct buf o;

    buf_init(&o);
    if (from == to)
        buf_printf(&o, "# written by esd prepare: none of the recipe's process items run per "
                       "shard (all run once, on the merged output of every shard)\n");
    else
        buf_printf(&o, "# written by esd prepare: the recipe's process items %zu to %zu, %s\n",
                   from + 1, to, what);
    pyyaml_map_each(d->root, part_pair, &o);
    buf_puts(&o, "\"process\":");
    if (from == to)
        buf_puts(&o, " []");
    for (size_t i = from; i < to; i++) {
        buf_puts(&o, "\n  - ");
        pyyaml_emit(proc->kids[i], &o);
    }
    buf_putc(&o, '\n');
    return buf_steal(&o);
}

static int
check_media_keys(struct pyyaml_doc *d, struct recipe *r, struct esd_err *err)
{
    static const char *const keys[][2] = { { "image_key", "images" },
                                           { "audio_key", "audios" },
                                           { "video_key", "videos" } };
    const struct pyyaml_node *v;
    char *s;
    int rc;

    for (size_t i = 0; i < 3; i++) {
        v = pyyaml_map_get(d->root, keys[i][0], NULL);
        if (!v) {
            s = xstrdup(keys[i][1]);
        } else if (!pyyaml_is_str(v) || !v->len) {
            return err_set(err, -EINVAL, "recipe %s:%lu: %s must be a non-empty string", d->name,
                           v->line, keys[i][0]);
        } else if ((rc = keep_str(d, v, keys[i][0], &s, err)) < 0) {
            return rc;
        }
        if (strv_contains(&r->media_keys, s))
            free(s);
        else
            strv_push_owned(&r->media_keys, s);
    }
    return 0;
}

/* Sorts and folds duplicates. */
static void
strv_uniq(struct strv *s)
{
    size_t k = 0;

    strv_sort(s);
    for (size_t i = 0; i < s->n; i++) {
        if (k && strcmp(s->v[k - 1], s->v[i]) == 0)
            free(s->v[i]);
        else
            s->v[k++] = s->v[i];
    }
    s->n = k;
    if (s->v)
        s->v[k] = NULL;
}

static int
validate(struct pyyaml_doc *d, const struct recipe_policy *pol, struct recipe *r,
         struct esd_err *err)
{
    const struct pyyaml_node *proc, *v;
    int rc;

    if (!d->root || d->root->kind != PYYAML_MAP)
        return err_set(err, -EINVAL, "recipe %s must be a mapping", d->name);
    if ((rc = check_executor(d, r, err)) < 0)
        return rc;
    proc = pyyaml_map_get(d->root, "process", NULL);
    if (!proc)
        return err_set(err, -EINVAL, "recipe %s: 'process' must be a list", d->name);
    if (proc->kind != PYYAML_SEQ)
        return err_set(err, -EINVAL, "recipe %s:%lu: 'process' must be a list, not a %s", d->name,
                       proc->line, pyyaml_is_null(proc) ? "null" : pyyaml_kind_name(proc));
    if ((rc = check_custom_paths(d, r, err)) < 0)
        return rc;
    r->nprocess = r->split = proc->n;
    for (size_t i = 0; i < proc->n; i++) {
        size_t before = r->ops.n;

        if (pol && pol->global_stage && r->split == proc->n && item_global(pol, proc->kids[i]))
            r->split = i;
        if ((rc = check_op(d, pol, i, proc->kids[i], i >= r->split, r, err)) < 0)
            return rc;
        if (i >= r->split)
            strv_push(&r->global_ops, r->ops.v[before]); /* the outer name, first */
    }
    if (r->split < r->nprocess) {
        r->shards_yaml = part_text(d, proc, 0, r->split, "which run per shard");
        r->global_yaml = part_text(d, proc, r->split, r->nprocess,
                                   "which run once on the merged output of every shard");
    }
    strv_uniq(&r->index_keys);
    if ((rc = check_media_keys(d, r, err)) < 0)
        return rc;
    v = pyyaml_map_get(d->root, "dataset_path", NULL);
    if (v && pyyaml_is_str(v)) {
        if ((rc = keep_str(d, v, "dataset_path", &r->dataset_path, err)) < 0)
            return rc;
        r->dataset_path_valid = !py_blank(v->val, v->len);
    } else if (v && !pyyaml_is_null(v) && pyyaml_str(v, &r->dataset_path) < 0) {
        return err_set(err, -EINVAL, "recipe %s:%lu: dataset_path is an integer too large to print",
                       d->name, v->line);
    }
    v = pyyaml_map_get(d->root, "ray_address", NULL);
    if (v && pyyaml_is_str(v)) {
        if ((rc = keep_str(d, v, "ray_address", &r->ray_address, err)) < 0)
            return rc;
    } else if (v && !pyyaml_is_null(v) && pyyaml_str(v, &r->ray_address) < 0) {
        return err_set(err, -EINVAL, "recipe %s:%lu: ray_address is an integer too large to print",
                       d->name, v->line);
    }
    if (r->ray_address)
        r->ray_address_repr = pyyaml_repr(v);
    return 0;
}

/* ---- public interface ---- */

static size_t
limit_or(size_t v, size_t def)
{
    return v ? v : def;
}

int
recipe_parse(const char *data, size_t len, const char *name, const struct recipe_policy *pol,
             struct recipe *ret, struct esd_err *err)
{
    struct pyyaml_doc d;
    struct recipe r;
    size_t max_bytes = limit_or(pol ? pol->limits.max_bytes : 0, RECIPE_MAX_BYTES);
    int rc;

    memset(&r, 0, sizeof(r));
    name = name ? name : "<recipe>";
    if (len > max_bytes)
        return err_set(err, -EFBIG, "recipe %s is larger than %zu bytes", name, max_bytes);
    rc = pyyaml_parse(&d, data, len, name,
                      limit_or(pol ? pol->limits.max_nodes : 0, RECIPE_MAX_NODES),
                      limit_or(pol ? pol->limits.max_depth : 0, RECIPE_MAX_DEPTH), err);
    if (!rc)
        rc = validate(&d, pol, &r, err);
    pyyaml_free(&d);
    if (rc < 0) {
        recipe_free(&r);
        return rc;
    }
    *ret = r;
    return 0;
}

int
recipe_load(const char *path, const struct recipe_policy *pol, struct recipe *ret,
            struct esd_err *err)
{
    size_t max_bytes = limit_or(pol ? pol->limits.max_bytes : 0, RECIPE_MAX_BYTES);
    struct stat st;
    struct buf b;
    ssize_t n;
    int fd, rc;

    /* O_NONBLOCK: a FIFO must not block us before fstat() turns it away */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return err_set(err, -ENOENT, "Recipe does not exist: %s", path);
        return err_sys(err, -errno, "cannot open recipe %s", path);
    }
    if (fstat(fd, &st) < 0) {
        rc = err_sys(err, -errno, "cannot stat recipe %s", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, -ENOENT, "Recipe does not exist: %s", path);
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        close(fd);
        return err_set(err, -EFBIG, "recipe %s is larger than %zu bytes", path, max_bytes);
    }
    buf_init(&b);
    buf_reserve(&b, (size_t)st.st_size + 1);
    for (;;) {
        /* one byte more than allowed, to notice a file that grew */
        size_t want = max_bytes + 1 - b.len;

        if (want > 65536)
            want = 65536;
        buf_reserve(&b, want + 1);
        n = read(fd, b.p + b.len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = err_sys(err, -errno, "cannot read recipe %s", path);
            goto out;
        }
        if (n == 0)
            break;
        b.len += (size_t)n;
        if (b.len > max_bytes) {
            rc = err_set(err, -EFBIG, "recipe %s is larger than %zu bytes", path, max_bytes);
            goto out;
        }
    }
    rc = recipe_parse(b.p, b.len, path, pol, ret, err);
out:
    close(fd);
    buf_free(&b);
    return rc;
}

static bool
ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);

    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int
recipe_classify(const char *op)
{
    static const char *const whole_suffix[] = { "_deduplicator", "_selector", "_grouper",
                                                "_aggregator" };
    static const char *const whole_infix[] = { "deduplicator", "global_", "full_dataset_" };
    size_t n = op ? strlen(op) : 0;
    char *low;
    int rc = -ENOENT;

    if (!n)
        return -ENOENT;
    low = xstrdup(op);
    for (size_t i = 0; i < n; i++)
        if (low[i] >= 'A' && low[i] <= 'Z')
            low[i] = (char)(low[i] - 'A' + 'a');
    /* the whole-dataset marks win, so that global_foo_filter is refused */
    for (size_t i = 0; i < 4 && rc == -ENOENT; i++)
        if (ends_with(low, n, whole_suffix[i]))
            rc = -EPERM;
    for (size_t i = 0; i < 3 && rc == -ENOENT; i++)
        if (strstr(low, whole_infix[i]))
            rc = -EPERM;
    if (rc == -ENOENT && (ends_with(low, n, "_mapper") || ends_with(low, n, "_filter")))
        rc = 0;
    free(low);
    return rc;
}

/*
 * Frees what a successful recipe_load/recipe_parse put in *r and zeroes it,
 * so a zeroed struct, a freed one and NULL are all fine.
 */
void
recipe_free(struct recipe *r)
{
    if (!r)
        return;
    free(r->executor_type);
    free(r->dataset_path);
    free(r->ray_address);
    free(r->ray_address_repr);
    strv_free(&r->ops);
    strv_free(&r->media_keys);
    strv_free(&r->index_keys);
    strv_free(&r->custom_operator_paths);
    strv_free(&r->warnings);
    strv_free(&r->global_ops);
    free(r->shards_yaml);
    free(r->global_yaml);
    memset(r, 0, sizeof(*r));
}
