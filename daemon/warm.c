/*
 * warm: the warm processors (see warm.h). Each is one struct warm: the
 * process (its pid, its SOCK_SEQPACKET socket, its output pipe, its child
 * watcher), its state, one timer (its start's deadline, its answers'
 * deadlines, its idle end) and the requests it has not answered.
 */
#include "warm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "json.h"
#include "log.h"

#define MSG_MAX 65536
#define OUT_LINE_MAX 4096
#define OUT_LOG_MAX ((size_t)64 << 10) /* of one warm processor's output */
#define BACKOFF_MAX_SECS 60.0

enum wstate { W_STARTING, W_READY, W_DEAD };

/* A request is queued (msg set, descriptors held) until its warm processor
 * is ready, then sent (msg NULL, asked set) until answered: msg == NULL is
 * what "sent" means to req_find, warm_arm and timer_cb. */
struct wreq {
    struct wreq *next;
    unsigned id;
    warm_done_fn done;
    void *arg;
    char *msg;  /* the request, until sent */
    int fds[4]; /* the last is -1 without a gate */
    double asked;
};

struct warm {
    struct warm *next;
    const struct job *job;
    struct log_ctx ctx;
    enum wstate state;
    struct spawned sp; /* sp.pid 0: no process */
    int sock;
    ev_io sock_w, out_w;
    ev_child child_w;
    ev_timer timer_w;
    struct buf line;
    size_t logged;
    double started, last_used, not_before, disabled_until;
    int failures;
    unsigned next_id;
    uid_t uid;
    struct wreq *reqs;
};

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    struct warm *head;
    char *self; /* esd's own program, the keeper */
    void (*ready)(void);
} W;

static void warm_stop(struct warm *w, const char *why);
static void warm_arm(struct warm *w);

/* ---- requests ---- */

static void
req_free(struct wreq *q)
{
    for (int i = 0; i < 4; i++)
        if (q->fds[i] >= 0)
            close(q->fds[i]);
    free(q->msg);
    free(q);
}

/* Answers q (taken off the list by the caller) and frees it. Freed
 * before done runs: done may call back in (a new request, a cancel), and
 * nothing must find q then. */
static void
req_answer(struct wreq *q, pid_t pid, const char *why)
{
    warm_done_fn done = q->done;
    void *arg = q->arg;

    req_free(q);
    if (done)
        done(arg, pid, why);
}

/* Answers every request of w with why. */
static void
reqs_fail(struct warm *w, const char *why)
{
    while (w->reqs) {
        struct wreq *q = w->reqs;

        w->reqs = q->next;
        req_answer(q, 0, why);
    }
}

static struct wreq **
req_find(struct warm *w, unsigned id)
{
    struct wreq **p;

    for (p = &w->reqs; *p && (*p)->id != id; p = &(*p)->next)
        ;
    return p;
}

/* Sends q's request with its descriptors. 0, or a negative errno. A
 * SOCK_SEQPACKET message goes whole or not at all, MSG_DONTWAIT keeps the
 * loop from blocking on a full socket (-EAGAIN) and MSG_NOSIGNAL turns a
 * dead peer into -EPIPE, not SIGPIPE. Once sent, our descriptors are
 * closed: the receiver has its own copies. */
