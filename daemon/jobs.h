/*
 * jobs: the job registry. A job given to this node is a small JSON file
 * under <state_dir>/jobs/<key>.json ({"job_dir", "output", "uid", "ino",
 * "dev", "state", "error", "spool", "ended_unix", "updated_at"}), so it
 * survives restarts, until it is forgotten (jobs_forget); with
 * spool_dir set, every file <spool_dir>/<key>.json (registered there by
 * any node's esd: only files owned by root or esd's own uid are read) is
 * adopted by every node. The key is the first 16 hex digits of the
 * SHA-256 of the resolved job directory, the same on every node. Both
 * places are read again at once when the kernel reports a change (inotify,
 * which sees this node's writes only) and every poll_interval_secs (which
 * sees other nodes' writes on NFS too).
 *
 * A registration binds what was checked when the job was submitted: the
 * resolved directory (no symbolic link on its path), its inode (and on
 * this node its device), its owner, and an output inside it. The
 * directory is never resolved again: at every rescan, before loading and
 * before merging it is opened without following a link and compared, and
 * a registration that no longer matches is refused, logged once, and not
 * worked until it is submitted again. A spool entry is checked the same
 * way, as a submit by the job's owner would be; so is the registry of an
 * esd that runs as a service user (whose attempts could write it).
 *
 * Loading a job (its manifest, the recipe snapshot's hash, the version
 * check) runs in a helper process as the job's owner; the daemon reads
 * back only the manifest's compact form.
 *
 * A job is active (claims are made), draining (this node takes no more of
 * its shards), finalizing (every shard is done; one node merges), complete,
 * failed (a shard failed terminally, or the merge failed) or cancelled.
 */
#ifndef ESD_JOBS_H
#define ESD_JOBS_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "claim.h"
#include "config.h"
#include "helper.h"
#include "log.h"
#include "manifest.h"
#include "spawn.h"
#include "util.h"

struct attempt_final;
struct djversion;

/* Shards failed here that are watched for a done record of another node. */
#define JOBS_BADNODE_TRACK 16
/* This many of them done elsewhere: the node stops claiming the job. */
#define JOBS_BADNODE_SHARDS 3

enum job_state {
    JOB_ACTIVE,
    JOB_DRAINING,
    JOB_FINALIZING,
    JOB_COMPLETE,
    JOB_FAILED,
    JOB_CANCELLED
};

/* "active", "draining", "finalizing", "complete", "failed", "cancelled". */
extern const char *const job_state_name[];

struct job {
    struct job *next;
    char key[17];
    char *job_dir;      /* resolved */
    char *output;       /* merged output; default <job_dir>/merged.jsonl */
    char *reg_path;     /* <state_dir>/jobs/<key>.json */
    struct log_job log; /* how the log names it (log_job_init of job_dir) */
    enum job_state state;
    char *error;      /* why it failed */
    bool loaded;      /* manifest and claimer ready */
    char *load_error; /* the last reason it could not be loaded (retried) */
    struct manifest m;
    struct claimer claimer;
    /* A whole recipe's global stage (common/gstage.h), once the shards'
     * outputs are merged (prefix.json): its pseudo-shard's own manifest and
     * claimer; claims and attempts of the job then go through these. */
    bool gstage;
    struct manifest gm;
    struct claimer gclaimer;
    char *gstage_error;      /* the last reason it could not be entered, logged once */
    uid_t uid;               /* owner of the job directory, bound at submit */
    gid_t gid;               /* the owner's primary group (user database) */
    ino_t ino;               /* the directory bound at submit ... */
    dev_t dev;               /* ... as this node sees it (0: not yet seen here) */
    struct spawn_cred owner; /* the owner in the user database (uid 0: not looked up) */
    char *refused;           /* why the registration no longer matches its directory */
    struct jobload *load;    /* the loading helper while it runs */
    double load_after;       /* monotonic: no new loading before */
    double next_claim;       /* monotonic time of the next claim pass */
    struct claim_idle idle;  /* what the last empty pass saw */
    bool idle_valid;
    size_t running;  /* attempts of this job running here */
    double proc_avg; /* this node's mean time of its processor (runner.c), 0: none yet */
    unsigned long done_here, failed_here; /* outcomes on this node */
    unsigned long failed_by_class[3];     /* metrics.c: failed attempts here by class */
    unsigned merge_failures; /* merges here that failed for a transient cause in a row */
    unsigned fail_streak;    /* its attempts failed in a row here ... */
    double paused_until;     /* ... and the monotonic time before which it
                              is not claimed from (sched.c) */
    unsigned long long rows_here;
    /* a bad node (jobs_attempt_ended): the shards whose attempts failed
     * here and were not done since, how many of those another node did,
     * and why this node claims no more of the job (NULL: it does) */
    size_t failed_idx[JOBS_BADNODE_TRACK];
    size_t nfailed_idx;
    unsigned done_elsewhere;
    double badnode_checked; /* monotonic time of the last look */
    char *stopped;
    void *finalize;            /* finalize.c's state while finalizing */
    bool seen;                 /* rescan bookkeeping */
    bool cancelled_everywhere; /* by the job dir's marker (persisted) */
    bool from_spool;           /* adopted from the spool (persisted) */
    double ended_at;           /* wall time it became complete, failed or cancelled; 0: not over */
    double rate_t0, rate_t1;   /* jobs_rate's snapshots (monotonic) */
    size_t rate_d0, rate_d1;
};

