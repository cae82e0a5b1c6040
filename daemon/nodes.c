/*
 * nodes: this node's status file on the spool and the fleet's view read
 * back from the other nodes' files and the jobs' views (nodes.h).
 */
#include "nodes.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djversion.h"
#include "fsutil.h"
#include "jobs.h"
#include "jobview.h"
#include "json.h"
#include "log.h"
#include "manifest.h"
#include "proto.h"
#include "runner.h"
#include "status.h"

#define FORMAT "esd-node"
/* What one file lists at most, and the longest string it may hold: the
 * writer (self_json) caps at exactly the bounds the readers (peer_parse)
 * enforce, so a busy node's own file never turns invalid for its peers. */
#define MAX_ATTEMPTS 32
#define MAX_PAUSED 16
#define MAX_STR 1024

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    ev_timer pub_w;
    double last_pub;    /* monotonic time of the last publication; 0: none */
    double server_now;  /* our file's mtime after it (the file server's clock) ... */
    double server_mono; /* ... at this monotonic time; 0: not known */
    char *dir, *path;   /* <spool_dir>/nodes and our file in it; NULL: no spool */
    char *failed;       /* the last write error, said once */
    char *drain_why;
    bool swept; /* our leftover temporary files were removed */
    char started_at[40];
    char host[256];
    cJSON *(*status)(void); /* the daemon's status (nodes_set_status) */
} N;

/* The spool may be writable by others (a shared mount, a sticky /tmp-like
 * directory): a file or directory of any other user could speak for a
 * node or steer our writes, so only root's and esd's own count. */
static bool
trusted_owner(const struct stat *st)
{
    return st->st_uid == 0 || st->st_uid == geteuid();
}

static double
mtime_of(const struct stat *st)
{
    return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec / 1e9;
}

/* Now on the file server's clock: our file's mtime when it was last
 * written, moved on by the monotonic clock; the wall clock before that.
 * The peers' mtimes are the server's stamps too, so an age computed
 * against this carries no skew between our clock and the server's. */
static double
server_now(void)
{
    return N.server_mono > 0 ? N.server_now + (time_mono() - N.server_mono) : time_wall();
}

/* s cut to MAX_STR bytes (on a UTF-8 boundary) as member key of o. */
static void
add_capped(cJSON *o, const char *key, const char *s)
{
    size_t n = strlen(s);
    char *t;

    if (n <= MAX_STR) {
        json_add_str(o, key, s);
        return;
    }
    /* s[n] is the first byte cut off: while it continues a sequence, cut
     * earlier, so the string stays valid UTF-8 */
    n = MAX_STR;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--;
    t = xstrndup(s, n);
    json_add_str(o, key, t);
    free(t);
}

static void
processor_text(struct buf *b)
{
    const struct esd_conf *c = N.conf;

    if (c->processor.n) {
        for (size_t i = 0; i < c->processor.n; i++)
            buf_printf(b, "%s%s", i ? " " : "", c->processor.v[i]);
    } else if (c->dj_root) {
        buf_printf(b, "%s %s/tools/process_data.py", c->dj_python ? c->dj_python : "python3",
                   c->dj_root);
    } else {
        buf_puts(b, "dj-process");
    }
}

static const char *
state_reason(const char *state)
{
    if (!strcmp(state, "stopped"))
        return "esd stopped cleanly";
    if (!strcmp(state, "draining"))
        return "esd is stopping: running attempts finish or are released";
    if (!strcmp(state, "drained"))
        return N.drain_why ? N.drain_why : "drained before esd last started (esctl resume ends it)";
    return NULL;
}

/* This node's status as its file has it (caller deletes); stopping: the
 * last one, state "stopped". */
