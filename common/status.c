/*
 * status: shard states from directory listings of state/done, state/failed
 * and state/locks, so a status pass costs three readdirs plus one stat per
 * lock instead of several syscalls per shard.
 */
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "tries.h"

const char *const status_state_name[ST__COUNT] = {
    "pending", "running", "stale", "done", "failed",
};

const char *const status_phase_name[PHASE__COUNT] = {
    "shards", "merging", "global", "final merge", "complete", "failed",
};

/* A copy of obj[key], or JSON null when it is missing. The raw value, not
 * a string: status --json shows a record's "hostname" and "pid" as the
 * file has them (spec §5.9), whatever their type, as the reference does. */
static cJSON *
value_or_null(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

    return v ? cJSON_Duplicate(v, true) : cJSON_CreateNull();
}

/* rel below the job directory jobfd as a JSON object, or NULL (a job
 * file: no link followed, no FIFO, at most max bytes). */
static cJSON *load_at(int dirfd, const char *rel, size_t max, size_t *ret_len);

/* Reads a done or failed record, or a lock: owner (and pid, error). */
static cJSON *
read_record(int jobfd, const char *rel, struct shard_status *s, bool want_error)
{
    cJSON *j = load_at(jobfd, rel, 1 << 20, NULL);
    const char *h;

    if (!j) {
        s->metadata_error = true;
        return NULL;
    }
    if ((h = json_get_str(j, "hostname")))
        s->owner = xstrdup(h);
    if ((h = json_get_str(j, "node")))
        s->node = xstrdup(h);
    if (want_error && (h = json_get_str(j, "last_error")))
        s->error = xstrdup(h);
    else if (!want_error)
        s->owner_value = value_or_null(j, "hostname");
    return j;
}

/*
 * One shard's state into s, from what the listings found of id (done,
 * failed, locked) and, with details, its records; the lock is always read
 * (its age and lease). A shard's and the global stage's pseudo-shard
 * "_global" alike. With ret_done, the done record read (details) is handed
 * over instead of freed.
 */
static void
shard_read(int jobfd, const char *id, bool done, bool failed, bool locked, long long lock_timeout,
           bool details, const struct timespec *now, struct shard_status *s, cJSON **ret_done)
{
    char *rel;

    /* spec §9's precedence, first match wins: done, failed, lock */
    if (done) {
        s->state = ST_DONE;
        if (details) {
            cJSON *j;

            rel = xasprintf("state/done/%s.json", id);
            j = read_record(jobfd, rel, s, false);
            if (ret_done)
                *ret_done = j;
            else
                cJSON_Delete(j);
            free(rel);
        }
    } else if (failed) {
        s->state = ST_FAILED;
        if (details) {
            rel = xasprintf("state/failed/%s.json", id);
            cJSON_Delete(read_record(jobfd, rel, s, true));
            free(rel);
        }
    } else if (locked) {
        struct stat sb;
        long long timeout = lock_timeout;
        cJSON *lock = NULL;
        long long v;

        rel = xasprintf("state/locks/%s.lock", id);
        if (fstatat(jobfd, rel, &sb, 0) < 0) {
            /* released between the listing and now */
            s->state = ST_PENDING;
            free(rel);
            return;
        }
        s->lock_age = (double)(now->tv_sec - sb.st_mtim.tv_sec) +
                      (double)(now->tv_nsec - sb.st_mtim.tv_nsec) / 1e9;
        if (s->lock_age < 0)
            s->lock_age = 0;
        s->has_age = true;
        if ((lock = read_record(jobfd, rel, s, false))) {
            s->pid_value = value_or_null(lock, "pid");
            if (json_get_int(lock, "pid", &s->pid) == 0)
                s->has_pid = true;
            /* an esd lock carries its own lease; a reference lock
             * has none and goes by the job's lock timeout (claim.h) */
            if (json_get_int(lock, "lease_secs", &v) == 0 && v > 0)
                timeout = v;
        }
        cJSON_Delete(lock);
        free(rel);
        s->state = s->lock_age > (double)timeout ? ST_STALE : ST_RUNNING;
    } else {
        s->state = ST_PENDING;
    }
}

static void
shard_status_free(struct shard_status *s)
{
    free(s->owner);
    free(s->node);
    free(s->error);
    cJSON_Delete(s->owner_value);
    cJSON_Delete(s->pid_value);
    memset(s, 0, sizeof(*s));
}

int
status_compute(const struct manifest *m, long long lock_timeout, bool details,
               struct job_status *ret, struct esd_err *err)
{
    struct job_status st = { 0 };
    bool *done = xcalloc(m->nshards, sizeof(bool));
    bool *failed = xcalloc(m->nshards, sizeof(bool));
    bool *locked = xcalloc(m->nshards, sizeof(bool));
    struct timespec now;
    int r, jobfd = -1;

