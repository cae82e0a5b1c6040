/*
 * record: normalisation of one validated record (spec §6.4) that keeps its
 * bytes. Relative items of media fields are rewritten to absolute resolved
 * paths under media_root and missing index keys are appended with the
 * record's global index, by editing the text; every other byte, including
 * number spellings, key order, escapes and whitespace, is kept.
 */
#ifndef ESD_RECORD_H
#define ESD_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jsonl.h"
#include "util.h"

struct record_ctx {
    const struct strv *media_keys; /* in manifest order */
    const struct strv *index_keys; /* sorted */
    const char *media_root;        /* resolved directory */
};

/*
 * Normalises the record p[0..n) whose jsonl_check (with want_members) is in
 * scan. If an edit is needed, out is reset and receives the edited record
 * (without "\n") and *ret_edited is true; otherwise out is untouched and
 * *ret_edited false (the record is used as it is). Errors name file:line:
 * "Media field 'images' must be a list or null at a.jsonl:3",
 * "Every item in media field 'images' must be a string at a.jsonl:3".
 */
int record_normalize(const struct record_ctx *ctx, const char *p, size_t n,
                     const struct jsonl_record *scan, uint64_t index, struct buf *out,
                     bool *ret_edited, const char *file, unsigned long long line,
                     struct esd_err *err);

/* True if a media item is kept as written: empty, a URL of a known scheme
 * (http, https, s3, gs, hdfs) or an absolute path. */
bool record_media_item_kept(const char *item, size_t len);

#endif