static cJSON *
self_json(bool stopping)
{
    cJSON *st = N.status ? N.status() : cJSON_CreateObject();
    cJSON *o = cJSON_CreateObject(), *a, *x, *ray, *dj, *paused;
    const cJSON *sray = cJSON_GetObjectItemCaseSensitive(st, "ray");
    cJSON *running;
    const struct djversion *v = jobs_djversion();
    const char *state = stopping ? "stopped" : json_get_str(st, "state");
    const char *why;
    long long busy = 0, n = 0;
    char now[40];
    struct buf b;

    /* The last file (stopping) lists no attempts, jobs or busy slots: a
     * node that stopped cleanly runs nothing, and its file stays as it is
     * until it starts again. */
    if (!state)
        state = "running";
    json_add_str(o, "format", FORMAT);
    json_add_int(o, "format_version", 1);
    json_add_str(o, "node", N.conf->node_name);
    add_capped(o, "hostname", N.host);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "esd_version", ESD_VERSION);
    json_add_str(o, "state", state);
    if ((why = state_reason(state)))
        add_capped(o, "reason", why);
    json_add_str(o, "started_at", N.started_at);
    time_iso_now(now, NULL);
    json_add_str(o, "published_at", now);
    json_add_int(o, "interval_secs", N.conf->node_status_interval_secs);
    json_add_int(o, "slots", N.conf->slots);
    if (!stopping)
        json_get_int(st, "busy", &busy);
    json_add_int(o, "busy", busy);
    a = cJSON_AddArrayToObject(o, "attempts");
    running = stopping ? NULL : runner_status_json();
    cJSON_ArrayForEach(x, running)
    {
        cJSON *y;
        long long k;
        double secs;

        /* counted on past the cap: the file says how many it left out */
        if (n++ >= MAX_ATTEMPTS)
            continue;
        y = cJSON_CreateObject();
        add_capped(y, "job_id", json_get_str(x, "job_id") ? json_get_str(x, "job_id") : "");
        add_capped(y, "job_dir", json_get_str(x, "job_dir") ? json_get_str(x, "job_dir") : "");
        add_capped(y, "shard_id", json_get_str(x, "shard_id") ? json_get_str(x, "shard_id") : "");
        if (json_get_int(x, "attempt", &k) == 0)
            json_add_int(y, "attempt", k);
        add_capped(y, "phase", json_get_str(x, "phase") ? json_get_str(x, "phase") : "");
        if (json_get_num(x, "running_secs", &secs) == 0)
            json_add_float(y, "running_secs", secs);
        cJSON_AddItemToArray(a, y);
    }
    if (n > MAX_ATTEMPTS)
        json_add_int(o, "attempts_omitted", n - MAX_ATTEMPTS);
    paused = cJSON_AddArrayToObject(o, "paused");
    n = 0;
    for (struct job *j = jobs_first(); j && !stopping; j = j->next) {
        char text[160];

        if (j->state != JOB_ACTIVE)
            continue;
        if (j->stopped) {
            why = j->stopped;
        } else if (j->paused_until > time_mono()) {
            snprintf(text, sizeof(text),
                     "claims paused for %.0f s after %u failed attempts "
                     "in a row here",
                     j->paused_until - time_mono(), j->fail_streak);
            why = text;
        } else {
            continue;
        }
        if (n++ >= MAX_PAUSED)
            continue;
        x = cJSON_CreateObject();
        add_capped(x, "job_id", j->loaded ? j->m.job_id : j->key);
        add_capped(x, "job_dir", j->job_dir);
        add_capped(x, "why", why);
        cJSON_AddItemToArray(paused, x);
    }
    ray = cJSON_AddObjectToObject(o, "ray");
    add_capped(ray, "state", json_get_str(sray, "state") ? json_get_str(sray, "state") : "");
    if (json_get_str(sray, "address"))
        add_capped(ray, "address", json_get_str(sray, "address"));
    if (json_get_int(sray, "restarts", &n) == 0)
        json_add_int(ray, "restarts", n);
    buf_init(&b);
    processor_text(&b);
    add_capped(o, "processor", b.p ? b.p : "");
    buf_free(&b);
    dj = cJSON_AddObjectToObject(o, "data_juicer");
    add_capped(dj, "version", v->version ? v->version : "unknown");
    if (v->source)
        add_capped(dj, "source", v->source);
    else if (v->why)
        add_capped(dj, "why", v->why);
    cJSON_Delete(running);
    cJSON_Delete(st);
    return o;
}