    if (lock_timeout <= 0)
        lock_timeout = m->lock_timeout_secs;
    /* Three listings instead of a stat per shard per state (spec §16.4's
     * cost). They are not one snapshot: a shard published between the
     * done listing and the locks listing (done record linked, then the
     * lock removed) shows as pending for this pass. Errors go that way
     * only: a shard is never shown done before its record exists. */
    if ((r = manifest_list_state(m, "done", ".json", done, err)) < 0 ||
        (r = manifest_list_state(m, "failed", ".json", failed, err)) < 0 ||
        (r = manifest_list_state(m, "locks", ".lock", locked, err)) < 0)
        goto out;
    jobfd = open(m->job_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (jobfd < 0) {
        r = err_sys(err, -errno, "cannot open %s", m->job_dir);
        goto out;
    }
    /* Lock ages on this machine's wall clock against the server's mtime,
     * as the reference's status does (spec §9). Claims judge staleness on
     * the server's clock (claimer_now); status only displays "stale" and
     * reclaims nothing, so a skew here misleads nobody's decision. */
    clock_gettime(CLOCK_REALTIME, &now);
    st.total = m->nshards;
    st.shards = xcalloc(m->nshards, sizeof(*st.shards));
    for (size_t i = 0; i < m->nshards; i++)
        shard_read(jobfd, m->shards[i].id, done[i], failed[i], locked[i], lock_timeout, details,
                   &now, &st.shards[i], NULL);
    for (size_t i = 0; i < m->nshards; i++)
        st.counts[st.shards[i].state]++;
    st.complete = st.counts[ST_DONE] == st.total;
    st.terminal = st.counts[ST_DONE] + st.counts[ST_FAILED] == st.total;
    if (m->global_snapshot) {
        st.global = xcalloc(1, sizeof(*st.global));
        status_global_read(jobfd, m, lock_timeout, st.counts, st.global);
    }
    *ret = st;
    st.shards = NULL;
out:
    if (jobfd >= 0)
        close(jobfd);
    free(done);
    free(failed);
    free(locked);
    return r;
}

/* Whether rel exists below jobfd (a name: a link counts, as a listing
 * would show it). */
static bool
present_at(int jobfd, const char *rel)
{
    struct stat sb;

    return fstatat(jobfd, rel, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

/* The last attempt number in use under attempts/_global/, as tries_count
 * numbers them (the highest well-formed name, or their count if more),
 * from the names alone: a status reads no attempt.json. */
static long long
global_attempts(int jobfd)
{
    int fd = fs_open_dir_beneath(jobfd, "attempts/" STATUS_GLOBAL_ID, NULL, NULL);
    long long high = 0, n = 0, k;
    struct dirent *e;
    DIR *d;

    if (fd < 0)
        return 0;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return 0;
    }
    /* bounded as tries_count bounds it */
    for (size_t seen = 0; seen < 8192 && (e = readdir(d)); seen++)
        if ((k = tries_name_number(e->d_name)) >= 0) {
            n++;
            if (k > high)
                high = k;
        }
    closedir(d);
    return high > n ? high : n;
}

void
status_global_read(int jobfd, const struct manifest *m, long long lock_timeout,
                   const size_t counts[ST__COUNT], struct global_status *ret)
{
    struct global_status g = { 0 };
    struct timespec now;
    cJSON *done = NULL, *j;
    const char *x;
    bool all_done = counts[ST_DONE] == m->nshards;

    g.input_rows = g.rows = -1;
    g.duration = -1;
    clock_gettime(CLOCK_REALTIME, &now);
    /* the pseudo-shard exactly as a shard, with details */
    shard_read(jobfd, STATUS_GLOBAL_ID, present_at(jobfd, "state/done/" STATUS_GLOBAL_ID ".json"),
               present_at(jobfd, "state/failed/" STATUS_GLOBAL_ID ".json"),
               present_at(jobfd, "state/locks/" STATUS_GLOBAL_ID ".lock"), lock_timeout, true, &now,
               &g.s, &done);
    if (done) {
        json_get_int(done, "rows", &g.rows);
        if ((x = json_get_str(done, "sha256")))
            g.sha256 = xstrdup(x);
        if (json_get_num(done, "duration_secs", &g.duration) < 0 || g.duration < 0)
            g.duration = -1;
        cJSON_Delete(done);
    }
    g.attempts = global_attempts(jobfd);
    if ((g.prefix = present_at(jobfd, STATUS_GLOBAL_PREFIX)) &&
        (j = load_at(jobfd, STATUS_GLOBAL_PREFIX, (1 << 20), NULL))) {
        json_get_int(j, "rows", &g.input_rows);
        cJSON_Delete(j);
    }
    if ((j = load_at(jobfd, "merge.json", (1 << 20), NULL))) {
        g.stages = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, "stages"));
        cJSON_Delete(j);
    }
    if ((j = load_at(jobfd, "state/esd/finalize.json", (1 << 20), NULL))) {
        if ((x = json_get_str(j, "status")))
            g.final_status = xstrdup(x);
        cJSON_Delete(j);
    }
    /* the phases of the contract, the later ones first */
    if (g.s.state == ST_FAILED)
        g.phase = PHASE_FAILED;
    else if (!all_done)
        g.phase = PHASE_SHARDS;
    else if (g.final_status && !strcmp(g.final_status, "failed"))
        g.phase = PHASE_FAILED;
    else if (g.s.state == ST_DONE &&
             (g.stages || (g.final_status && !strcmp(g.final_status, "complete"))))
        g.phase = PHASE_COMPLETE;
    else if (g.s.state == ST_DONE)
        g.phase = PHASE_FINAL;
    else if (g.prefix)
        g.phase = PHASE_GLOBAL;
    else
        g.phase = PHASE_MERGING;
    *ret = g;
}

