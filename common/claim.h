/*
 * claim: claiming shards, leases and heartbeats (spec §8.3, DESIGN.md "What
 * esd adds"). Many nodes share one job directory; the only mutual exclusion
 * is the O_CREAT|O_EXCL create of state/locks/<id>.lock. Takeover of a
 * stale lock and every fenced step take flock(2) on the lock file, opened
 * read-write (NFS turns it into a POSIX lock, which needs write access),
 * and re-check the lock's inode and token, so esd and the reference's
 * workers can share a job on one machine.
 *
 * Leases. An esd lock records lease_secs; its owner refreshes the lock's
 * mtime every lease_secs/4 (claim_heartbeat). A lock is stale when its age
 * exceeds its lease_secs or, for a lock written by the reference (no
 * lease_secs), the manifest's lock_timeout_secs. Ages are judged on the
 * file server's clock only: "now" is the mtime of state/clock/<node>, just
 * touched, so a node's own clock never matters.
 *
 * Cost. A claimer remembers what never changes (done records; failed
 * records until a retry, rechecked when idle) and, for locks seen fresh,
 * the server time before which they cannot turn stale. A claim pass starts
 * at an offset derived from the node name and skips all of those without
 * touching the filesystem, so one claim costs a bounded number of syscalls
 * whatever the number of shards.
 */
#ifndef ESD_CLAIM_H
#define ESD_CLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "manifest.h"
#include "util.h"

#define CLAIM_LEASE_DEFAULT 60
#define CLAIM_MAX_INFRA_DEFAULT 10

struct claim_opts {
    const char *node;       /* node name: [A-Za-z0-9._-], used in state/clock/ */
    const char *hostname;   /* recorded as "hostname"; NULL: gethostname() */
    long long lease_secs;   /* <= 0: CLAIM_LEASE_DEFAULT */
    long long lock_timeout; /* for locks without a lease; <= 0: the manifest's */
    long long max_retries;  /* < 0: the manifest's */
    long long max_infra;    /* infrastructure failures allowed; <= 0: default 10 */
};

struct claimer {
    const struct manifest *m;
    char *node;
    char *hostname;
    long long lease_secs;
    long long lock_timeout;
    long long max_retries;
    long long max_infra;
    int clock_fd;          /* state/clock/<node>, kept open */
    double clock_server;   /* last server time read ... */
    double clock_mono;     /* ... and the monotonic time it was read at */
    bool clock_valid;
    size_t cursor;         /* where the next pass starts */
    unsigned char *known;  /* per shard: what this node knows (claim.c) */
    double *fresh_until;   /* per shard: server time before which its lock stays fresh */
    ino_t *lock_ino;       /* per shard: the lock file last read ... */
    dev_t *lock_dev;
    double *lock_threshold; /* ... and the staleness threshold it holds */
    size_t ndone, nfailed;
    bool primed;
    double locks_listed;   /* monotonic time of the last listing of state/locks */
    bool taken_valid;      /* the pass took a stale lock of shard taken_index over ... */
    size_t taken_index;
    char taken_from[128];  /* ... from this node (or host) */
};

/* One claimed shard, owned by the caller until claim_free. */
struct claim {
    size_t index;
    char *shard_id;
    char token[33];
    long long attempt_number;
    char *attempt_rel;  /* attempts/<id>/<NNNN>-<token> */
    char *attempt_dir;  /* absolute */
    char *lock_path;
    dev_t lock_dev;
    ino_t lock_ino;
    long long lease_secs;
    bool took_over;       /* the shard's stale lock was taken over ... */
    char taken_from[128]; /* ... from this node (or host) */
};

/* What a pass that claimed nothing saw. */
struct claim_idle {
    size_t done, failed;   /* known terminal shards */
    size_t busy;           /* locked by a live owner (or by this node) */
    bool complete;         /* every shard done */
    bool terminal;         /* every shard done or failed */
    double next_secs;      /* when a fresh lock could turn stale; -1: unknown */
};

/*
 * Sets up a claimer for manifest m (which must outlive it): validates the
 * node name, opens state/clock/<node>. Returns 0 or a negative errno.
 */
int claimer_init(struct claimer *c, const struct manifest *m, const struct claim_opts *o,
                 struct esd_err *err);
void claimer_free(struct claimer *c);

/*
 * The file server's "now": touches state/clock/<node> and reads its mtime.
 * Between such readings (at most CLAIM_CLOCK_RESYNC seconds apart) a claim
 * pass estimates the server time from the last reading and the monotonic
 * clock, and reads it again before any decision closer than
 * CLAIM_CLOCK_MARGIN seconds to a lease's end: the node's own wall clock
 * is never used.
 */
int claimer_now(struct claimer *c, double *ret_now, struct esd_err *err);

#define CLAIM_CLOCK_RESYNC 30.0
/* Longest wait of a blocking fence for a lock's flock (seconds). */
#define CLAIM_FENCE_WAIT 30.0
#define CLAIM_CLOCK_MARGIN 2.0

/*
 * One claim pass. Returns 1 with *ret filled (claim_free), 0 if nothing is
 * claimable now (*idle says why; may be NULL), or a negative errno. Shards
 * whose retry limits are used up get their failed record on the way.
 */
int claim_acquire(struct claimer *c, struct claim *ret, struct claim_idle *idle,
                  struct esd_err *err);

/*
 * Takes over, whatever its age, the lock of shard_id if it still holds
 * token: a claim of this node's previous run (which is known dead: esd
 * holds its state directory's lock) that need not wait for its lease.
 * Marks its attempt stale and moves the lock to state/stale_locks, as a
 * stale takeover does. Returns 1 taken over, 0 not ours any more (gone or
 * another claim's), or a negative errno.
 */
int claim_recover(struct claimer *c, const char *shard_id, const char *token,
                  struct esd_err *err);

/*
 * Renews the lease: refreshes the lock's mtime if the lock at lock_path is
 * still this claim's (same inode, same token). Returns 0, -ESTALE if the
 * lease is lost (err says how: removed, replaced or taken over), or
 * another negative errno for an I/O error (retry at the next heartbeat).
 */
int claim_heartbeat(const struct claim *cl, struct esd_err *err);

/*
 * Fenced release of a claim that ends without a result: removes the lock
 * if it is still ours. Returns 1 released, 0 not ours any more, or a
 * negative errno.
 */
int claim_release(const struct claim *cl, struct esd_err *err);

/*
 * Tells the claimer that a claim of its own ended (done, failed, lost or
 * released) so the shard is considered again or remembered as terminal.
 */
void claimer_forget(struct claimer *c, const struct claim *cl, bool done, bool failed);

void claim_free(struct claim *cl);

/*
 * Opens the lock at path read-write (fs_open_job: a link, a FIFO or a
 * device is refused), takes flock (waiting at most CLAIM_FENCE_WAIT seconds
 * unless nb, then -EWOULDBLOCK) and
 * checks that path still names it and that its token is token. Returns the
 * locked fd (close it with claim_unfence), -ESTALE if the lock is not (or
 * no longer) the one with that token, -EWOULDBLOCK when nb and busy, or a
 * negative errno.
 */
int claim_fence(const char *path, const char *token, bool nb, struct esd_err *err);
/* claim_fence on a claim's own lock: its token and the very file the claim
 * created (-ESTALE otherwise). */
int claim_fence_own(const struct claim *cl, struct esd_err *err);
void claim_unfence(int fd);

#endif