/* Removes the temporary files of our writes that an esd killed in the
 * middle of one left behind (".<node>.json.<hex>.tmp", ours only). Only
 * our name, our uid and regular files, not followed: the directory is
 * shared, and another node's write in progress is not ours to remove.
 * Once per run, before our first write: no write of ours is then in
 * progress. */
static void
sweep_temps(void)
{
    char *prefix = xasprintf(".%s.json.", N.conf->node_name);
    size_t np = strlen(prefix);
    int dfd = open(N.dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    struct dirent *e;

    if (!d && dfd >= 0)
        close(dfd);
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        struct stat st;

        if (n > np + 4 && !strncmp(e->d_name, prefix, np) && !strcmp(e->d_name + n - 4, ".tmp") &&
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid())
            unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d)
        closedir(d);
    free(prefix);
}

/* Our file: written if the nodes directory is a directory of root's or
 * ours (others may write the spool: they must not choose where it goes). */
static void
publish(bool stopping)
{
    struct esd_err err;
    struct stat st;
    cJSON *o;
    int r;

    if (!N.path)
        return;
    N.last_pub = time_mono();
    err_clear(&err);
    /* (never the spool itself: a spool_dir that is missing, a shared
     * mount not mounted, say, is not made on the local disk) */
    r = mkdir(N.dir, 0755) < 0 && errno != EEXIST
            ? err_set(&err, -errno, "cannot create %s: %s", N.dir, strerror(errno))
            : 0;
    if (r == 0 && (lstat(N.dir, &st) < 0 || !S_ISDIR(st.st_mode) || !trusted_owner(&st)))
        r = err_set(&err, -EPERM, "%s is not a directory of root's or esd's (uid %u)", N.dir,
                    (unsigned)geteuid());
    if (r == 0) {
        if (!N.swept) {
            sweep_temps();
            N.swept = true;
        }
        o = self_json(stopping);
        r = json_write_atomic(N.path, o, JSON_LINE, &err);
        cJSON_Delete(o);
    }
    /* Said once per distinct error and once when it heals, not every
     * interval. */
    if (r < 0) {
        if (!N.failed || strcmp(N.failed, err.msg)) {
            log_warning(NULL,
                        "nodes: cannot publish this node's status: %s; other nodes "
                        "will see it as down (trying again every %ld s)",
                        err.msg, N.conf->node_status_interval_secs);
            free(N.failed);
            N.failed = xstrdup(err.msg);
        }
        return;
    }
    if (N.failed) {
        log_notice(NULL, "nodes: publishing this node's status in %s again", N.path);
        free(N.failed);
        N.failed = NULL;
    }
    /* The server stamped our write: that is its clock now (server_now). */
    if (lstat(N.path, &st) == 0) {
        N.server_now = mtime_of(&st);
        N.server_mono = time_mono();
    }
}

static void
schedule(double after)
{
    ev_timer_stop(N.loop, &N.pub_w);
    ev_timer_set(&N.pub_w, after > 0 ? after : 0, 0.);
    ev_timer_start(N.loop, &N.pub_w);
}

static void
nodes_pub_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    publish(false);
    schedule((double)N.conf->node_status_interval_secs);
}

void
nodes_kick(void)
{
    double due;

    if (!N.loop || !N.path)
        return;
    /* At once, or when the gap since the last publication is over; a
     * publication already due sooner is kept, never put off. */
    due = N.last_pub > 0 ? N.last_pub + NODES_MIN_GAP_SECS - time_mono() : 0;
    if (!ev_is_active(&N.pub_w) || ev_timer_remaining(N.loop, &N.pub_w) > due)
        schedule(due);
}

void
nodes_set_drain_reason(const char *why)
{
    free(N.drain_why);
    N.drain_why = why ? xstrdup(why) : NULL;
    nodes_kick();
}

static void
set_paths(const struct esd_conf *c)
{
    char *name;

    free(N.dir);
    free(N.path);
    N.dir = N.path = NULL;
    if (!c->spool_dir)
        return;
    N.dir = fs_join(c->spool_dir, "nodes");
    name = xasprintf("%s.json", c->node_name);
    N.path = fs_join(N.dir, name);
    free(name);
}

void
nodes_set_status(cJSON *(*status)(void))
{
    N.status = status;
}

