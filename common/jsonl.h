/*
 * jsonl: scanning and validation of JSONL records exactly as the reference
 * accepts them (spec §6.3), without building a tree: split on "\n" only,
 * blank lines refused, strict UTF-8, a leading BOM refused, Python's JSON
 * grammar (NaN, Infinity and -Infinity accepted, raw control characters in
 * strings refused, any whitespace of " \t\r" around tokens), and an object
 * at the top level. Unlike the reference, a lone surrogate escape such as
 * "\ud800" is refused with a clear message instead of crashing later.
 *
 * Nesting depth and record length are bounded (struct jsonl_limits) and
 * exceeding them is a reported fault. When asked, the scanner also returns
 * the byte spans of the top-level object's members, which is all that
 * record normalisation needs to edit a record in place.
 */
#ifndef ESD_JSONL_H
#define ESD_JSONL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define JSONL_MAX_LINE_DEFAULT ((size_t)256 << 20)
#define JSONL_MAX_DEPTH_DEFAULT 1000u

struct jsonl_limits {
    size_t max_line;    /* bytes in one record, without its "\n" */
    unsigned max_depth; /* nested arrays/objects, the top-level one counts */
};

/* The defaults above. */
extern const struct jsonl_limits jsonl_default_limits;

enum jsonl_fault {
    JSONL_OK = 0,
    JSONL_BLANK,      /* empty, or only ASCII whitespace */
    JSONL_TOO_LONG,   /* longer than max_line */
    JSONL_UTF8,       /* not strict UTF-8 */
    JSONL_BOM,        /* starts with a UTF-8 byte order mark */
    JSONL_SYNTAX,     /* not JSON */
    JSONL_DEPTH,      /* nested deeper than max_depth */
    JSONL_SURROGATE,  /* \uD800-\uDFFF escape not forming a pair */
    JSONL_NOT_OBJECT, /* valid JSON, but not an object */
};

/* One member of the top-level object: spans are offsets into the record. */
struct jsonl_member {
    size_t key_off, key_len; /* raw bytes between the key's quotes */
    size_t val_off, val_len; /* the value's bytes, no surrounding whitespace */
    bool key_escaped;        /* the raw key contains a backslash */
};

/* Result of jsonl_check; reusable across records (init once, free once). */
struct jsonl_record {
    enum jsonl_fault fault;
    size_t fault_off;   /* 0-based byte offset of the fault */
    const char *detail; /* static description for UTF8/SYNTAX/DEPTH/SURROGATE */
    bool want_members;  /* fill members[] for a top-level object */
    size_t nmembers;
    size_t members_cap;
    struct jsonl_member *members;
    size_t obj_open;  /* offset of the top-level '{' */
    size_t obj_close; /* offset of the top-level '}' */
};

void jsonl_record_init(struct jsonl_record *rec, bool want_members);
void jsonl_record_free(struct jsonl_record *rec);

/*
 * Checks one record (p, n: the line without its "\n"). Returns 0 if valid,
 * -EINVAL with rec->fault/fault_off/detail set otherwise. lim may be NULL
 * for the defaults. Never reads outside [p, p + n).
 */
int jsonl_check(struct jsonl_record *rec, const char *p, size_t n, const struct jsonl_limits *lim);

/*
 * Formats rec's fault as the operator sees it, naming file and line:
 * "Blank JSONL record at a.jsonl:3", "Invalid UTF-8 at a.jsonl:3: … at
 * byte 7", "Invalid JSON at a.jsonl:3: expected ':' at byte 12",
 * "JSONL record must be an object at a.jsonl:3", … (bytes counted from 1).
 * Returns -EINVAL.
 */
int jsonl_error(const struct jsonl_record *rec, const struct jsonl_limits *lim, const char *file,
                unsigned long long line, struct esd_err *err);

/*
 * Decodes the JSON string body s[0..n) (validated, without quotes) into
 * UTF-8, appending to out. Surrogate pairs are combined.
 */
void jsonl_unescape(const char *s, size_t n, struct buf *out);