void
status_global_free(struct global_status *g)
{
    shard_status_free(&g->s);
    free(g->sha256);
    free(g->final_status);
    memset(g, 0, sizeof(*g));
}

/* What a shard's (or the global stage's) entry says of its lock and records
 * beside its owner and pid. */
static void
shard_state_json(const struct shard_status *s, cJSON *x)
{
    if (s->node)
        json_add_str(x, "node", s->node);
    if (s->has_age)
        json_add_float(x, "lock_age_secs", s->lock_age);
    if (s->state == ST_FAILED) {
        if (s->error)
            json_add_str(x, "error", s->error);
        else
            cJSON_AddNullToObject(x, "error");
    }
    if (s->metadata_error)
        json_add_bool(x, "metadata_error", true);
}

void
status_global_json(const struct manifest *m, const struct global_status *g, cJSON *o)
{
    const struct shard_status *s = &g->s;
    cJSON *x, *ops;

    json_add_str(o, "phase", status_phase_name[g->phase]);
    x = cJSON_AddObjectToObject(o, "global");
    json_add_str(x, "shard_id", STATUS_GLOBAL_ID);
    json_add_str(x, "status", status_state_name[s->state]);
    if (s->owner)
        json_add_str(x, "owner", s->owner);
    if (s->has_pid)
        json_add_int(x, "pid", s->pid);
    shard_state_json(s, x);
    if (g->rows >= 0)
        json_add_int(x, "rows", g->rows);
    if (g->sha256)
        json_add_str(x, "sha256", g->sha256);
    if (g->duration >= 0)
        json_add_float(x, "duration_secs", g->duration);
    if (g->input_rows >= 0)
        json_add_int(x, "input_rows", g->input_rows);
    json_add_int(x, "last_attempt", g->attempts);
    ops = m->global_ops_json ? cJSON_Parse(m->global_ops_json) : NULL;
    cJSON_AddItemToObject(x, "operators", ops ? ops : cJSON_CreateArray());
    json_add_int(x, "shard_operators", m->global_shard_ops);
    if (m->global_executor)
        json_add_str(x, "executor_type", m->global_executor);
}

void
status_free(struct job_status *st)
{
    for (size_t i = 0; st->shards && i < st->total; i++)
        shard_status_free(&st->shards[i]);
    free(st->shards);
    if (st->global)
        status_global_free(st->global);
    free(st->global);
    memset(st, 0, sizeof(*st));
}

/* The finalize election's word on the merge, as "merge": {"status":
 * complete, failed or merging, "node", "error", "rows"}; nothing while no
 * node has been elected (esd's daemons; a job merged with esctl merge has
 * merge.json instead). */
void
status_merge_json(const struct manifest *m, cJSON *o)
{
    char *result = xasprintf("%s/state/esd/finalize.json", m->job_dir);
    char *lock = xasprintf("%s/state/esd/finalize.lock", m->job_dir);
    cJSON *rec = NULL, *x;
    long long rows;

    /* the record first: finalize writes it before it removes the lock,
     * so while both exist the merge is decided, not running */
    if (json_load_object(result, 1 << 20, &rec, NULL) == 0) {
        x = cJSON_AddObjectToObject(o, "merge");
        json_add_str(x, "status",
                     json_get_str(rec, "status") ? json_get_str(rec, "status") : "unknown");
        if (json_get_str(rec, "node"))
            json_add_str(x, "node", json_get_str(rec, "node"));
        if (json_get_str(rec, "error"))
            json_add_str(x, "error", json_get_str(rec, "error"));
        if (json_get_int(rec, "rows", &rows) == 0)
            json_add_int(x, "rows", rows);
    } else if (json_load_object(lock, 1 << 16, &rec, NULL) == 0) {
        x = cJSON_AddObjectToObject(o, "merge");
        json_add_str(x, "status", "merging");
        if (json_get_str(rec, "node"))
            json_add_str(x, "node", json_get_str(rec, "node"));
    }
    cJSON_Delete(rec);
    free(result);
    free(lock);
}

cJSON *
status_json(const struct manifest *m, const struct job_status *st)
{
    cJSON *o = cJSON_CreateObject(), *counts, *shards;

    json_add_str(o, "job_id", m->job_id);
    json_add_str(o, "job_dir", m->job_dir);
    cJSON_AddItemToObject(
        o, "execution", m->execution_json ? cJSON_Parse(m->execution_json) : cJSON_CreateObject());
    json_add_int(o, "total", (long long)st->total);
    counts = cJSON_AddObjectToObject(o, "counts");
    for (int k = 0; k < ST__COUNT; k++)
        json_add_int(counts, status_state_name[k], (long long)st->counts[k]);
    json_add_bool(o, "complete", st->complete);
    json_add_bool(o, "terminal", st->terminal);
    status_merge_json(m, o);
    if (st->global)
        status_global_json(m, st->global, o);
    shards = cJSON_AddArrayToObject(o, "shards");
    for (size_t i = 0; i < st->total; i++) {
        const struct shard_status *s = &st->shards[i];
        cJSON *x = cJSON_CreateObject();

        json_add_str(x, "shard_id", m->shards[i].id);
        json_add_int(x, "rows", m->shards[i].rows);
        json_add_str(x, "status", status_state_name[s->state]);
        if (s->owner_value)
            cJSON_AddItemToObject(x, "owner", cJSON_Duplicate(s->owner_value, true));
        if (s->pid_value)
            cJSON_AddItemToObject(x, "pid", cJSON_Duplicate(s->pid_value, true));
        shard_state_json(s, x);
        cJSON_AddItemToArray(shards, x);
    }
    return o;
}