/*
 * A bad node cannot fail a job: called at the end of each attempt here.
 * A failure toward max_retries (processor, output) puts its shard on the
 * job's watch list, a success here takes it off. When a claim pass asks
 * (jobs_load), the watched shards are looked at, at most once a poll
 * interval: one whose done record exists was done by another node. Once
 * JOBS_BADNODE_SHARDS such shards were seen, this node's processor fails
 * what works elsewhere: it claims no more of the job (j->stopped says
 * why, in status as "refused" and in the journal, once) until the job is
 * submitted again or esd restarts.
 */
void jobs_attempt_ended(struct job *j, const struct attempt_final *fin);

/*
 * The global stage of j (a loaded job whose manifest has one): entered
 * once its prefix.json is there, read as the job's owner. 1 entered (or
 * already in it), 0 not yet (the shards' outputs are not merged), or a
 * negative errno with err set (a broken record: logged here, once while
 * the reason stays the same, since every poll of a waiting node asks).
 */
int jobs_global_enter(struct job *j, struct esd_err *err);
/* The manifest and claimer that j's claims go through now: the global
 * stage's once entered, else the job's. */
const struct manifest *jobs_manifest(const struct job *j);
struct claimer *jobs_claimer(struct job *j);

/* Reads the registry (and the spool). Start-up errors only. */
int jobs_init(struct ev_loop *loop, const struct esd_conf *c, struct esd_err *err);
/* Applies a reloaded configuration (spool_dir, state_dir stay as they were). */
void jobs_reconfigure(const struct esd_conf *c);
void jobs_fini(void);

/* changed is called after a change of the registry or spool directory
 * was seen (and the registrations read again). */
void jobs_set_changed(void (*changed)(void));
/*
 * The modules above the registry are told through what they set at their
 * init, so that it never calls up (make modcheck): removed, when job j
 * leaves the registry (before it is freed; the scheduler's round robin);
 * unloaded, before j's claimer and manifest go, unloaded or freed (warm
 * processors of j); view_changed, when what a job shows changed (one
 * appeared, loaded, ended or went; jobview). NULL: nobody is told.
 */
void jobs_set_removed(void (*removed)(const struct job *j));
void jobs_set_unloaded(void (*unloaded)(const struct job *j));
void jobs_set_view_changed(void (*view_changed)(void));

/* Reads the registry and the spool again; new jobs are added active. */
void jobs_rescan(void);

struct job *jobs_first(void);
size_t jobs_count(void);

/*
 * True when j can be worked (its manifest loaded, its claimer set up, its
 * directory not refused by jobs_check_bound).
 * Otherwise starts loading it if it is not loading yet (a helper process
 * as the owner; when it ends, the changed callback runs) and returns
 * false; a failure is logged once and tried again after a poll interval.
 */
bool jobs_load(struct job *j);

/*
 * Checks that j's directory is still the one bound at submit (opened
 * without following a link: same inode, same owner, no symbolic link on
 * its path). 0, or a negative errno with err saying what changed; the
 * first mismatch is logged and refuses the job until it is submitted
 * again.
 */
int jobs_check_bound(struct job *j, struct esd_err *err);

/* The identity of j's helpers and attempts: its owner from the user
 * database (esd's own when esd is not root). */
void jobs_helper_id(const struct job *j, struct helper_id *ret);

/*
 * A claim this node holds is recorded in <state_dir>/claims while it runs
 * (record) and no longer once it has ended (forget). When esd starts again
 * after a crash, loading a job takes back at once the claims its previous
 * run left (claim_recover) instead of waiting for their leases. esd locks
 * <state_dir>/esd.lock so that no two daemons share a state directory.
 */
void jobs_claim_record(struct job *j, const struct claim *cl);
void jobs_claim_forget(struct job *j, const struct claim *cl);

/*
 * While esd runs as root, what it does in a job directory it does with the
 * file system identity of the directory's owner (setfsuid, setfsgid): the
 * files and directories it creates there are the owner's, and permission
 * checks (symbolic links planted by the owner included) are the owner's.
 * jobs_fs_owner switches to j's owner and jobs_fs_self back to esd's own
 * identity (for its state_dir); both return the identity before, for
 * jobs_fs_restore. No-ops when esd does not run as root.
 */
