/*
 * fuzz_zsrc: libFuzzer target for the decompressing JSONL reader. The first
 * byte picks the file's name (.jsonl.gz or .jsonl.zst), the rest is the
 * file: every line the reader gives is checked, as prepare does, and on
 * success or failure alike the reader must have passed on exactly the
 * file's bytes as raw data (a prefix of them on a fault), given text that
 * matches the lines it returned, and named the file in any error.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jsonl.h"
#include "zsrc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct seen {
    const uint8_t *file;
    size_t size, raw, text;
};

static void
on_raw(void *ctx, const char *p, size_t n)
{
    struct seen *s = ctx;

    /* in order, never past the file */
    if (s->raw + n > s->size || memcmp(p, s->file + s->raw, n) != 0)
        abort();
    s->raw += n;
}

static void
on_text(void *ctx, const char *p, size_t n)
{
    ((struct seen *)ctx)->text += n;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct jsonl_limits lim = { 1 << 16, 64 };
    static char path[2][64];
    struct jsonl_record rec;
    struct jsonl_reader rd;
    struct esd_err err;
    struct seen s = { 0 };
    const char *line;
    size_t len, lines_bytes = 0;
    bool nl;
    int which, r;
    FILE *f;

    if (size < 1)
        return 0;
    which = data[0] & 1;
    if (!path[0][0]) {
        snprintf(path[0], sizeof(path[0]), "/tmp/fuzz_zsrc.%d.jsonl.gz", (int)getpid());
        snprintf(path[1], sizeof(path[1]), "/tmp/fuzz_zsrc.%d.jsonl.zst", (int)getpid());
    }
    s.file = data + 1;
    s.size = size - 1;
    if (!(f = fopen(path[which], "wb")) || fwrite(s.file, 1, s.size, f) != s.size || fclose(f))
        abort();
    if (jsonl_reader_open_as(&rd, path[which], which ? ZSRC_ZSTD : ZSRC_GZIP, lim.max_line, &err) <
        0)
        abort();
    rd.on_data = on_raw;
    rd.on_data_ctx = &s;
    rd.on_text = on_text;
    rd.on_text_ctx = &s;
    jsonl_record_init(&rec, false);
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, &err)) == 1) {
        if (jsonl_check(&rec, line, len, &lim) < 0)
            jsonl_error(&rec, &lim, path[which], rd.lineno, &err);
        lines_bytes += len + nl;
    }
    /* a complete stream: all of the file read, all of the text in lines */
    if (r == 0 && (s.raw != s.size || rd.offset != s.size || lines_bytes != s.text))
        abort();
    if (r < 0 && r != -EFBIG && !strstr(err.msg, path[which]))
        abort();
    jsonl_reader_close(&rd);
    jsonl_record_free(&rec);
    unlink(path[which]);
    return 0;
}