void
nodes_init(struct ev_loop *loop, const struct esd_conf *c)
{
    N.loop = loop;
    N.conf = c;
    time_iso_now(N.started_at, NULL);
    if (gethostname(N.host, sizeof(N.host) - 1) < 0)
        snprintf(N.host, sizeof(N.host), "unknown");
    set_paths(c);
    ev_init(&N.pub_w, nodes_pub_cb);
    if (N.path)
        schedule(0);
}

void
nodes_reconfigure(const struct esd_conf *c)
{
    /* spool_dir and node_name take effect at a restart only (main.c). A
     * shorter interval takes effect at once, by shortening the pending
     * wait; a longer one from the next publication on. Peers judge a
     * file by the interval it states, so neither misleads them. */
    N.conf = c;
    if (N.path && ev_is_active(&N.pub_w) &&
        ev_timer_remaining(N.loop, &N.pub_w) > (double)c->node_status_interval_secs)
        schedule((double)c->node_status_interval_secs);
}

void
nodes_fini(void)
{
    if (!N.loop)
        return;
    ev_timer_stop(N.loop, &N.pub_w);
    publish(true);
    free(N.dir);
    free(N.path);
    free(N.failed);
    free(N.drain_why);
    memset(&N, 0, sizeof(N));
}

/* ---- reading the fleet ---- */

/* The nodes the loaded jobs' views name, with their locks. */
struct lockcount {
    struct strv names;
    size_t *running, *stale;
};

static size_t
lockcount_slot(struct lockcount *lc, const char *name)
{
    for (size_t i = 0; i < lc->names.n; i++)
        if (!strcmp(lc->names.v[i], name))
            return i;
    strv_push(&lc->names, name);
    lc->running = xrealloc(lc->running, lc->names.n * sizeof(*lc->running));
    lc->stale = xrealloc(lc->stale, lc->names.n * sizeof(*lc->stale));
    lc->running[lc->names.n - 1] = lc->stale[lc->names.n - 1] = 0;
    return lc->names.n - 1;
}

/* The node whose lock holds v's global stage (esd's node name, else the
 * host name), or NULL: not running, or not known. */
static const char *
global_node(const struct status_view *v)
{
    const struct shard_status *s = &v->global->s;

    if (s->state != ST_RUNNING && s->state != ST_STALE)
        return NULL;
    return s->node ? s->node : s->owner;
}

static void
lockcount_read(struct lockcount *lc)
{
    for (struct job *j = jobs_first(); j; j = j->next) {
        const struct status_view *v = jobview_get(j);

        for (size_t i = 0; v && i < v->nnodes; i++) {
            size_t k;

            if (!v->nodes[i].running && !v->nodes[i].stale && !v->nodes[i].done)
                continue;
            k = lockcount_slot(lc, v->nodes[i].name);
            lc->running[k] += v->nodes[i].running;
            lc->stale[k] += v->nodes[i].stale;
        }
        /* the lock of a global stage (_global) is one its node holds */
        if (v && v->global && global_node(v)) {
            size_t k = lockcount_slot(lc, global_node(v));

            if (v->global->s.state == ST_RUNNING)
                lc->running[k]++;
            else if (v->global->s.state == ST_STALE)
                lc->stale[k]++;
        }
    }
}

/* The jobs whose global stage the node runs (its _global lock), as
 * "global_stage": [{"job_id", "state", "lock_age_secs"}] in entry. */
static void
global_add(cJSON *entry, const char *node)
{
    cJSON *a = NULL;

    for (struct job *j = jobs_first(); j && node; j = j->next) {
        const struct status_view *v = jobview_get(j);
        cJSON *x;

        if (!v || !v->global || !global_node(v) || strcmp(global_node(v), node))
            continue;
        if (!a)
            a = cJSON_AddArrayToObject(entry, "global_stage");
        x = cJSON_CreateObject();
        json_add_str(x, "job_id", j->m.job_id);
        json_add_str(x, "state", status_state_name[v->global->s.state]);
        json_add_float(x, "lock_age_secs", v->global->s.lock_age);
        cJSON_AddItemToArray(a, x);
    }
}

