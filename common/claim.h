/*
 * claim: claiming shards, leases and heartbeats (spec §8.3, ARCHITECTURE.md "What
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
 * records until a retry) and, for locks seen fresh, the server time before
 * which they cannot turn stale. It follows the job through the mtimes of
 * state/locks, state/done and state/failed (each read on a fresh open and
 * fstat): a directory is listed again only when it changed, so the end of
 * a shard elsewhere is learnt from one listing shared by all shards, and a
 * shard done since is passed on one stat of its done record, never a lock.
 * A claim pass starts at an offset derived from the node name, skips what
 * it knows without touching the filesystem and stops after
 * CLAIM_PASS_BUDGET shards that cost a syscall (claim_idle.more: call
 * again soon, it resumes there), so one call is bounded work whatever the
 * number of shards and nodes.
 *
 * Idle. A pass that claimed nothing reports in claim_idle.min_secs how
 * long to wait so that its shared metadata operations keep to
 * CLAIM_IDLE_RATE a second (callers wait no longer than a poll); foreign
 * locks are looked at again only when their cached lease could
 * have ended, at most CLAIM_JUDGE_RATE a second (burst CLAIM_JUDGE_BURST). A lock that appeared between two
 * listings of state/locks is not looked at before one of our own leases:
 * most shards end first, so their locks are never read by other nodes.
 *
 * Cancel. Every pass, and every claim again once its lock is held and
 * before its attempt starts, stats state/esd/cancelled.json (esctl cancel
 * --everywhere): a cancelled job claims nothing (claim_idle.cancelled).
 *
 * Suspect mtimes. A lock whose mtime is in the future by more than
 * CLAIM_MTIME_FUTURE or before CLAIM_MTIME_FLOOR (an NFSv3 exclusive
 * create keeps its verifier there until the creator's SETATTR) is never
 * taken over on that mtime: it is judged on how long this claimer has
 * seen that very mtime unchanged on that very inode.
 */
#ifndef ESD_CLAIM_H
#define ESD_CLAIM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#include "manifest.h"
#include "tries.h"
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
    int clock_fd;        /* state/clock/<node>, kept open */
    double clock_server; /* last server time read ... */
    double clock_mono;   /* ... and the monotonic time it was read at */
    bool clock_valid;
    size_t cursor;        /* where the next pass starts */
    unsigned char *known; /* per shard: what this node knows (claim.c) */
    double *fresh_until;  /* per shard: server time before which its lock stays fresh */
    ino_t *lock_ino;      /* per shard: the lock file last read ... */
    dev_t *lock_dev;
    double *lock_threshold; /* ... and the staleness threshold it holds */
    size_t ndone, nfailed;
    unsigned char *locked;     /* per shard: a lock was listed in state/locks */
    double *retry_at;          /* per shard: monotonic time before which this node does not
                              claim it again (claim_backoff) ... */
    unsigned char *fails_here; /* ... after this many counted failures here */
    bool taken_valid;          /* the pass took a stale lock of shard taken_index over ... */
    size_t taken_index;
    char taken_from[128];      /* ... from this node (or host) */
    struct claim_dir {         /* state/locks, state/done, state/failed */
        struct timespec mtime; /* as last listed */
        bool listed;
        bool unsettled; /* listed within a timestamp granule of a change: list again */
        double checked; /* monotonic time of the last look at its mtime */
        double at;      /* ... and of the last listing */
    } dirs[3];
    char *cancel_path;     /* state/esd/cancelled.json ... */
    bool cancelled;        /* ... seen by the last pass */
    size_t woken;          /* shards made claimable by listings (requeued, unlocked) */
    double tokens;         /* judgements of foreign locks allowed now ... */
    double tokens_at;      /* ... as of this monotonic time */
    struct claim_suspect { /* locks with an absurd mtime, as first seen */
        size_t index;
        dev_t dev;
        ino_t ino;
        struct timespec mtime;
        double since; /* monotonic; 0: free entry */
    } suspects[16];
    struct claim_stats {                  /* since claimer_init (esd(8) status "claims") */
        unsigned long long locks_created; /* O_EXCL creations that succeeded */
        unsigned long long claimed;       /* of which became claims */
        unsigned long long passed_done;   /* shards learnt done elsewhere, no lock made */
        unsigned long long ops;           /* shared metadata operations of passes */
    } stats;
};

