/*
 * tries: the attempts of one shard as its directory attempts/<shard_id>/
 * holds them (spec §5.4, §8.3): the names of attempt directories, the
 * failures their attempt.json files record, the terminal rule that weighs
 * those against the limits, the first attempt.json of a claim and the mark
 * of one taken over.
 *
 * It sits below both claim (which counts, records and marks while it holds
 * a shard's lock) and attempt (which counts again when an attempt fails),
 * so it knows neither a claim nor a claimer: only the manifest, names,
 * and the rule's limits (struct tries_rule).
 */
#ifndef ESD_TRIES_H
#define ESD_TRIES_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "manifest.h"
#include "util.h"

/*
 * The number of a well-formed attempt directory name "<digits>-<token>" (4
 * to 9 digits, a 32-character lowercase hex token), or -1 for any other name.
 */
long long tries_name_number(const char *name);

/* Failures recorded in the attempts of a shard. */
struct tries_counts {
    long long attempts; /* the last attempt number in use: the next is attempts + 1 */
    long long counted;  /* toward max_retries: processor and output */
    long long infra;    /* toward the infrastructure limit */
    long long here;     /* of counted: the failures of the node tries_count_by names */
    int nodes;          /* nodes whose attempts make up counted: 0, 1, or 2 for two or more */
    bool truncated;     /* the directory held more than was looked at */
};

/*
 * Reads the attempts of a shard, attempts/<shard_id>/: failures by class
 * from each attempt.json, and the attempt number in use. Attempts written
 * by the reference have no class: "failed" counts toward max_retries,
 * "stale" as infrastructure. Unreadable attempt.json files are ignored, as
 * the reference ignores them.
 *
 * The directory is the owner's and every peer's to write, so only
 * well-formed attempts count: a directory (not a link to one) named
 * "<number>-<token>", 4 to 9 digits and 32 lowercase hex digits, as claims
 * name them; any other entry is ignored. Each attempt.json is read without
 * following a link or waiting on a FIFO, a regular file of at most 16 MiB.
 * The work is bounded: at most 8192 entries of any name are looked at (the
 * count is of those, and ret->truncated is set: junk hides attempts only
 * from its owner's own shard), and more than 1024 well-formed attempts, or
 * more than 32 MiB of attempt.json in all, is -E2BIG with a message naming
 * the directory, and the shard is not claimed until it is cleaned up. A missing
 * directory is no attempts; a link in its place is an error.
 *
 * Numbering: the reference's next number is the count of directories + 1
 * (spec §8.3 step 5). Here attempts = max(highest number seen, count of
 * well-formed attempts), so junk never shifts it; without junk and gaps
 * both agree (numbers 1..n, or repeats of a number from concurrent
 * reference claims: the count is larger then, as the reference has it);
 * after a gap (attempts removed by hand) the reference would repeat a
 * number, this continues after the highest. Names stay unique by token
 * either way.
 */
int tries_count(const struct manifest *m, const char *shard_id, struct tries_counts *ret,
                struct esd_err *err);

/*
 * tries_count, and the failures attributed to nodes: an attempt belongs
 * to the node its attempt.json names ("node", else "hostname", as the
 * reference's workers record only that); ret->here counts the counted
 * failures of node (NULL: none), ret->nodes how many nodes failed. An
 * attempt that names neither counts as a node of its own, so that failures
 * nobody can be told apart by keep the reference's rule.
 */
int tries_count_by(const struct manifest *m, const char *shard_id, const char *node,
                   struct tries_counts *ret, struct esd_err *err);

/*
 * A node is alive if its state/clock/<node> (touched at least every
 * CLAIM_CLOCK_RESYNC seconds while it makes claim passes) or a lock it
 * holds (renewed every lease/4) was modified this recently on the server's
 * clock: three missed resyncs. (claim.h, above this module, is not seen
 * from here; check_tries asserts that this stays 3 * CLAIM_CLOCK_RESYNC.)
 */
#define TRIES_PEER_ALIVE_SECS 90.0

/* Who applies the terminal rule, and the limits (claimer_rule: a
 * claimer's). The strings are not owned. */
struct tries_rule {
    const char *job_dir;
    const char *node;     /* its state/clock/<node> and the "node" of its records */
    const char *hostname; /* the "hostname" of its locks (the reference's) */
    long long max_retries;
    long long max_infra;
};

/* What the counts of a shard let the rule's node do. */
enum tries_limit {
    TL_OPEN,     /* under the limits, or used up by other nodes only: claim it */
    TL_TERMINAL, /* used up: publish the failed record */
    TL_LEFT,     /* this node alone used up max_retries while another node lives:
                    the shard is left to the others */
};

/*
 * The terminal rule. The infrastructure limit is the fleet's, as before.
 * max_retries used up is terminal only when at least two nodes failed the
 * shard, or when no other node has been alive in the last
 * TRIES_PEER_ALIVE_SECS (a one-node fleet still fails a bad shard); a
 * shard only this node failed is left to the live others (TL_LEFT), and one
 * only other nodes failed is open to this node. Only when the retries are
 * used up, touches state/clock/<node> (the server's time, through a
 * descriptor of its own) and looks at state/clock and state/locks; what
 * cannot be read there counts as no other node.
 */
enum tries_limit tries_limit(const struct tries_rule *rule, const struct tries_counts *n);

/*
 * Writes the first attempt.json of a new claim in attempt_dir, which must
 * exist: the fields of claim (not taken: the lock's content, spec §5.3),
 * status "running" and input_path. Created exclusively and fsync'ed.
 */
int tries_record_start(const char *attempt_dir, const cJSON *claim, const char *input_path,
                       struct esd_err *err);

/* The attempt.json at path read as tries_count reads it (no link followed,
 * no FIFO or device waited on, a regular file of at most 16 MiB holding a
 * JSON object), or NULL. Caller frees. */
cJSON *tries_json_load(const char *path);

/* Marks a taken-over attempt stale (only if still "running"). attempt.json
 * is read as tries_count reads it: a link, FIFO or device there is
 * nothing to mark. */
int tries_mark_stale(const struct manifest *m, const char *attempt_rel, struct esd_err *err);

#endif