void
status_counts_text(const struct job_status *st, struct buf *out)
{
    for (int k = 0; k < ST__COUNT; k++)
        buf_printf(out, "%s%s=%zu", k ? " " : "", status_state_name[k], st->counts[k]);
}

/* ---- views ----
 *
 * A view is status computed in steps of a bounded cost (status_view_step),
 * so that esd's event loop can keep the status of a 100,000-shard job
 * without ever blocking on it. Each shard keeps two states: the one being
 * read and the one of the last complete reading, so readers always see a
 * whole reading, never half of two. Done records are read once, since
 * they never change while the job directory is the same. */

/* A view's byte a shard: the state of the reading in progress (bits 0-2),
 * that of the last complete reading (bits 3-5), and whether its done
 * record was summarised (read once: done records never change). */
#define VB_NEXT 0x07
#define VB_CUR_SHIFT 3
#define VB_CUR 0x38
#define VB_SUMMARISED 0x80
#define COST_RECORD 16
#define LOCK_MAX_BYTES (1 << 16)
#define RECORD_MAX_BYTES (1 << 20)

enum { PH_NONE, PH_DONE, PH_FAILED, PH_LOCKS, PH_RECORDS };

static const char *const phase_dir[] = { NULL, "state/done", "state/failed", "state/locks" };
static const char *const phase_suffix[] = { NULL, ".json", ".json", ".lock" };

void
status_view_init(struct status_view *v, const struct manifest *m)
{
    memset(v, 0, sizeof(*v));
    v->nshards = m->nshards;
    v->bits = xcalloc(m->nshards ? m->nshards : 1, 1);
    v->host = xcalloc(m->nshards ? m->nshards : 1, sizeof(*v->host));
    v->node = xcalloc(m->nshards ? m->nshards : 1, sizeof(*v->node));
    v->jobfd = -1;
}

static void
details_free(struct status_detail *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(d[i].owner);
        free(d[i].node);
        free(d[i].error);
    }
    free(d);
}

void
status_view_abort(struct status_view *v)
{
    if (v->dir)
        closedir(v->dir);
    v->dir = NULL;
    if (v->jobfd >= 0)
        close(v->jobfd);
    v->jobfd = -1;
    details_free(v->next_details, v->next_ndetails);
    v->next_details = NULL;
    v->next_ndetails = 0;
    v->phase = PH_NONE;
}

void
status_view_free(struct status_view *v)
{
    status_view_abort(v);
    for (size_t i = 0; i < v->nnodes; i++)
        free(v->nodes[i].name);
    free(v->nodes);
    details_free(v->details, v->ndetails);
    if (v->global)
        status_global_free(v->global);
    free(v->global);
    for (size_t i = 0; i < v->nnames; i++)
        free(v->names[i]);
    free(v->names);
    free(v->host);
    free(v->node);
    free(v->bits);
    memset(v, 0, sizeof(*v));
    v->jobfd = -1;
}

/* The node of that name (added when new; NULL name: none). */
static struct status_node *
view_node(struct status_view *v, const char *name)
{
    if (!name || !*name)
        return NULL;
    for (size_t i = 0; i < v->nnodes; i++)
        if (!strcmp(v->nodes[i].name, name))
            return &v->nodes[i];
    /* bounded by what records name; a job has a fleet's worth */
    v->nodes = xrealloc(v->nodes, (v->nnodes + 1) * sizeof(*v->nodes));
    memset(&v->nodes[v->nnodes], 0, sizeof(*v->nodes));
    v->nodes[v->nnodes].name = xstrdup(name);
    return &v->nodes[v->nnodes++];
}

double
status_parse_time(const char *s)
{
    struct tm tm = { 0 };
    int y, mo, d, h, mi, n = 0;
    double sec, off = 0;
    const char *p;
    time_t t;

    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%lf%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
        mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec < 0 || sec >= 61)
        return -1;
    p = s + n;
    if (*p == '+' || *p == '-') {
        int oh, om;

        if (sscanf(p + 1, "%2d:%2d", &oh, &om) != 2)
            return -1;
        off = (*p == '+' ? 1 : -1) * (oh * 3600.0 + om * 60.0);
    } else if (*p && strcmp(p, "Z") != 0) {
        return -1;
    }
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    t = timegm(&tm);
    return (double)t + sec - off;
}

/* Reads rel below dirfd as a JSON object, or NULL; *ret_len (if not
 * NULL) gets the bytes read. */
static cJSON *
load_at(int dirfd, const char *rel, size_t max, size_t *ret_len)
{
    char *text = NULL;
    size_t len = 0;
    cJSON *j = NULL;

    if (fs_read_job_at(dirfd, rel, NULL, max, &text, &len, NULL) == 0)
        json_parse_object(text, len, rel, &j, NULL);
    if (ret_len)
        *ret_len = len;
    free(text);
    return j;
}