/* One claimed shard, owned by the caller until claim_free. */
struct claim {
    size_t index;
    char *shard_id;
    char token[33];
    long long attempt_number;
    char *attempt_rel; /* attempts/<id>/<NNNN>-<token> */
    char *attempt_dir; /* absolute */
    char *lock_path;
    dev_t lock_dev;
    ino_t lock_ino;
    long long lease_secs;
    bool took_over;       /* the shard's stale lock was taken over ... */
    char taken_from[128]; /* ... from this node (or host) */
};

/* What a pass that claimed nothing saw. */
struct claim_idle {
    size_t done, failed; /* known terminal shards */
    size_t busy;         /* locked by a live owner (or by this node) */
    bool complete;       /* every shard done */
    bool terminal;       /* every shard done or failed */
    double next_secs;    /* when a fresh lock could turn stale; -1: unknown */
    double min_secs;     /* wait at least this long (CLAIM_IDLE_RATE), or a poll */
    bool more;           /* the pass stopped at its budget: call again soon */
    bool cancelled;      /* the job is cancelled on every node */
};

/*
 * Sets up a claimer for manifest m (which must outlive it): validates the
 * node name, opens state/clock/<node>. Returns 0 or a negative errno.
 */
int claimer_init(struct claimer *c, const struct manifest *m, const struct claim_opts *o,
                 struct esd_err *err);
void claimer_free(struct claimer *c);

/* The terminal rule (tries_limit) as claimer c applies it: its node, job
 * and limits. The strings stay c's. */
struct tries_rule claimer_rule(const struct claimer *c);

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

/* Shards that cost a syscall in one claim_acquire call, and its time. */
#define CLAIM_PASS_BUDGET 16
#define CLAIM_PASS_SECS 0.02
/* Shared metadata operations a second of a claimer that claims nothing. */
#define CLAIM_IDLE_RATE 1.0
/* Judgements of foreign locks whose cached lease ran out: rate, burst. */
#define CLAIM_JUDGE_RATE 0.4
#define CLAIM_JUDGE_BURST 4.0
/* A directory listed less than this ago is not listed again in a pass
 * that may still claim (the shard's done record is stat'ed instead). */
#define CLAIM_RELIST_SECS 2.0
/* The mtimes of state/done and state/failed are looked at, even without
 * a change of state/locks, at least this often (records written without
 * a lock: the reference's "retry limit reached before claim", a retry). */
#define CLAIM_RECHECK_SECS 30.0
/* Lock mtimes beyond these are suspect (seconds; epoch seconds). */
#define CLAIM_MTIME_FUTURE 60.0
#define CLAIM_MTIME_FLOOR 946684800.0

/*
 * Retries of a shard on one node back off: after its n-th counted failure
 * on this node, this claimer does not claim it again for
 * CLAIM_BACKOFF_BASE * 2^(n-1) seconds, at most CLAIM_BACKOFF_MAX, with
 * +-20 % jitter (other nodes may claim it at once), so that a shard that
 * fails fast does not spin on one node. A pass that claims nothing says
 * in idle->next_secs when the earliest backoff ends. Returns the delay.
 */
#define CLAIM_BACKOFF_BASE 0.5
#define CLAIM_BACKOFF_MAX 30.0
double claim_backoff(struct claimer *c, size_t index);

/*
 * One claim pass. Returns 1 with *ret filled (claim_free), 0 if nothing is
 * claimable now (*idle says why; may be NULL), or a negative errno. Shards
 * whose retry limits are used up get their failed record on the way. A 0
 * with idle->more set means the pass stopped at its budget: call again
 * after a turn of the event loop; otherwise wait at least idle->min_secs.
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
int claim_recover(struct claimer *c, const char *shard_id, const char *token, struct esd_err *err);

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

/*
 * Election locks (the merge's state/esd/finalize.lock, esd run's
 * coordination locks): O_EXCL files holding a token, renewed by their
 * holder through their mtime, moved aside once stale. claim_lock_renew
 * refreshes the mtime if path still holds token: 0, -ESTALE (taken over
 * or removed; err says how), -EWOULDBLOCK (being judged now) or another
 * negative errno. claim_lock_release removes it if it still holds token.
 * claim_lock_move_stale moves it to <path>.stale.<hex> if, judged again
 * under the fence on the very file moved, its age at the server time now
 * exceeds lease: 1 moved, 2 stale but the rename failed (*ret_age, if not
 * NULL, its age, in both), 0 not stale (fresh, busy, or gone).
 */
int claim_lock_renew(const char *path, const char *token, struct esd_err *err);
void claim_lock_release(const char *path, const char *token);
int claim_lock_move_stale(const char *path, double now, double lease, double *ret_age);

#endif
