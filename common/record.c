/*
 * record: in-place edits of a record's text for prepare-time normalisation.
 * The record has been validated by jsonl_check, so the spans it returned are
 * well-formed JSON and the small walks here need no error recovery beyond
 * the type rules of spec §6.4.
 */
#include "record.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "json.h"
#include "pypath.h"

bool
record_media_item_kept(const char *item, size_t len)
{
    static const char *const schemes[] = { "http://", "https://", "s3://", "gs://", "hdfs://" };

    if (len == 0 || item[0] == '/')
        return true;
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t k = strlen(schemes[i]);
        if (len >= k && memcmp(item, schemes[i], k) == 0)
            return true;
    }
    return false;
}

/* Does member m's key equal name (len bytes)? Escaped keys are decoded
 * first; one never decodes longer than it is written. */
static bool
key_is(const char *p, const struct jsonl_member *m, const char *name, size_t len, struct buf *tmp)
{
    if (!m->key_escaped || m->key_len < len)
        return m->key_len == len && memcmp(p + m->key_off, name, len) == 0;
    buf_reset(tmp);
    jsonl_unescape(p + m->key_off, m->key_len, tmp);
    return tmp->len == len && memcmp(tmp->p, name, len) == 0;
}

static size_t
skip_ws(const char *p, size_t i, size_t end)
{
    while (i < end && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r'))
        i++;
    return i;
}

/* End of the validated string starting at p[i] == '"': index past the quote. */
static size_t
string_end(const char *p, size_t i, size_t end)
{
    for (i++; i < end; i++) {
        if (p[i] == '\\')
            i++;
        else if (p[i] == '"')
            return i + 1;
    }
    return end;
}

/* One pending replacement of p[off..off+len) by text in the edit buffer. */
struct edit {
    size_t off, len;
    size_t text_off, text_len;
};

struct edits {
    struct edit *v;
    size_t n, cap;
    struct buf text;
};

static void
edit_add(struct edits *e, size_t off, size_t len, const char *text, size_t text_len)
{
    if (e->n == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 8;
        e->v = xrealloc(e->v, e->cap * sizeof(*e->v));
    }
    e->v[e->n++] = (struct edit){ off, len, e->text.len, text_len };
    buf_append(&e->text, text, text_len);
}

/* Rewrites the relative items of one media array value. */
static int
media_value(const struct record_ctx *ctx, const char *p, const struct jsonl_member *m,
            const char *key, struct edits *e, const char *file, unsigned long long line,
            struct esd_err *err)
{
    size_t i = m->val_off, end = m->val_off + m->val_len;
    struct buf item, enc;
    int r = 0;

    if (p[i] == 'n')
        return 0; /* null: untouched */
    if (p[i] != '[')
        return err_set(err, -EINVAL, "Media field '%s' must be a list or null at %s:%llu", key,
                       file, line);
    buf_init(&item);
    buf_init(&enc);
    i = skip_ws(p, i + 1, end);
    while (i < end && p[i] != ']') {
        if (p[i] != '"') {
            r = err_set(err, -EINVAL, "Every item in media field '%s' must be a string at %s:%llu",
                        key, file, line);
            break;
        }
        size_t s_end = string_end(p, i, end);
        buf_reset(&item);
        jsonl_unescape(p + i + 1, s_end - i - 2, &item);
        if (!record_media_item_kept(item.p ? item.p : "", item.len)) {
            char *joined, *resolved = NULL;

            if (memchr(item.p, '\0', item.len)) {
                r = err_set(err, -EINVAL,
                            "media path in field '%s' contains a NUL character at %s:%llu", key,
                            file, line);
                break;
            }
            joined = fs_join(ctx->media_root, item.p);
            r = pypath_realpath(joined, &resolved, err);
            free(joined);
            if (r < 0)
                break;
            buf_reset(&enc);
            json_escape(&enc, resolved, strlen(resolved));
            edit_add(e, i, s_end - i, enc.p, enc.len);
            free(resolved);
        }
        i = skip_ws(p, s_end, end);
        if (i < end && p[i] == ',')
            i = skip_ws(p, i + 1, end);
    }
    buf_free(&item);
    buf_free(&enc);
    return r;
}

int
record_normalize(const struct record_ctx *ctx, const char *p, size_t n,
                 const struct jsonl_record *scan, uint64_t index, struct buf *out, bool *ret_edited,
                 const char *file, unsigned long long line, struct esd_err *err)
{
    struct edits e = { 0 };
    struct buf tmp, append;
    size_t insert_at;
    int r = 0;

    buf_init(&tmp);
    buf_init(&append);
    /* Media keys: Python keeps the last duplicate's value, so only the last
     * occurrence of a key is checked and rewritten. */
    for (size_t k = 0; ctx->media_keys && k < ctx->media_keys->n && r == 0; k++) {
        const char *key = ctx->media_keys->v[k];
        size_t klen = strlen(key);
        for (size_t j = scan->nmembers; j-- > 0;) {
            if (key_is(p, &scan->members[j], key, klen, &tmp)) {
                r = media_value(ctx, p, &scan->members[j], key, &e, file, line, err);
                break;
            }
        }
    }
    /* Index keys, sorted, appended after the last member when absent. */
    for (size_t k = 0; ctx->index_keys && k < ctx->index_keys->n && r == 0; k++) {
        const char *key = ctx->index_keys->v[k];
        size_t klen = strlen(key);
        bool present = false;
        for (size_t j = 0; j < scan->nmembers && !present; j++)
            present = key_is(p, &scan->members[j], key, klen, &tmp);
        if (present)
            continue;
        if (scan->nmembers > 0 || append.len > 0)
            buf_putc(&append, ',');
        json_escape(&append, key, strlen(key));
        buf_printf(&append, ":%llu", (unsigned long long)index);
    }
    if (r == 0 && append.len) {
        insert_at = scan->nmembers ? scan->members[scan->nmembers - 1].val_off +
                                         scan->members[scan->nmembers - 1].val_len
                                   : scan->obj_open + 1;
        edit_add(&e, insert_at, 0, append.p, append.len);
    }
    if (r == 0) {
        *ret_edited = e.n > 0;
        if (e.n) {
            size_t at = 0;
            buf_reset(out);
            /* media edits come in key order; the record needs offset order */
            for (size_t a = 1; a < e.n; a++)
                for (size_t b = a; b > 0 && e.v[b - 1].off > e.v[b].off; b--) {
                    struct edit t = e.v[b];
                    e.v[b] = e.v[b - 1];
                    e.v[b - 1] = t;
                }
            for (size_t a = 0; a < e.n; a++) {
                buf_append(out, p + at, e.v[a].off - at);
                buf_append(out, e.text.p + e.v[a].text_off, e.v[a].text_len);
                at = e.v[a].off + e.v[a].len;
            }
            buf_append(out, p + at, n - at);
        }
    }
    free(e.v);
    buf_free(&e.text);
    buf_free(&tmp);
    buf_free(&append);
    return r;
}