static int
req_send(struct warm *w, struct wreq *q)
{
    size_t nfds = q->fds[3] >= 0 ? 4 : 3;
    char cbuf[CMSG_SPACE(sizeof(q->fds))];
    struct iovec iov = { .iov_base = q->msg, .iov_len = strlen(q->msg) };
    struct msghdr mh = { .msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = cbuf,
                         .msg_controllen = CMSG_SPACE(nfds * sizeof(int)) };
    struct cmsghdr *cm;

    memset(cbuf, 0, sizeof(cbuf));
    cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), q->fds, nfds * sizeof(int));
    if (sendmsg(w->sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return -errno;
    for (size_t i = 0; i < nfds; i++) {
        close(q->fds[i]);
        q->fds[i] = -1;
    }
    free(q->msg);
    q->msg = NULL;
    q->asked = time_mono();
    return 0;
}

/* Sends what waited for w to be ready. */
static void
reqs_send(struct warm *w)
{
    for (struct wreq **p = &w->reqs; *p;) {
        struct wreq *q = *p;
        int r;

        if (!q->msg) {
            p = &q->next;
            continue;
        }
        if ((r = req_send(w, q)) < 0) {
            char why[160];

            *p = q->next;
            snprintf(why, sizeof(why), "cannot send a request to the warm processor: %s",
                     strerror(-r));
            req_answer(q, 0, why);
            continue;
        }
        p = &q->next;
    }
}

/* ---- the process ---- */

static void
warm_free(struct warm *w)
{
    struct warm **p;

    for (p = &W.head; *p && *p != w; p = &(*p)->next)
        ;
    if (*p)
        *p = w->next;
    reqs_fail(w, "the warm processor is gone");
    ev_timer_stop(W.loop, &w->timer_w);
    ev_io_stop(W.loop, &w->sock_w);
    ev_io_stop(W.loop, &w->out_w);
    ev_child_stop(W.loop, &w->child_w);
    if (w->sock >= 0)
        close(w->sock);
    if (w->sp.out_fd >= 0)
        close(w->sp.out_fd);
    if (w->sp.pid > 0)
        kill(w->sp.pid, SIGKILL); /* (reaped by libev's handler) */
    buf_free(&w->line);
    free(w);
}

/* Logs complete lines of its output, OUT_LOG_MAX bytes in all: a
 * processor that loops printing fills the log once, not the journal. A
 * line longer than OUT_LINE_MAX is logged in pieces, so the buffer stays
 * bounded too. */
static void
out_lines(struct warm *w, bool flush)
{
    size_t start = 0;

    for (size_t i = 0; i <= w->line.len; i++) {
        bool end = i == w->line.len;

        if (!(end ? flush && i > start : w->line.p[i] == '\n' || i - start >= OUT_LINE_MAX))
            continue;
        if (w->logged < OUT_LOG_MAX)
            log_info(&w->ctx, "warm processor: %.*s", (int)(i - start), w->line.p + start);
        w->logged += i - start;
        start = end || w->line.p[i] != '\n' ? i : i + 1;
    }
    if (start > 0) {
        memmove(w->line.p, w->line.p + start, w->line.len - start);
        w->line.len -= start;
    }
}

static void
out_cb(struct ev_loop *loop, ev_io *ev, int revents)
{
    struct warm *w = ev->data;
    char chunk[4096];
    ssize_t n = read(w->sp.out_fd, chunk, sizeof(chunk));

    (void)revents;
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0) {
        buf_append(&w->line, chunk, (size_t)n);
        out_lines(w, false);
        return;
    }
    out_lines(w, true);
    ev_io_stop(loop, ev);
    close(w->sp.out_fd);
    w->sp.out_fd = -1;
}

/* A failure of the warm processor's: counted, and after WARM_MAX_FAILURES
 * in a row the job's attempts are exec'd for a while. */
static void
warm_failed(struct warm *w, const char *why)
{
    double now = time_mono(), delay = 1.0;

    /* 1, 2, 4, ... s up to BACKOFF_MAX_SECS before the next start; the
     * count is reset only by a warm processor that becomes ready */
    w->failures++;
    for (int i = 1; i < w->failures && delay < BACKOFF_MAX_SECS; i++)
        delay *= 2;
    w->not_before = now + (delay < BACKOFF_MAX_SECS ? delay : BACKOFF_MAX_SECS);
    if (w->failures >= WARM_MAX_FAILURES) {
        w->disabled_until = now + WARM_DISABLE_SECS;
        log_warning(&w->ctx,
                    "the warm processor failed %d times in a row (last: %s): this "
                    "job's attempts are exec'd for the next %.0f s",
                    w->failures, why, WARM_DISABLE_SECS);
    } else {
        log_warning(&w->ctx, "warm processor: %s; attempts are exec'd until another is ready", why);
    }
}