static void
lockcount_add(const struct lockcount *lc, cJSON *entry, const char *node)
{
    for (size_t i = 0; i < lc->names.n; i++)
        if (!strcmp(lc->names.v[i], node)) {
            cJSON *l = cJSON_AddObjectToObject(entry, "locks");

            json_add_int(l, "running", (long long)lc->running[i]);
            json_add_int(l, "stale", (long long)lc->stale[i]);
            return;
        }
}

static void
lockcount_free(struct lockcount *lc)
{
    strv_free(&lc->names);
    free(lc->running);
    free(lc->stale);
}

/*
 * ---- a peer's file, checked member by member into a fresh object ----
 *
 * Only what is checked is copied: no member a peer made up reaches esctl,
 * and what this node computes itself ("state", "age_secs", "source",
 * "self", "taken_over") cannot be set by a peer, which has its own state
 * as "published_state". Every string is bounded, every number ranged.
 */

static int
take_str(cJSON *to, const cJSON *from, const char *key, bool need, struct esd_err *err)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(from, key);

    if (!x && !need)
        return 0;
    if (!cJSON_IsString(x) || strlen(x->valuestring) > MAX_STR)
        return err_set(err, -EINVAL, "\"%s\" must be a string of at most %d bytes", key, MAX_STR);
    json_add_str(to, key, x->valuestring);
    return 0;
}

static int
take_int(cJSON *to, const cJSON *from, const char *key, long long min, long long max, bool need,
         struct esd_err *err)
{
    long long v;

    if (!cJSON_GetObjectItemCaseSensitive(from, key) && !need)
        return 0;
    if (json_get_int(from, key, &v) < 0 || v < min || v > max)
        return err_set(err, -EINVAL, "\"%s\" must be an integer from %lld to %lld", key, min, max);
    json_add_int(to, key, v);
    return 0;
}

static int
take_num(cJSON *to, const cJSON *from, const char *key, struct esd_err *err)
{
    double v;

    if (!cJSON_GetObjectItemCaseSensitive(from, key))
        return 0;
    /* written so that a NaN fails too */
    if (json_get_num(from, key, &v) < 0 || !(v >= 0 && v < 1e12))
        return err_set(err, -EINVAL, "\"%s\" must be a non-negative number", key);
    json_add_float(to, key, v);
    return 0;
}

/* The objects of array key of from (at most max), each checked by take. */
static int
take_list(cJSON *to, const cJSON *from, const char *key, int max,
          int (*take)(cJSON *, const cJSON *, struct esd_err *), struct esd_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(from, key), *x;
    cJSON *out;

    if (!a)
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > max)
        return err_set(err, -EINVAL, "\"%s\" must be a list of at most %d objects", key, max);
    out = cJSON_AddArrayToObject(to, key);
    cJSON_ArrayForEach(x, a)
    {
        cJSON *y = cJSON_CreateObject();

        /* owned by to before it is filled: an error leaves nothing loose */
        cJSON_AddItemToArray(out, y);
        if (!cJSON_IsObject(x))
            return err_set(err, -EINVAL, "\"%s\" must be a list of objects", key);
        if (take(y, x, err) < 0)
            return err_set(err, -EINVAL, "in \"%s\": %s", key, err->msg);
    }
    return 0;
}

static int
take_attempt(cJSON *to, const cJSON *x, struct esd_err *err)
{
    const char *shard = json_get_str(x, "shard_id");

    /* an id a manifest could hold, as it is looked up in the jobs' views */
    if (!shard || !manifest_id_ok(shard))
        return err_set(err, -EINVAL, "\"shard_id\" must be a shard id");
    if (take_str(to, x, "shard_id", true, err) < 0 || take_str(to, x, "job_id", true, err) < 0 ||
        take_str(to, x, "job_dir", false, err) < 0 || take_str(to, x, "phase", false, err) < 0 ||
        take_int(to, x, "attempt", 1, 1000000000, true, err) < 0 ||
        take_num(to, x, "running_secs", err) < 0)
        return -EINVAL;
    return 0;
}

static int
take_paused(cJSON *to, const cJSON *x, struct esd_err *err)
{
    if (take_str(to, x, "job_id", true, err) < 0 || take_str(to, x, "job_dir", false, err) < 0 ||
        take_str(to, x, "why", true, err) < 0)
        return -EINVAL;
    return 0;
}