/* The object in the open file fd (at most max bytes), or NULL. */
static cJSON *
load_fd(int fd, size_t max)
{
    char *text = xmalloc(max + 1);
    size_t len = 0;
    ssize_t n;
    cJSON *j = NULL;

    while (len < max && (n = read(fd, text + len, max - len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            free(text);
            return NULL;
        }
        len += (size_t)n;
    }
    text[len] = '\0';
    json_parse_object(text, len, "lock", &j, NULL);
    free(text);
    return j;
}

/* name's index + 1 in v->names (added when new), 0 for none or when the
 * table is full. Two bytes a shard instead of a pointer: a job has a
 * fleet's worth of names, not one per shard. */
static unsigned short
intern(struct status_view *v, const char *name)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < v->nnames; i++)
        if (!strcmp(v->names[i], name))
            return (unsigned short)(i + 1);
    if (v->nnames >= 65535)
        return 0;
    v->names = xrealloc(v->names, (v->nnames + 1) * sizeof(*v->names));
    v->names[v->nnames++] = xstrdup(name);
    return (unsigned short)v->nnames;
}

/* A done record, once: its node's done count, its times. Returns the
 * bytes read (a step's budget counts them: a record may be large). */
static size_t
summarise_done(struct status_view *v, const struct manifest *m, size_t i)
{
    char *rel = xasprintf("state/done/%s.json", m->shards[i].id);
    size_t len;
    cJSON *j = load_at(v->jobfd, rel, RECORD_MAX_BYTES, &len);
    const char *who;
    double end, dur = -1;
    struct status_node *n;

    free(rel);
    v->bits[i] |= VB_SUMMARISED;
    v->summarised++;
    if (!j) {
        v->unreadable++;
        return len;
    }
    who = json_get_str(j, "node") ? json_get_str(j, "node") : json_get_str(j, "hostname");
    if ((n = view_node(v, who)))
        n->done++;
    v->host[i] = intern(v, json_get_str(j, "hostname"));
    v->node[i] = intern(v, json_get_str(j, "node"));
    end = status_parse_time(json_get_str(j, "completed_at"));
    if (json_get_num(j, "duration_secs", &dur) == 0 && dur >= 0 && dur < 1e9) {
        v->dur_sum += dur;
        v->dur_n++;
    } else {
        dur = 0;
    }
    if (end > 0) {
        if (!v->last_end || end > v->last_end)
            v->last_end = end;
        if (!v->first_start || end - dur < v->first_start)
            v->first_start = end - dur;
    }
    cJSON_Delete(j);
    return len;
}

static struct status_detail *
next_detail(struct status_view *v, size_t i, enum shard_state state)
{
    struct status_detail *d;

    if (v->next_ndetails >= STATUS_VIEW_DETAILS)
        return NULL;
    v->next_details = xrealloc(v->next_details, (v->next_ndetails + 1) * sizeof(*d));
    d = &v->next_details[v->next_ndetails++];
    memset(d, 0, sizeof(*d));
    d->index = i;
    d->state = state;
    return d;
}

/* One lock of the listing: running or stale, by its age and lease. */
static void
view_lock(struct status_view *v, const struct manifest *m, size_t i, const char *name)
{
    struct stat sb;
    struct timespec now;
    cJSON *j;
    long long timeout = v->lock_timeout, lease;
    double age;
    const char *who;
    struct status_detail *d;
    struct status_node *n;
    int fd;
    enum shard_state state;

    /* opened as a job file (no FIFO, no device, bounded), and aged by the
     * fstat of the open file: on NFS the open revalidates the attributes
     * that a bare stat may take from its cache (spec §16.1) */
    fd = fs_open_job_at(dirfd(v->dir), name, NULL, O_RDONLY, 0, LOCK_MAX_BYTES, &sb, NULL);
    if (fd < 0)
        return; /* released since the listing: pending */
    j = load_fd(fd, LOCK_MAX_BYTES);
    close(fd);
    clock_gettime(CLOCK_REALTIME, &now);
    age =
        (double)(now.tv_sec - sb.st_mtim.tv_sec) + (double)(now.tv_nsec - sb.st_mtim.tv_nsec) / 1e9;
    if (age < 0)
        age = 0;
    if (j && json_get_int(j, "lease_secs", &lease) == 0 && lease > 0)
        timeout = lease;
    state = age > (double)timeout ? ST_STALE : ST_RUNNING;
    v->bits[i] = (unsigned char)((v->bits[i] & ~VB_NEXT) | state);
    who = j ? (json_get_str(j, "node") ? json_get_str(j, "node") : json_get_str(j, "hostname"))
            : NULL;
    if ((n = view_node(v, who))) {
        if (state == ST_STALE)
            n->next_stale++;
        else
            n->next_running++;
    }
    if ((d = next_detail(v, i, state))) {
        d->lock_age = age;
        d->metadata_error = !j;
        if (j && json_get_str(j, "hostname"))
            d->owner = xstrdup(json_get_str(j, "hostname"));
        if (j && json_get_str(j, "node"))
            d->node = xstrdup(json_get_str(j, "node"));
        if (j && json_get_int(j, "pid", &d->pid) == 0)
            d->has_pid = true;
    }
    cJSON_Delete(j);
}