static void
child_cb(struct ev_loop *loop, ev_child *ev, int revents)
{
    struct warm *w = ev->data;
    char how[64], why[160];
    int code;

    (void)revents;
    ev_child_stop(loop, ev);
    spawn_describe(ev->rstatus, how, &code);
    w->sp.pid = 0;
    if (w->state != W_DEAD) {
        snprintf(why, sizeof(why), "it %s %s%s", code < 0 ? "was" : "exited with", how,
                 w->state == W_STARTING ? " before it was ready" : "");
        /* a ready one that exits 0 has ended on its own: not a failure */
        if (w->state == W_STARTING || code != 0)
            warm_failed(w, why);
        else
            log_info(&w->ctx, "the warm processor ended (%s)", how);
        warm_stop(w, why);
    } else {
        /* (stopped, or its socket closed first: how it ended, still) */
        log_info(&w->ctx, "the warm processor (pid %ld) ended: it %s %s", (long)ev->rpid,
                 code < 0 ? "was" : "exited with", how);
    }
}

/* One message of the warm processor's or of one of its forks; the
 * kernel says who sent it (SO_PASSCRED): from, of uid from_uid. */
static void
on_message(struct warm *w, const char *text, pid_t from, uid_t from_uid)
{
    cJSON *j = cJSON_Parse(text);
    const cJSON *ready = cJSON_GetObjectItemCaseSensitive(j, "ready");
    char why[ESD_ERR_MAX];

    /* The uid is the kernel's, not the message's: only the warm
     * processor and its forks run as w->uid (a message without
     * credentials has uid -1 and fails too). */
    if (!cJSON_IsObject(j) || from_uid != w->uid) {
        warm_failed(w, from_uid != w->uid ? "a message came from another user"
                                          : "it sent something that is not a JSON object");
        warm_stop(w, "a protocol error");
    } else if (w->state == W_STARTING) {
        if (cJSON_IsTrue(ready) && from == w->sp.pid) {
            w->state = W_READY;
            w->failures = 0;
            log_info(&w->ctx, "the warm processor is ready after %.1f s (pid %ld)",
                     time_mono() - w->started, (long)w->sp.pid);
            reqs_send(w);
            if (W.ready)
                W.ready();
        } else {
            const char *e = json_get_str(j, "error");

            snprintf(why, sizeof(why), "it cannot serve: %s", e ? e : "(it did not say ready)");
            warm_failed(w, why);
            warm_stop(w, why);
        }
    } else {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(j, "id");
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
        const char *e = json_get_str(j, "error");
        struct wreq **p, *q;

        /* (also the late answer of a request warm_cancel dropped) */
        if (!cJSON_IsNumber(id) || !*(p = req_find(w, (unsigned)id->valuedouble)) || (*p)->msg) {
            log_debug(&w->ctx, "warm processor: an answer to no request of ours: %.200s", text);
        } else {
            q = *p;
            *p = q->next;
            /* The fork speaks for itself: the pid is the sender's, as the
             * kernel says, and not the warm processor's own. The runner
             * moves this pid into the attempt's cgroup and signals it, so
             * a pid a message merely names (any process of the user's,
             * or none) is never taken. */
            if (cJSON_IsNumber(pid) && from > 1 && pid->valuedouble == (double)from &&
                from != w->sp.pid) {
                req_answer(q, from, NULL);
            } else {
                snprintf(why, sizeof(why), "the warm processor did not fork the attempt: %s",
                         e ? e : "the answer did not come from the fork it names");
                req_answer(q, 0, why);
            }
        }
    }
    cJSON_Delete(j);
}

