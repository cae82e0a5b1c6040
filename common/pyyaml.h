/*
 * pyyaml: loads YAML as PyYAML's yaml.safe_load does, bit for bit, into a
 * tree that can be read as the Python value safe_load would return: with
 * bounded memory and time whatever the input (a node budget counted through
 * aliases at every use, a nesting cap).
 *
 * Scalars are typed as PyYAML's SafeLoader types them (YAML 1.1: null, bool
 * with yes/no/on/off, int incl. 0x, 0-prefixed octal, 0b and sexagesimal,
 * float incl. .inf/.nan, timestamps; quoted scalars are strings), so
 * "truthy" means what it means to Python. Merge keys ("<<") are honoured;
 * later duplicate keys win. Whatever safe_load would refuse (an unknown
 * tag, a value it cannot construct, an unhashable key, a bad merge) is
 * refused by pyyaml_parse with a message naming the line.
 */
#ifndef ESD_PYYAML_H
#define ESD_PYYAML_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

/* Node kinds. */
enum { PYYAML_SCALAR, PYYAML_SEQ, PYYAML_MAP };
/* Python types of scalars; MERGE and VALUE are PyYAML's "<<" and "=". */
enum {
    PYYAML_STR,
    PYYAML_NULL,
    PYYAML_BOOL,
    PYYAML_INT,
    PYYAML_FLOAT,
    PYYAML_TS,
    PYYAML_MERGE,
    PYYAML_VALUE
};

struct pyyaml_node {
    unsigned char kind;
    unsigned char type; /* scalars */
    unsigned char bad;  /* why safe_load could not construct it (pyyaml.c) */
    bool done;          /* complete: aliases to it may be expanded */
    bool ival_ok;       /* ints and bools: ival holds the exact value */
    unsigned long line; /* 1-based */
    size_t size;        /* nodes in the alias-expanded subtree */
    size_t height;      /* sequence/mapping nesting inside, 0 for scalars */
    char *tag;          /* explicit tag as libyaml resolved it, or NULL */
    char *val;          /* scalars: value, NUL-terminated, may hold NULs */
    size_t len;
    long long ival;
    double fval;
    struct pyyaml_node **kids; /* sequences: items; mappings: key, value, key, … */
    size_t n, cap;
};

struct pyyaml_anchor;

/* A loaded document; it owns every node. */
struct pyyaml_doc {
    const char *name; /* for messages */
    size_t max_nodes;
    size_t max_depth;
    struct pyyaml_node **all; /* every node, in creation order; owns them */
    size_t nall, capall;
    struct pyyaml_anchor *anch; /* open addressing, capanch a power of two */
    size_t nanch, capanch;
    struct pyyaml_node *root; /* NULL for an empty stream */
    size_t count;             /* nodes so far, aliases expanded */
};

/*
 * Parses data[0..len) into *d (overwritten) and checks that safe_load could
 * construct every node. name is used in messages ("recipe <name>:3: …")
 * and must outlive d; max_depth is capped at 1000. Returns 0, or -EINVAL
 * (-ENOMEM) with err set. Whatever it returns, the caller calls
 * pyyaml_free(d).
 */
int pyyaml_parse(struct pyyaml_doc *d, const char *data, size_t len, const char *name,
                 size_t max_nodes, size_t max_depth, struct esd_err *err);

/* Frees every node of d (not d itself). */
void pyyaml_free(struct pyyaml_doc *d);

/* nd is a Python str (a "=" key is one too). */
bool pyyaml_is_str(const struct pyyaml_node *nd);

/* nd is the Python str s. */
bool pyyaml_str_is(const struct pyyaml_node *nd, const char *s);

/* nd is None. */
bool pyyaml_is_null(const struct pyyaml_node *nd);

/* "scalar", "sequence" or "mapping", for messages. */
const char *pyyaml_kind_name(const struct pyyaml_node *nd);

/*
 * The value the dict PyYAML builds from the mapping m holds for the str key
 * name, or NULL; *ret_key (may be NULL) is set to the key node that won.
 */
const struct pyyaml_node *pyyaml_map_get(const struct pyyaml_node *m, const char *name,
                                         const struct pyyaml_node **ret_key);

/*
 * Calls fn on the pairs of the mapping m in the order flatten_mapping
 * leaves them (merged pairs first, duplicates not folded) until fn returns
 * false; returns false then, true otherwise.
 */
bool pyyaml_map_each(const struct pyyaml_node *m,
                     bool (*fn)(const struct pyyaml_node *k, const struct pyyaml_node *v,
                                void *arg),
                     void *arg);

/* Python truthiness of the constructed value. */
bool pyyaml_truthy(const struct pyyaml_node *nd);

/*
 * Python equality of two scalar keys: str, None, numbers (True == 1 ==
 * 1.0), timestamps by their text.
 */
bool pyyaml_key_equal(const struct pyyaml_node *a, const struct pyyaml_node *b);

/*
 * Python str() of the value, collections cut at 4096 bytes. Returns 0 with
 * *ret set (caller frees), or -ERANGE for an int Python 3.11 will not print.
 */
int pyyaml_str(const struct pyyaml_node *nd, char **ret);

/* Python repr() of the value, cut at 4096 bytes. Caller frees. */
char *pyyaml_repr(const struct pyyaml_node *nd);

/* For messages: repr() shortened to about 120 bytes. Caller frees. */
char *pyyaml_msg_repr(const struct pyyaml_node *nd);

/* For messages: str() of a str (repr() of anything else), shortened. Caller frees. */
char *pyyaml_msg_str(const struct pyyaml_node *nd);

/*
 * Appends nd to o in YAML's flow style, as text PyYAML's safe_load reads
 * back as the value safe_load made of nd: mappings flattened (merge keys
 * applied, later duplicates kept in order so that they still win), strings
 * double-quoted with what its reader refuses escaped, ints, floats and
 * timestamps as their own text under their resolved tag (!!int "0x1A"), so
 * that the constructor PyYAML chose the first time runs on the same text.
 */
void pyyaml_emit(const struct pyyaml_node *nd, struct buf *o);

#endif