/* Strict UTF-8 check of a whole buffer; offset of the first bad byte. */
bool jsonl_utf8_valid(const char *p, size_t n, size_t *ret_bad);

/* Appends p[0..n) to out with every invalid UTF-8 sequence (and every NUL
 * byte) replaced by U+FFFD: text from elsewhere made fit for a JSON string. */
struct buf;
void jsonl_utf8_clean(const char *p, size_t n, struct buf *out);

/*
 * Streaming line reader over a file: yields records split on "\n" only,
 * with 1-based line numbers, in bounded memory (a record longer than
 * max_line is an error, never a larger buffer). Every raw byte read is
 * passed, in order, to on_data when set (raw SHA-256 of the file, …), and
 * every byte of the text, as read, to on_text when set. A compressed file
 * (zsrc) is read as its decompressed text: lines and line numbers are the
 * text's, on_data sees the compressed bytes, on_text the text.
 */
struct zsrc;
struct jsonl_reader {
    int fd;
    char *path;
    char *buf;
    size_t cap, beg, end, scan;
    bool eof;
    unsigned long long lineno;
    uint64_t offset; /* bytes of the file consumed: those of the returned lines, or for a
                        compressed file the raw bytes read so far */
    size_t max_line;
    void (*on_data)(void *ctx, const char *p, size_t n);
    void *on_data_ctx;
    void (*on_text)(void *ctx, const char *p, size_t n);
    void *on_text_ctx;
    struct zsrc *z; /* a compressed file's decompressor, or NULL */
    /* The records are decoded from the bytes read (a decompressing
     * reader): on_data's bytes are not their text. False for a plain file,
     * whose records, block after block, are exactly the bytes on_data saw,
     * so that a consumer may hash the blocks instead of copying them. */
    bool decoded;
};

/* Opens path for reading (O_CLOEXEC): a regular file, a link to one (a
 * FIFO or a device is refused, never waited on); max_line 0 means the
 * default. The file is read as it is (a ".gz" too): see
 * jsonl_reader_open_as. */
int jsonl_reader_open(struct jsonl_reader *r, const char *path, size_t max_line,
                      struct esd_err *err);
/* The same, reading the file as compression says (zsrc.h's enum zsrc_kind,
 * as an int: 0 is plain): a gzip or zstd file is decompressed as it is
 * read, on a thread of its own. */
int jsonl_reader_open_as(struct jsonl_reader *r, const char *path, int compression, size_t max_line,
                         struct esd_err *err);
/* The same over fd, any readable descriptor (standard input), which the
 * reader then owns; name is shown in messages. */
void jsonl_reader_open_fd(struct jsonl_reader *r, int fd, const char *name, size_t max_line);
/*
 * Next record: 1 with *ret_line and *ret_len (without "\n"; valid until the
 * next call) and *ret_nl (whether a "\n" ended it), 0 at end of file, or a
 * negative errno with err set ("JSONL record longer than N bytes at f:l",
 * "cannot read f: …", for a compressed file "f: truncated gzip stream at
 * byte 1234 (line 56)", the line being the one reached in the text).
 */
int jsonl_reader_next(struct jsonl_reader *r, const char **ret_line, size_t *ret_len, bool *ret_nl,
                      struct esd_err *err);
/*
 * Next block of whole records, for a pipeline (common/pipeline.h): 1 with
 * *ret_p and *ret_len (valid until the next call; every "\n" included)
 * and *ret_lines, its records; 0 at end of file; or a negative errno with
 * err set, the errors of jsonl_reader_next, each reported after the
 * records before it. A block ends at the first end of a record at or after
 * want bytes, or at the end of the file, where its last record may lack
 * its "\n": its bounds depend on the bytes alone, never on how they were
 * read. The reader then holds at most want + max_line + 4 MiB.
 */
int jsonl_reader_block(struct jsonl_reader *r, size_t want, const char **ret_p, size_t *ret_len,
                       unsigned long long *ret_lines, struct esd_err *err);
void jsonl_reader_close(struct jsonl_reader *r);

#endif
