/*
 * jsonl-check: a test tool. Reads JSONL from stdin and prints, for every
 * record, the verdict of libesd's validator: "ok", or the fault name
 * (blank, too_long, utf8, bom, syntax, depth, surrogate, not_object). The
 * differential test compares these verdicts with Python's json module.
 */
#include <stdio.h>
#include <unistd.h>

#include "jsonl.h"

int
main(void)
{
    static const char *const names[] = { "ok",     "blank", "too_long",  "utf8",      "bom",
                                         "syntax", "depth", "surrogate", "not_object" };
    struct jsonl_reader rd;
    struct jsonl_record rec;
    struct esd_err err;
    const char *line;
    size_t len;
    bool nl;
    int r;

    jsonl_reader_open_fd(&rd, STDIN_FILENO, "stdin", 0);
    jsonl_record_init(&rec, true);
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, &err)) == 1) {
        jsonl_check(&rec, line, len, NULL);
        puts(names[rec.fault]);
    }
    jsonl_record_free(&rec);
    jsonl_reader_close(&rd);
    if (r < 0) {
        fprintf(stderr, "jsonl-check: %s\n", err.msg);
        return 2;
    }
    return 0;
}