static void
failed_detail(struct status_view *v, const struct manifest *m, size_t i)
{
    char *rel = xasprintf("state/failed/%s.json", m->shards[i].id);
    cJSON *j = load_at(v->jobfd, rel, RECORD_MAX_BYTES, NULL);
    struct status_detail *d = next_detail(v, i, ST_FAILED);

    free(rel);
    if (d) {
        d->metadata_error = !j;
        if (j && json_get_str(j, "last_error"))
            d->error = xstrdup(json_get_str(j, "last_error"));
        if (j && json_get_str(j, "node"))
            d->node = xstrdup(json_get_str(j, "node"));
    }
    cJSON_Delete(j);
}

static int
detail_cmp(const void *a, const void *b)
{
    const struct status_detail *x = a, *y = b;

    return x->index < y->index ? -1 : x->index > y->index;
}

/* The listings are complete: their states become the view's (the done
 * records not summarised yet are read after, without changing them). */
static void
view_publish(struct status_view *v, const struct manifest *m)
{
    memset(v->counts, 0, sizeof(v->counts));
    v->rows_done = 0;
    for (size_t i = 0; i < v->nshards; i++) {
        unsigned s = v->bits[i] & VB_NEXT;

        v->bits[i] = (unsigned char)((v->bits[i] & ~VB_CUR) | (s << VB_CUR_SHIFT));
        v->counts[s]++;
        if (s == ST_DONE)
            v->rows_done += m->shards[i].rows;
    }
    for (size_t i = 0; i < v->nnodes; i++) {
        v->nodes[i].running = v->nodes[i].next_running;
        v->nodes[i].stale = v->nodes[i].next_stale;
    }
    details_free(v->details, v->ndetails);
    if (v->next_ndetails)
        qsort(v->next_details, v->next_ndetails, sizeof(*v->next_details), detail_cmp);
    v->details = v->next_details;
    v->ndetails = v->next_ndetails;
    v->next_details = NULL;
    v->next_ndetails = 0;
    v->read_wall = v->start_wall;
    v->valid = true;
    /* the global stage's few records with the listings' counts, below
     * the same descriptor and identity */
    if (m->global_snapshot) {
        if (v->global)
            status_global_free(v->global);
        else
            v->global = xcalloc(1, sizeof(*v->global));
        status_global_read(v->jobfd, m, v->lock_timeout, v->counts, v->global);
    }
}

/* Opens the listing of the phase's directory; a missing one is empty. */
static int
open_phase(struct status_view *v, struct esd_err *err)
{
    int fd = fs_open_dir_beneath(v->jobfd, phase_dir[v->phase], NULL, err);

    if (fd == -ENOENT)
        return 0;
    if (fd < 0)
        return fd;
    if (!(v->dir = fdopendir(fd))) {
        int r = err_sys(err, -errno, "cannot read %s/%s", "job", phase_dir[v->phase]);

        close(fd);
        return r;
    }
    return 0;
}

