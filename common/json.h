/*
 * json: metadata JSON in the reference's exact style (spec §5.1) on top of
 * cJSON trees: "pretty" files (sorted keys, 2-space indent, raw UTF-8,
 * trailing newline, like Python's json.dumps(indent=2, sort_keys=True,
 * ensure_ascii=False)) and one-line claim files (sorted keys, ", " and ": "
 * separators). Floats are written as Python's repr() writes them.
 *
 * cJSON stores every number as a double. Values that must keep exact
 * digits (floats in repr form, integers above 2^53 such as mtime_ns) are
 * created as cJSON raw nodes through json_float()/json_int() and printed
 * verbatim. cJSON is pointed at libesd's aborting allocator by json_init().
 */
#ifndef ESD_JSON_H
#define ESD_JSON_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "util.h"

enum json_style {
    JSON_PRETTY, /* indent 2, sorted keys, "\n" at the end */
    JSON_LINE,   /* one line, sorted keys, ", " and ": ", "\n" at the end */
    JSON_COMPACT /* one line, sorted keys, "," and ":", no newline */
};

/* Points cJSON at the aborting allocators. Idempotent; call once early. */
void json_init(void);

/* Appends v serialised in style to out. */
void json_dump(const cJSON *v, enum json_style style, struct buf *out);

/* Appends s (n bytes of UTF-8) as a JSON string literal, quotes included,
 * escaped as Python's json.dumps(ensure_ascii=False) escapes. */
void json_escape(struct buf *out, const char *s, size_t n);

/* Python repr() of a double: shortest round trip, "1e+16", "1e-05",
 * "100.0", "nan"→"NaN", "inf"→"Infinity". out holds 32 bytes. */
void json_repr_double(double v, char out[32]);

/* New raw nodes carrying exact number text (owned by the caller until
 * added to a tree). */
cJSON *json_float(double v);
cJSON *json_int(long long v);
/* cJSON_AddItemToObject for the two above. */
void json_add_float(cJSON *obj, const char *key, double v);
void json_add_int(cJSON *obj, const char *key, long long v);
void json_add_str(cJSON *obj, const char *key, const char *s);
void json_add_bool(cJSON *obj, const char *key, bool v);
/* Sets (replaces or adds) key to item, taking ownership of item. */
void json_set(cJSON *obj, const char *key, cJSON *item);

/*
 * Reads path (at most max bytes, through fs_read_job: a symbolic link, a
 * FIFO or a device is refused, never followed or waited on) and parses it;
 * it must be a JSON object. Errors read "Unable to read JSON file <path>: …" or "Expected a JSON
 * object in <path>". The caller owns *ret (cJSON_Delete).
 */
int json_load_object(const char *path, size_t max, cJSON **ret, struct esd_err *err);

/* The same for len bytes of text (need not be NUL-terminated); name is
 * the file name used in messages. */
int json_parse_object(const char *text, size_t len, const char *name, cJSON **ret,
                      struct esd_err *err);

/* Typed getters; NULL / false when absent or of another type. */
const char *json_get_str(const cJSON *obj, const char *key);
/* Integer-valued number (or raw integer) into *ret; -EINVAL otherwise. */
int json_get_int(const cJSON *obj, const char *key, long long *ret);
/* Any number (or raw number) into *ret. */
int json_get_num(const cJSON *obj, const char *key, double *ret);
bool json_get_bool(const cJSON *obj, const char *key, bool *ret);

/* Serialises v in style and writes it to path with fs_write_atomic. */
int json_write_atomic(const char *path, const cJSON *v, enum json_style style, struct esd_err *err);
/* Serialises v and publishes it to path with fs_publish_excl. */
int json_publish_excl(const char *path, const cJSON *v, enum json_style style, struct esd_err *err);

#endif