struct fsid {
    uid_t uid;
    gid_t gid;
    bool set;
};
struct fsid jobs_fs_owner(const struct job *j);

/* The interpreter of this node's Data-Juicer processor (djversion's
 * python), or NULL when the processor is not Data-Juicer's own. */
const char *jobs_dj_python(void);
/* What this node's processor runs (jobs_init read it; reread at reload). */
const struct djversion *jobs_djversion(void);
struct fsid jobs_fs_self(void);
/* Any uid and gid: the control socket resolves a caller's paths as the caller. */
struct fsid jobs_fs_as(uid_t uid, gid_t gid);
void jobs_fs_restore(struct fsid prev);

/* Records a new state (and error), persists it, logs it once. */
void jobs_set_state(struct job *j, enum job_state state, const char *error);

/*
 * Registers job_dir (resolved by its owner, who submits it; st is what
 * that owner's stat of it gave) with output (resolved, inside job_dir;
 * NULL: the default) on this node, or in the spool when spool is true; by
 * is the caller's uid, recorded. Binds the registration to st (inode and
 * owner). Returns the job or NULL with err set.
 */
struct job *jobs_register(const char *job_dir, const struct stat *st, const char *output,
                          bool spool, uid_t by, struct esd_err *err);

/* Forgets what was loaded of j (manifest, claims seen) so that it is read
 * again; false (nothing done) while attempts or a merge of j run. */
bool jobs_reset(struct job *j);
/* The job of job_dir (resolved), or NULL. */
struct job *jobs_find(const char *job_dir);

/* The spool directory this node reads (spool_dir as esd started), or NULL. */
const char *jobs_spool_dir(void);

/*
 * What other nodes recorded in the spool about the registration of job_dir
 * that they refuse: an array of {"node", "why"} (at most 64), empty when
 * none or no spool_dir. The caller frees it.
 */
cJSON *jobs_spool_refusals(const char *job_dir);
/*
 * cancel --everywhere: writes <job_dir>/state/esd/cancelled.json as the
 * directory's owner (uid, gid), which every node's rescan sees, and
 * removes the job's spool registration. by is the caller, recorded.
 */
int jobs_cancel_everywhere(const char *job_dir, uid_t uid, gid_t gid, uid_t by,
                           struct esd_err *err);
/* Whether that marker exists. */
bool jobs_cancelled_everywhere(const struct job *j);
/* Removes it (submit again). */
void jobs_uncancel(struct job *j);
/* Shards done per second over the last minute or two, fleet-wide, and the
 * seconds left at that rate; -1 when not known yet. */
#define RATE_WINDOW 60.0
void jobs_rate(struct job *j, double *ret_shards_per_sec, double *ret_eta);
/* The status of every job, for the control socket. */
cJSON *jobs_status_json(void);

/*
 * Forgetting (esctl forget, retention_secs). A job that is over and has
 * nothing running here leaves this node: its registry file goes and it
 * leaves the in-memory list (so status, list, metrics and the scheduler
 * drop it); its job directory is not touched. Its spool entry, if any:
 * FORGET_HERE keeps it but records in <state_dir>/forgotten/<key>.json
 * which version of it was forgotten, so that this node does not adopt it
 * again unless it is submitted again (a new entry); FORGET_EVERYWHERE
 * replaces it with a tombstone ({"job_dir", "forgotten": true}) that
 * every node reads at its next rescan: a node where the job is over
 * forgets it too, a node where it still runs keeps it until it is over
 * there, and no node adopts it; FORGET_ENDED (retention) removes the
 * entry of a job that was merged or failed (the fleet is done with it)
 * and keeps the others as FORGET_HERE does. why is logged. j is freed.
 */
enum jobs_forget_how { FORGET_HERE, FORGET_EVERYWHERE, FORGET_ENDED };
void jobs_forget(struct job *j, enum jobs_forget_how how, const char *why);
/* The job may be forgotten now: over, and nothing of it runs here. */
bool jobs_forgettable(const struct job *j);
/* forget --everywhere of a job this node does not hold: writes the
 * spool's tombstone of job_dir if the spool has an entry for it. 0, or
 * -ENOENT (no entry), or another negative errno with err set. */
int jobs_forget_spool(const char *job_dir, struct esd_err *err);

/* list --all: the spool's entries of jobs this node does not hold
 * ({"key", "job_dir", "state": "forgotten" or "spooled" (not adopted yet), "loaded":
 * false, "spool_entry"}). Caller deletes. */
cJSON *jobs_spool_unheld_json(void);

/* Done/total shards known here, for STATUS= lines. */
void jobs_progress(const struct job *j, size_t *done, size_t *total);

#endif