int
status_view_step(struct status_view *v, const struct manifest *m, long long lock_timeout,
                 size_t budget, struct esd_err *err)
{
    size_t spent = 0;
    int r;

    if (v->nshards != m->nshards)
        return err_set(err, -EINVAL, "status view of %zu shards for a job of %zu", v->nshards,
                       m->nshards);
    if (v->phase == PH_NONE) {
        struct timespec now;
        struct stat sb;

        /* the whole reading below this descriptor: the path may be
         * swapped meanwhile, the directory read stays the one checked */
        v->jobfd = open(m->job_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (v->jobfd < 0)
            return err_sys(err, -errno, "cannot open %s", m->job_dir);
        if (v->ino && (fstat(v->jobfd, &sb) < 0 || sb.st_ino != v->ino)) {
            r = err_set(err, -ESTALE, "%s is no longer the directory registered", m->job_dir);
            goto fail;
        }
        clock_gettime(CLOCK_REALTIME, &now);
        v->start_wall = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
        v->lock_timeout = lock_timeout > 0 ? lock_timeout : m->lock_timeout_secs;
        for (size_t i = 0; i < v->nshards; i++)
            v->bits[i] &= (unsigned char)~VB_NEXT;
        for (size_t i = 0; i < v->nnodes; i++)
            v->nodes[i].next_running = v->nodes[i].next_stale = 0;
        v->phase = PH_DONE;
        v->cursor = 0;
        if ((r = open_phase(v, err)) < 0)
            goto fail;
    }
    while (spent < budget) {
        if (v->phase == PH_RECORDS) {
            size_t i;
            unsigned s;

            if (v->cursor >= v->nshards) {
                status_view_abort(v);
                return 1;
            }
            i = v->cursor++;
            s = v->bits[i] & VB_NEXT;
            spent++;
            /* a record costs more than a directory entry, and more again
             * per 4 KiB read, so a step's time stays bounded however
             * large the records are */
            if (s == ST_DONE && !(v->bits[i] & VB_SUMMARISED))
                spent += COST_RECORD + summarise_done(v, m, i) / 4096;
            continue;
        }
        struct dirent *e = NULL;

        if (v->dir) {
            errno = 0;
            e = readdir(v->dir);
            if (!e && errno) {
                r = err_sys(err, -errno, "cannot read %s/%s", m->job_dir, phase_dir[v->phase]);
                goto fail;
            }
        }
        spent++;
        if (!e) {
            /* this listing is over: the next one */
            if (v->dir)
                closedir(v->dir);
            v->dir = NULL;
            if (++v->phase == PH_RECORDS) {
                view_publish(v, m);
                continue;
            }
            if ((r = open_phase(v, err)) < 0)
                goto fail;
            continue;
        }
        size_t n = strlen(e->d_name), slen = strlen(phase_suffix[v->phase]);
        char id[256];
        long k;
        unsigned s;

        if (e->d_name[0] == '.' || n <= slen || n - slen >= sizeof(id) ||
            strcmp(e->d_name + n - slen, phase_suffix[v->phase]) != 0)
            continue;
        memcpy(id, e->d_name, n - slen);
        id[n - slen] = '\0';
        if ((k = manifest_find(m, id)) < 0)
            continue;
        s = v->bits[k] & VB_NEXT;
        /* a done record wins over a failed one, either over a lock */
        if (v->phase == PH_DONE)
            v->bits[k] = (unsigned char)((v->bits[k] & ~VB_NEXT) | ST_DONE);
        else if (v->phase == PH_FAILED && s != ST_DONE) {
            v->bits[k] = (unsigned char)((v->bits[k] & ~VB_NEXT) | ST_FAILED);
            if (v->next_ndetails < STATUS_VIEW_DETAILS) {
                failed_detail(v, m, (size_t)k);
                spent += COST_RECORD;
            }
        } else if (v->phase == PH_LOCKS && s == ST_PENDING) {
            view_lock(v, m, (size_t)k, e->d_name);
            spent += COST_RECORD;
        }
    }
    return 0;
fail:
    status_view_abort(v);
    return r;
}

void
status_view_pace(const struct status_view *v, double *ret_shards_per_sec, double *ret_eta)
{
    double rate = -1, eta = -1;
    size_t left = v->nshards - v->counts[ST_DONE] - v->counts[ST_FAILED];

    /* While shards run: as many as run, each taking the mean duration of
     * those done (Little's law), which follows a fleet that grows or
     * shrinks at once; else the pace of the done records' span. */
    if (v->dur_n > 0 && v->dur_sum > 0 && v->counts[ST_RUNNING] > 0)
        rate = (double)v->counts[ST_RUNNING] / (v->dur_sum / (double)v->dur_n);
    else if (v->summarised > v->unreadable && v->last_end > v->first_start && v->first_start > 0)
        rate = (double)(v->summarised - v->unreadable) / (v->last_end - v->first_start);
    if (!left)
        eta = 0;
    else if (rate > 0)
        eta = (double)left / rate;
    *ret_shards_per_sec = rate;
    *ret_eta = eta;
}

static cJSON *
detail_json(const struct manifest *m, const struct status_detail *d, enum shard_state state,
            size_t i)
{
    cJSON *x = cJSON_CreateObject();

    json_add_str(x, "shard_id", m->shards[i].id);
    json_add_int(x, "rows", m->shards[i].rows);
    json_add_str(x, "status", status_state_name[state]);
    if (d && d->owner)
        json_add_str(x, "owner", d->owner);
    if (d && d->has_pid)
        json_add_int(x, "pid", d->pid);
    if (d && d->node)
        json_add_str(x, "node", d->node);
    if (d && (state == ST_RUNNING || state == ST_STALE))
        json_add_float(x, "lock_age_secs", d->lock_age);
    if (state == ST_FAILED) {
        if (d && d->error)
            json_add_str(x, "error", d->error);
        else
            cJSON_AddNullToObject(x, "error");
    }
    if (d && d->metadata_error)
        json_add_bool(x, "metadata_error", true);
    return x;
}

/* A done shard of a listing with --all: its record's host and node. */
static cJSON *
done_json(const struct status_view *v, const struct manifest *m, size_t i)
{
    cJSON *x = detail_json(m, NULL, ST_DONE, i);

    if (v->host[i])
        json_add_str(x, "owner", v->names[v->host[i] - 1]);
    if (v->node[i])
        json_add_str(x, "node", v->names[v->node[i] - 1]);
    return x;
}

enum shard_state
status_view_shard(const struct status_view *v, size_t i, const char **ret_node)
{
    enum shard_state s;
    size_t lo = 0, hi;

    *ret_node = NULL;
    if (!v->valid || i >= v->nshards)
        return ST_PENDING;
    s = (enum shard_state)((v->bits[i] & VB_CUR) >> VB_CUR_SHIFT);
    if (s == ST_DONE) {
        if (v->node && v->node[i])
            *ret_node = v->names[v->node[i] - 1];
        else if (v->host && v->host[i])
            *ret_node = v->names[v->host[i] - 1];
        return s;
    }
    /* the details are in shard order */
    hi = v->ndetails;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (v->details[mid].index < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < v->ndetails && v->details[lo].index == i)
        *ret_node = v->details[lo].node ? v->details[lo].node : v->details[lo].owner;
    return s;
}

cJSON *
status_view_json(const struct status_view *v, const struct manifest *m, bool all)
{
    cJSON *o = cJSON_CreateObject(), *counts, *shards, *nodes;
    struct timespec now;
    double rate, eta, wall;
    size_t listed = 0, omitted = 0;
    char when[40];

    clock_gettime(CLOCK_REALTIME, &now);
    wall = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    json_add_str(o, "job_id", m->job_id);
    json_add_str(o, "job_dir", m->job_dir);
    cJSON_AddItemToObject(
        o, "execution", m->execution_json ? cJSON_Parse(m->execution_json) : cJSON_CreateObject());
    json_add_int(o, "total", (long long)v->nshards);
    counts = cJSON_AddObjectToObject(o, "counts");
    for (int k = 0; k < ST__COUNT; k++)
        json_add_int(counts, status_state_name[k], (long long)v->counts[k]);
    json_add_bool(o, "complete", v->counts[ST_DONE] == v->nshards);
    json_add_bool(o, "terminal", v->counts[ST_DONE] + v->counts[ST_FAILED] == v->nshards);
    status_merge_json(m, o);
    if (v->global)
        status_global_json(m, v->global, o);
    json_add_str(o, "source", "view");
    {
        struct timespec ts = { .tv_sec = (time_t)v->read_wall,
                               .tv_nsec =
                                   (long)((v->read_wall - (double)(time_t)v->read_wall) * 1e9) };

        time_iso_format(&ts, when);
        json_add_str(o, "read_at", when);
    }
    json_add_float(o, "read_age_secs", wall > v->read_wall ? wall - v->read_wall : 0);
    /* done records summarised so far (nodes' done counts and the pace) */
    json_add_int(o, "records_read", (long long)v->summarised);
    shards = cJSON_AddArrayToObject(o, "shards");
    /* every shard while that stays within the bound (status --json as
     * spec §5.9 has it), else those that need attention: the details kept
     * are only locks and failures (at most STATUS_VIEW_DETAILS), so a
     * 100,000-shard job's reply stays within the protocol's line */
    if (all || v->nshards <= STATUS_VIEW_DETAILS) {
        size_t d = 0;

        for (size_t i = 0; i < v->nshards; i++) {
            enum shard_state s = (enum shard_state)((v->bits[i] & VB_CUR) >> VB_CUR_SHIFT);

            while (d < v->ndetails && v->details[d].index < i)
                d++;
            if (listed >= STATUS_VIEW_DETAILS) {
                omitted = v->nshards - i;
                break;
            }
            if (s == ST_DONE)
                cJSON_AddItemToArray(shards, done_json(v, m, i));
            else
                cJSON_AddItemToArray(
                    shards,
                    detail_json(m,
                                d < v->ndetails && v->details[d].index == i ? &v->details[d] : NULL,
                                s, i));
            listed++;
        }
    } else {
        for (size_t d = 0; d < v->ndetails; d++)
            cJSON_AddItemToArray(
                shards, detail_json(m, &v->details[d], v->details[d].state, v->details[d].index));
        omitted = v->counts[ST_RUNNING] + v->counts[ST_STALE] + v->counts[ST_FAILED] - v->ndetails;
    }
    json_add_int(o, "shards_omitted", (long long)omitted);
    nodes = cJSON_AddObjectToObject(o, "nodes");
    for (size_t i = 0; i < v->nnodes; i++) {
        cJSON *n;

        if (!v->nodes[i].done && !v->nodes[i].running && !v->nodes[i].stale)
            continue;
        n = cJSON_AddObjectToObject(nodes, v->nodes[i].name);
        json_add_int(n, "done", (long long)v->nodes[i].done);
        json_add_int(n, "running", (long long)v->nodes[i].running);
        json_add_int(n, "stale", (long long)v->nodes[i].stale);
    }
    json_add_int(o, "total_rows", m->total_rows);
    json_add_int(o, "rows_done", v->rows_done);
    json_add_str(o, "ray_address", m->ray_address);
    status_view_pace(v, &rate, &eta);
    if (rate >= 0) {
        json_add_float(o, "shards_per_sec", rate);
        if (v->nshards)
            json_add_float(o, "rows_per_sec", rate * (double)m->total_rows / (double)v->nshards);
    }
    if (eta >= 0)
        json_add_float(o, "eta_secs", eta);
    return o;
}

/* The order status_json_bound keeps: what needs attention first. */
static bool
needs_attention(const cJSON *x)
{
    const char *s = json_get_str(x, "status");

    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(x, "metadata_error")) ||
           (s && (!strcmp(s, "running") || !strcmp(s, "stale") || !strcmp(s, "failed")));
}

/* Two passes over the shards: those that need attention first, then the
 * rest, each pass in manifest order; a reply cut to max shards then shows
 * what an operator looks for, and the same shards each time. */
void
status_json_bound(cJSON *status, size_t max)
{
    cJSON *shards = cJSON_GetObjectItemCaseSensitive(status, "shards"), *keep, *x, *next;
    size_t n = (size_t)cJSON_GetArraySize(shards), kept = 0;

    if (!cJSON_IsArray(shards) || n <= max) {
        json_add_int(status, "shards_omitted", 0);
        return;
    }
    keep = cJSON_CreateArray();
    for (int pass = 0; pass < 2; pass++)
        for (x = shards->child; x && kept < max; x = next) {
            next = x->next;
            if (needs_attention(x) == (pass == 0)) {
                cJSON_AddItemToArray(keep, cJSON_DetachItemViaPointer(shards, x));
                kept++;
            }
        }
    cJSON_ReplaceItemInObjectCaseSensitive(status, "shards", keep);
    json_add_int(status, "shards_omitted", (long long)(n - kept));
}