static void
sock_cb(struct ev_loop *loop, ev_io *ev, int revents)
{
    struct warm *w = ev->data;
    char *msg = xmalloc(MSG_MAX + 1);
    char cbuf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(16 * sizeof(int))];
    struct iovec iov = { .iov_base = msg, .iov_len = MSG_MAX };
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)
    };
    struct ucred cred = { .pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    /* MSG_TRUNC: n is the message's real length, so one over MSG_MAX is
     * refused rather than read cut; MSG_CMSG_CLOEXEC: a descriptor sent to
     * us never leaks into a child spawned before it is closed below. */
    ssize_t n = recvmsg(w->sock, &mh, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC);

    (void)loop;
    (void)revents;
    for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
            cm->cmsg_len >= CMSG_LEN(sizeof(cred)))
            memcpy(&cred, CMSG_DATA(cm), sizeof(cred));
        else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            /* (descriptors nobody asked for) */
            for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int fd;

                memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
                close(fd);
            }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        free(msg);
        return;
    }
    if (n <= 0 || n > MSG_MAX) {
        free(msg);
        if (n > MSG_MAX) {
            warm_failed(w, "it sent a message that is too long");
            warm_stop(w, "a protocol error");
        } else if (w->state != W_DEAD) {
            warm_failed(w, "it closed its socket");
            warm_stop(w, "it closed its socket");
        }
        return;
    }
    msg[n] = '\0';
    on_message(w, msg, cred.pid, cred.uid);
    free(msg);
    if (w->state != W_DEAD)
        warm_arm(w);
}

static void
timer_cb(struct ev_loop *loop, ev_timer *ev, int revents)
{
    struct warm *w = ev->data;
    double now = time_mono();

    (void)loop;
    (void)revents;
    if (w->state == W_STARTING && now - w->started >= WARM_READY_SECS) {
        warm_failed(w, "it was not ready in time");
        warm_stop(w, "not ready in time");
        return;
    }
    for (struct wreq *q = w->reqs; q; q = q->next)
        if (!q->msg && now - q->asked >= WARM_REPLY_SECS) {
            warm_failed(w, "it did not answer a request in time");
            warm_stop(w, "no answer in time");
            return;
        }
    if (w->state == W_READY && !w->reqs && now - w->last_used >= WARM_IDLE_SECS) {
        log_info(&w->ctx, "the warm processor was idle for %.0f s: stopping it", WARM_IDLE_SECS);
        warm_stop(w, "idle");
        return;
    }
    warm_arm(w);
}

/* The timer, at the nearest deadline of w's: the start's (starting) or
 * the idle end (ready), and every sent request's answer. */
static void
warm_arm(struct warm *w)
{
    double now = time_mono(), at;

    if (w->state == W_STARTING)
        at = w->started + WARM_READY_SECS;
    else
        at = w->last_used + WARM_IDLE_SECS;
    for (struct wreq *q = w->reqs; q; q = q->next)
        if (!q->msg && q->asked + WARM_REPLY_SECS < at)
            at = q->asked + WARM_REPLY_SECS;
    ev_timer_stop(W.loop, &w->timer_w);
    ev_timer_set(&w->timer_w, at > now ? at - now : 0.001, 0);
    ev_timer_start(W.loop, &w->timer_w);
}

/* Ends w's process (if any) and answers what it had not answered; w
 * stays (its failures count) until its job goes, so that the backoff and
 * the disabling outlive the processes they judge. W_DEAD first: child_cb
 * then only logs how the killed process ended. */
static void
warm_stop(struct warm *w, const char *why)
{
    char text[160];

    w->state = W_DEAD;
    ev_timer_stop(W.loop, &w->timer_w);
    ev_io_stop(W.loop, &w->sock_w);
    if (w->sock >= 0) {
        close(w->sock);
        w->sock = -1;
    }
    if (w->sp.pid > 0)
        kill(w->sp.pid, SIGKILL); /* child_cb reaps it */
    snprintf(text, sizeof(text), "the warm processor stopped (%s)", why);
    reqs_fail(w, text);
}

/* Starts w's process for the attempt rq describes. 0 or a negative
 * errno (logged). */
