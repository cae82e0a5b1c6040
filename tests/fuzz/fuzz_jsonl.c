/*
 * fuzz_jsonl: libFuzzer target for the JSONL scanner and record
 * normalisation. The input is split on "\n" like a file; every record is
 * checked, and every accepted record is normalised (media paths, index
 * keys), after which the edited record must still be accepted: an edit
 * that produced invalid JSON would be a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsonl.h"
#include "record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct jsonl_limits lim = { 1 << 16, 64 };
    struct strv media, index;
    struct record_ctx ctx;
    struct jsonl_record rec, again;
    struct buf out;
    struct esd_err err;
    const char *p = (const char *)data, *end = p + size;
    uint64_t n = 0;

    strv_init(&media);
    strv_init(&index);
    strv_push(&media, "images");
    strv_push(&media, "a");
    strv_push(&index, "global_index");
    strv_push(&index, "k");
    ctx.media_keys = &media;
    ctx.index_keys = &index;
    ctx.media_root = "/nonexistent-media-root";
    jsonl_record_init(&rec, true);
    jsonl_record_init(&again, false);
    buf_init(&out);
    while (p <= end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        /* an exact-size copy so out-of-bounds reads are caught */
        char *line = malloc(len ? len : 1);
        bool edited = false;

        memcpy(line, p, len);
        if (jsonl_check(&rec, line, len, &lim) == 0) {
            if (record_normalize(&ctx, line, len, &rec, n++, &out, &edited, "f", 1, &err) == 0 &&
                edited && jsonl_check(&again, out.p, out.len, NULL) != 0)
                abort();
        } else {
            jsonl_error(&rec, &lim, "f", 1, &err);
        }
        free(line);
        if (!nl)
            break;
        p = nl + 1;
    }
    buf_free(&out);
    jsonl_record_free(&rec);
    jsonl_record_free(&again);
    strv_free(&media);
    strv_free(&index);
    return 0;
}