static int
take_object(cJSON *to, const cJSON *from, const char *key, const char *const *strs,
            struct esd_err *err)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(from, key);
    cJSON *y;

    if (!x)
        return 0;
    if (!cJSON_IsObject(x))
        return err_set(err, -EINVAL, "\"%s\" must be an object", key);
    y = cJSON_AddObjectToObject(to, key);
    for (; *strs; strs++)
        if (take_str(y, x, *strs, false, err) < 0)
            return err_set(err, -EINVAL, "in \"%s\": %s", key, err->msg);
    return !strcmp(key, "ray") ? take_int(y, x, "restarts", 0, 1000000000, false, err) : 0;
}

/*
 * The entry of the node file text[0..len) for node (its file name less
 * ".json"): a new object holding only the members checked here, or NULL
 * with err saying what is wrong.
 */
static cJSON *
peer_parse(const char *text, size_t len, const char *node, struct esd_err *err)
{
    static const char *const states[] = { "running", "draining", "drained", "stopped", NULL };
    static const char *const ray_strs[] = { "state", "address", NULL };
    static const char *const dj_strs[] = { "version", "source", "why", NULL };
    static const char *const strs[] = { "hostname",     "esd_version", "reason", "started_at",
                                        "published_at", "processor",   NULL };
    cJSON *o = NULL, *e;
    const char *s;
    long long slots = 0, busy = 0;
    size_t k;

    if (json_parse_object(text, len, node, &o, err) < 0)
        return NULL;
    e = cJSON_CreateObject();
    if (!(s = json_get_str(o, "format")) || strcmp(s, FORMAT)) {
        err_set(err, -EINVAL, "not an esd node file (\"format\" is not \"%s\")", FORMAT);
        goto bad;
    }
    /* A file speaks for the node its name names only: one copied or
     * renamed is refused, not shown as a second entry of that node. */
    if (!(s = json_get_str(o, "node")) || strcmp(s, node)) {
        err_set(err, -EINVAL, "\"node\" is not \"%s\", the node its file name names", node);
        goto bad;
    }
    json_add_str(e, "node", node);
    s = json_get_str(o, "state");
    for (k = 0; s && states[k] && strcmp(s, states[k]); k++)
        ;
    if (!s || !states[k]) {
        err_set(err, -EINVAL, "\"state\" must be running, draining, drained or stopped");
        goto bad;
    }
    json_add_str(e, "published_state", s);
    for (k = 0; strs[k]; k++)
        if (take_str(e, o, strs[k], false, err) < 0)
            goto bad;
    if (take_int(e, o, "pid", 1, 1LL << 31, true, err) < 0 ||
        take_int(e, o, "interval_secs", 1, 3600, true, err) < 0 ||
        take_int(e, o, "slots", 0, 1000000, true, err) < 0 ||
        take_int(e, o, "busy", 0, 1000000, true, err) < 0 ||
        take_int(e, o, "attempts_omitted", 0, 1000000000, false, err) < 0 ||
        take_list(e, o, "attempts", MAX_ATTEMPTS, take_attempt, err) < 0 ||
        take_list(e, o, "paused", MAX_PAUSED, take_paused, err) < 0 ||
        take_object(e, o, "ray", ray_strs, err) < 0 ||
        take_object(e, o, "data_juicer", dj_strs, err) < 0)
        goto bad;
    json_get_int(e, "slots", &slots);
    json_get_int(e, "busy", &busy);
    if (busy > slots) {
        err_set(err, -EINVAL, "\"busy\" (%lld) is more than \"slots\" (%lld)", busy, slots);
        goto bad;
    }
    cJSON_Delete(o);
    return e;
bad:
    cJSON_Delete(o);
    cJSON_Delete(e);
    return NULL;
}

/* What became of the shards a node that is not up was running: each
 * attempt gets "now" (the shard's state in its job's view) and "by" (the
 * node its lock or done record names), and "taken_over" when that is
 * another node. Returns how many were taken over. */