static int
warm_spawn(struct warm *w, const struct warm_req *rq)
{
    struct strv argv, env;
    struct esd_err err;
    int sv[2], r;

    if (w->sp.out_fd >= 0) { /* (the last one's, not at its end yet) */
        ev_io_stop(W.loop, &w->out_w);
        close(w->sp.out_fd);
        w->sp.out_fd = -1;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        r = -errno;
        log_warning(&w->ctx, "cannot start a warm processor: socketpair: %s", strerror(errno));
        return r;
    }
    /* every message says who sent it (the kernel's pid and uid, which
     * on_message trusts and a sender cannot forge) */
    if (setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &(int){ 1 }, sizeof(int)) < 0) {
        r = -errno;
        log_warning(&w->ctx, "cannot start a warm processor: SO_PASSCRED: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return r;
    }
    strv_init(&argv);
    strv_push(&argv, rq->python);
    strv_push(&argv, rq->runner);
    strv_push(&argv, "--warm");
    /* its environment: the attempt's, less what is the attempt's alone
     * (each request carries its attempt's whole environment for the fork) */
    strv_init(&env);
    for (char *const *e = rq->envp; e && *e; e++)
        if (strncmp(*e, "DJ_PRODUCED_DATA_DIR=", 21))
            strv_push(&env, *e);
    r = spawn_start_with_input(argv.v, env.v, rq->cwd, rq->cred, sv[1], &w->sp, &err);
    strv_free(&argv);
    strv_free(&env);
    close(sv[1]);
    if (r < 0) {
        close(sv[0]);
        w->sp.pid = 0;
        warm_failed(w, err.msg);
        return r;
    }
    w->sock = sv[0];
    fcntl(w->sock, F_SETFL, fcntl(w->sock, F_GETFL) | O_NONBLOCK);
    fcntl(w->sp.out_fd, F_SETFL, fcntl(w->sp.out_fd, F_GETFL) | O_NONBLOCK);
    w->state = W_STARTING;
    w->started = w->last_used = time_mono();
    w->uid = rq->cred ? rq->cred->uid : geteuid();
    w->logged = 0;
    buf_reset(&w->line);
    ev_io_init(&w->sock_w, sock_cb, w->sock, EV_READ);
    w->sock_w.data = w;
    ev_io_start(W.loop, &w->sock_w);
    ev_io_init(&w->out_w, out_cb, w->sp.out_fd, EV_READ);
    w->out_w.data = w;
    ev_io_start(W.loop, &w->out_w);
    ev_child_init(&w->child_w, child_cb, w->sp.pid, 0);
    w->child_w.data = w;
    ev_child_start(W.loop, &w->child_w);
    log_info(&w->ctx, "started a warm processor (pid %ld): %s %s --warm", (long)w->sp.pid,
             rq->python, rq->runner);
    warm_arm(w);
    return 0;
}

/* ---- the interface ---- */

void
warm_init(struct ev_loop *loop, const struct esd_conf *c)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    W.loop = loop;
    W.conf = c;
    jobs_set_unloaded(warm_forget_job);
    if (n > 0) {
        self[n] = '\0';
        W.self = xstrdup(self);
    }
}

void
warm_reconfigure(const struct esd_conf *c)
{
    W.conf = c;
    /* (its environment, interpreter or settings may be others now) */
    while (W.head)
        warm_free(W.head);
}

void
warm_fini(void)
{
    while (W.head)
        warm_free(W.head);
    free(W.self);
    W.self = NULL;
}

int
warm_request(struct job *j, const struct warm_req *rq, warm_done_fn done, void *arg)
{
    struct warm *w;
    struct wreq *q;
    cJSON *o, *a;
    double now = time_mono();
    int r = 0;

    if (!W.loop || !W.self || !rq->python || !rq->runner)
        return -EAGAIN;
    for (w = W.head; w && w->job != j; w = w->next)
        ;
    if (!w) {
        w = xcalloc(1, sizeof(*w));
        w->job = j;
        w->ctx.job = &j->log;
        w->state = W_DEAD;
        w->sock = -1;
        w->sp.out_fd = w->sp.report_fd = -1;
        buf_init(&w->line);
        ev_timer_init(&w->timer_w, timer_cb, 1.0, 0);
        w->timer_w.data = w;
        w->next = W.head;
        W.head = w;
    }
    if (now < w->disabled_until)
        return -EAGAIN;
    /* A new process only once the last one is reaped (two warm
     * processors of one job never overlap) and its backoff is over; one
     * after a disabled period starts with its failures forgotten. */
    if (w->state == W_DEAD) {
        if (w->sp.pid > 0 || now < w->not_before)
            return -EAGAIN; /* (the last one is still going, or backing off) */
        if (w->disabled_until > 0) {
            w->disabled_until = 0;
            w->failures = 0;
        }
        if ((r = warm_spawn(w, rq)) < 0)
            return -EAGAIN;
    }
    q = xcalloc(1, sizeof(*q));
    q->id = ++w->next_id;
    q->done = done;
    q->arg = arg;
    /* Copies, held until sent: the caller closes its own at once, and a
     * request queued while the warm processor starts must not lose them. */
    q->fds[0] = fcntl(rq->out_w, F_DUPFD_CLOEXEC, 3);
    q->fds[1] = fcntl(rq->rep_w, F_DUPFD_CLOEXEC, 3);
    q->fds[2] = fcntl(rq->go_r, F_DUPFD_CLOEXEC, 3);
    q->fds[3] = rq->gate_r >= 0 ? fcntl(rq->gate_r, F_DUPFD_CLOEXEC, 3) : -1;
    if (q->fds[0] < 0 || q->fds[1] < 0 || q->fds[2] < 0 || (rq->gate_r >= 0 && q->fds[3] < 0)) {
        req_free(q);
        return -EAGAIN;
    }
    o = cJSON_CreateObject();
    json_add_int(o, "id", q->id);
    a = cJSON_AddArrayToObject(o, "argv");
    for (char *const *p = rq->argv; p && *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateString(*p));
    a = cJSON_AddArrayToObject(o, "env");
    for (char *const *p = rq->envp; p && *p; p++)
        cJSON_AddItemToArray(a, cJSON_CreateString(*p));
    json_add_str(o, "cwd", rq->cwd);
    if (rq->gate_r >= 0)
        cJSON_AddBoolToObject(o, "gate", true);
    a = cJSON_AddArrayToObject(o, "keeper");
    cJSON_AddItemToArray(a, cJSON_CreateString(W.self));
    cJSON_AddItemToArray(a, cJSON_CreateString(SPAWN_KEEPER_ARG));
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)(long long)(rq->grace * 1000.0)));
    cJSON_AddItemToArray(a, cJSON_CreateNumber((double)getpid()));
    q->msg = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!q->msg || strlen(q->msg) > MSG_MAX) {
        req_free(q);
        return -EAGAIN;
    }
    /* Ready: sent now. Starting: queued, sent by reqs_send at "ready". A
     * full socket (-EAGAIN) is no fault of the warm processor's. */
    if (w->state == W_READY && (r = req_send(w, q)) < 0) {
        /* (not answered through done: the caller execs at once) */
        req_free(q);
        if (r != -EAGAIN) {
            warm_failed(w, "its socket is broken");
            warm_stop(w, "its socket is broken");
        }
        return -EAGAIN;
    }
    q->next = w->reqs;
    w->reqs = q;
    w->last_used = now;
    warm_arm(w);
    return 0;
}

void
warm_set_ready_cb(void (*ready)(void))
{
    W.ready = ready;
}

bool
warm_ready(const struct job *j)
{
    for (struct warm *w = W.head; w; w = w->next)
        if (w->job == j)
            return w->state == W_READY && time_mono() >= w->disabled_until;
    return false;
}

void
warm_cancel(void *arg)
{
    for (struct warm *w = W.head; w; w = w->next)
        for (struct wreq **p = &w->reqs; *p;) {
            struct wreq *q = *p;

            if (q->arg == arg) {
                *p = q->next;
                req_free(q);
            } else {
                p = &q->next;
            }
        }
}

void
warm_forget_job(const struct job *j)
{
    for (struct warm *w = W.head; w;) {
        struct warm *next = w->next;

        if (w->job == j)
            warm_free(w);
        w = next;
    }
}