static size_t
look_up_attempts(cJSON *entry, const char *node)
{
    cJSON *x;
    size_t taken = 0;

    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(entry, "attempts"))
    {
        const char *dir = json_get_str(x, "job_dir"), *by = NULL;
        struct job *j = dir && *dir ? jobs_find(dir) : NULL;
        const struct status_view *v = j ? jobview_get(j) : NULL;
        long i = v ? manifest_find(&j->m, json_get_str(x, "shard_id")) : -1;
        enum shard_state s;

        if (i < 0)
            continue;
        s = status_view_shard(v, (size_t)i, &by);
        json_add_str(x, "now", status_state_name[s]);
        if (by)
            json_add_str(x, "by", by);
        /* another node holds or finished it; pending is free again, and
         * failed is terminal without anyone's result */
        if (by && strcmp(by, node) && s != ST_PENDING && s != ST_FAILED) {
            json_add_bool(x, "taken_over", true);
            taken++;
        }
    }
    return taken;
}

static void
invalid(cJSON *list, const char *file, const char *why)
{
    cJSON *x = cJSON_CreateObject();

    json_add_str(x, "file", file);
    json_add_str(x, "error", why);
    cJSON_AddItemToArray(list, x);
}

/* The entry of the file name in the directory dfd, or NULL with it added
 * to bad. */
static cJSON *
peer_read(int dfd, const char *name, double now, cJSON *bad)
{
    size_t n = strlen(name);
    char *node = xstrndup(name, n - 5), *text = NULL;
    struct esd_err err;
    struct stat st;
    cJSON *e = NULL;
    size_t len = 0;
    int fd;

    err_clear(&err);
    /* The name becomes the node's name in the answer: a plain file name
     * component, as node_name itself must be. */
    if (!manifest_id_ok(node)) {
        invalid(bad, name, "the file name is not <node>.json for a valid node name");
        goto out;
    }
    fd = fs_open_job_at(dfd, name, name, O_RDONLY, 0, NODES_MAX_FILE, &st, &err);
    if (fd < 0) {
        invalid(bad, name, err.msg);
        goto out;
    }
    /* judged on the file opened (fstat), not on a name that could be
     * swapped between a check and the open */
    if (!trusted_owner(&st)) {
        char why[160];

        close(fd);
        snprintf(why, sizeof(why), "belongs to uid %u, not to esd (uid %u) or root: ignored",
                 (unsigned)st.st_uid, (unsigned)geteuid());
        invalid(bad, name, why);
        goto out;
    }
    /* At most the size fstat saw (bounded by NODES_MAX_FILE at the open):
     * a file that grows meanwhile is cut, one that shrinks reads short,
     * and either then fails to parse rather than overrun. */
    text = xmalloc((size_t)st.st_size + 1);
    while (len < (size_t)st.st_size) {
        ssize_t r = read(fd, text + len, (size_t)st.st_size - len);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    text[len] = '\0';
    if (!(e = peer_parse(text, len, node, &err))) {
        invalid(bad, name, err.msg);
        goto out;
    }
    {
        double age = now - mtime_of(&st);
        long long every = 1;
        const char *said = json_get_str(e, "published_state");

        /* Judged by the peer's own interval (nodes may differ). A stopped
         * node's file is never refreshed: it is stopped, not down. The age
         * is clamped at 0: a stamp can be a little ahead of server_now. */
        json_get_int(e, "interval_secs", &every);
        json_add_float(e, "age_secs", age > 0 ? age : 0);
        json_add_str(e, "source", "file");
        if (!strcmp(said, "stopped"))
            json_add_str(e, "state", "stopped");
        else if (age > (double)(NODES_DOWN_INTERVALS * every))
            json_add_str(e, "state", "down");
        else
            json_add_str(e, "state", said);
        if (!strcmp(json_get_str(e, "state"), "down") || !strcmp(said, "stopped"))
            json_add_int(e, "taken_over", (long long)look_up_attempts(e, node));
    }
out:
    free(text);
    free(node);
    return e;
}

static int
cmp_entry(const void *a, const void *b)
{
    const char *x = json_get_str(*(cJSON *const *)a, "node");
    const char *y = json_get_str(*(cJSON *const *)b, "node");

    return strcmp(x ? x : "", y ? y : "");
}

cJSON *
nodes_json(void)
{
    cJSON *r = cJSON_CreateObject(), *bad, *list, **v = NULL, *self;
    struct lockcount lc = { 0 };
    size_t nv = 0, files = 0, omitted = 0;
    double now = server_now();

    if (!N.conf) {
        json_add_str(r, "error", "the nodes module is not running");
        return r;
    }
    strv_init(&lc.names);
    lockcount_read(&lc);
    json_add_str(r, "node", N.conf->node_name);
    if (N.dir)
        json_add_str(r, "dir", N.dir);
    json_add_int(r, "interval_secs", N.conf->node_status_interval_secs);
    json_add_int(r, "down_after_intervals", NODES_DOWN_INTERVALS);
    bad = cJSON_AddArrayToObject(r, "invalid");

    /* This node from memory, not from its file, which may be an interval
     * old. */
    self = self_json(false);
    json_add_bool(self, "self", true);
    json_add_str(self, "source", "self");
    json_add_float(self, "age_secs", 0);
    cJSON_DeleteItemFromObjectCaseSensitive(self, "format");
    cJSON_DeleteItemFromObjectCaseSensitive(self, "format_version");
    v = xrealloc(v, (nv + 1) * sizeof(*v));
    v[nv++] = self;

    if (N.dir) {
        int dfd = open(N.dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        DIR *d = NULL;

        if (dfd < 0) {
            if (errno != ENOENT)
                invalid(bad, N.dir, strerror(errno));
        } else if (fstat(dfd, &st) < 0 || !trusted_owner(&st)) {
            invalid(bad, N.dir, "the nodes directory belongs to neither root nor esd: ignored");
            close(dfd);
        } else if (!(d = fdopendir(dfd))) {
            invalid(bad, N.dir, strerror(errno));
            close(dfd);
        }
        for (struct dirent *de; d && (de = readdir(d));) {
            size_t n = strlen(de->d_name);
            cJSON *e;

            /* "." and temporary files of a write in progress */
            if (de->d_name[0] == '.')
                continue;
            if (n < 6 || strcmp(de->d_name + n - 5, ".json")) {
                invalid(bad, de->d_name, "not a node file (<node>.json)");
                continue;
            }
            if (n - 5 == strlen(N.conf->node_name) &&
                !strncmp(de->d_name, N.conf->node_name, n - 5))
                continue; /* ours: shown live above */
            /* the bound of peer input: counted on, listed as omitted */
            if (files++ >= NODES_MAX_FILES) {
                omitted++;
                continue;
            }
            if ((e = peer_read(dirfd(d), de->d_name, now, bad))) {
                v = xrealloc(v, (nv + 1) * sizeof(*v));
                v[nv++] = e;
            }
        }
        if (d)
            closedir(d);
    }
    /* the nodes the jobs name that have no file */
    for (size_t i = 0; i < lc.names.n; i++) {
        bool known = false;
        cJSON *e;

        for (size_t k = 0; k < nv && !known; k++)
            known = !strcmp(json_get_str(v[k], "node"), lc.names.v[i]);
        if (known)
            continue;
        e = cJSON_CreateObject();
        json_add_str(e, "node", lc.names.v[i]);
        json_add_str(e, "source", "jobs");
        /* a lock whose lease ran out and none held: its esd is gone */
        json_add_str(e, "state", lc.stale[i] && !lc.running[i] ? "down" : "unknown");
        v = xrealloc(v, (nv + 1) * sizeof(*v));
        v[nv++] = e;
    }
    /* by name: the same fleet gives the same list whatever readdir's order */
    qsort(v, nv, sizeof(*v), cmp_entry);
    list = cJSON_AddArrayToObject(r, "nodes");
    for (size_t i = 0; i < nv; i++) {
        lockcount_add(&lc, v[i], json_get_str(v[i], "node"));
        global_add(v[i], json_get_str(v[i], "node"));
        cJSON_AddItemToArray(list, v[i]);
    }
    if (omitted)
        json_add_int(r, "files_omitted", (long long)omitted);
    free(v);
    lockcount_free(&lc);
    return r;
}
