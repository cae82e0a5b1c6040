/*
 * esctl: argument parsing, usage and help from the command table, and
 * dispatch. Options follow the reference's names (--job-dir, --num-shards,
 * …) and accept both "--opt value" and "--opt=value".
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "esctl.h"
#include "json.h"
#include "proto.h"


static void
usage(FILE *f)
{
    fprintf(f, "usage: esctl [--json] [--local] [--socket PATH] <command> [options]\n"
               "       esctl <command> --help\n\ncommands:\n");
    for (size_t i = 0; i < esctl_ncmds; i++)
        fprintf(f, "  %-8s %s\n", esctl_cmds[i].name, esctl_cmds[i].summary);
    fprintf(f, "\nexit status: 0 ok, 1 incomplete (status), 2 error or failed shards,\n"
               "3 cannot reach esd, 4 permission denied. See esctl(1).\n");
}

static void
cmd_help(const struct cmd_def *cmd)
{
    printf("usage: esctl %s %s\n\n%s\n\noptions:\n", cmd->name, cmd->args, cmd->summary);
    for (int o = 0; o < O__COUNT; o++) {
        const struct opt_def *d = &esctl_opts[o];
        char left[64];

        if (!(cmd->opts & OPT(o)))
            continue;
        snprintf(left, sizeof(left), "--%s%s%s", d->name, d->metavar ? " " : "",
                 d->metavar ? d->metavar : "");
        printf("  %-28s %s%s\n", left, d->help, cmd->required & OPT(o) ? " (required)" : "");
    }
}

static const struct cmd_def *
find_cmd(const char *name)
{
    for (size_t i = 0; i < esctl_ncmds; i++)
        if (strcmp(esctl_cmds[i].name, name) == 0)
            return &esctl_cmds[i];
    return NULL;
}

static int
find_opt(const char *name, size_t len)
{
    for (int o = 0; o < O__COUNT; o++)
        if (strlen(esctl_opts[o].name) == len && strncmp(esctl_opts[o].name, name, len) == 0)
            return o;
    return -1;
}

/* Stores one option value; returns EXIT_OK or EXIT_ERROR with a message. */
static int
set_opt(struct call *c, int o, const char *value)
{
    const struct opt_def *d = &esctl_opts[o];
    const char *cmd = c->cmd ? c->cmd->name : "";
    long long v;

    switch (d->kind) {
    case K_FLAG:
        break;
    case K_STR:
        if (c->set[o]) {
            out_error("%s: --%s given twice", cmd, d->name);
            return EXIT_ERROR;
        }
        c->str[o] = value;
        break;
    case K_STRV:
        strv_push(&c->multi[o], value);
        break;
    case K_POSITIVE:
    case K_NONNEG:
        if (parse_int(value, d->kind == K_POSITIVE ? 1 : 0, LLONG_MAX, &v) < 0) {
            out_error("%s: --%s must be a %s integer, got '%s'", cmd, d->name,
                      d->kind == K_POSITIVE ? "positive" : "non-negative", value);
            return EXIT_ERROR;
        }
        c->num[o] = v;
        c->str[o] = value;
        break;
    }
    c->set[o] = true;
    return EXIT_OK;
}

/* Parses argv[i..] as options of c->cmd (global options allowed anywhere). */
static int
parse_args(struct call *c, int argc, char **argv, int i)
{
    const uint64_t global = OPT(O_JSON) | OPT(O_LOCAL) | OPT(O_SOCKET);
    bool positional_done = false;

    for (; i < argc; i++) {
        const char *a = argv[i], *eq, *value = NULL;
        size_t len;
        int o, r;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cmd_help(c->cmd);
            exit(EXIT_OK);
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (c->cmd->positional_job && !positional_done && !c->set[O_JOB_DIR]) {
                c->str[O_JOB_DIR] = a;
                c->set[O_JOB_DIR] = positional_done = true;
                continue;
            }
            out_error("%s: unexpected argument '%s' (see esctl %s --help)", c->cmd->name, a,
                      c->cmd->name);
            return EXIT_ERROR;
        }
        eq = strchr(a + 2, '=');
        len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        o = find_opt(a + 2, len);
        if (o < 0 || !((c->cmd->opts | global) & OPT(o))) {
            out_error("%s: unknown option '%.*s' (see esctl %s --help)", c->cmd->name,
                      (int)len + 2, a, c->cmd->name);
            return EXIT_ERROR;
        }
        if (esctl_opts[o].kind == K_FLAG) {
            if (eq) {
                out_error("%s: --%s takes no value", c->cmd->name, esctl_opts[o].name);
                return EXIT_ERROR;
            }
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            out_error("%s: --%s needs a value", c->cmd->name, esctl_opts[o].name);
            return EXIT_ERROR;
        }
        if ((r = set_opt(c, o, value)) != EXIT_OK)
            return r;
    }
    for (int o = 0; o < O__COUNT; o++)
        if ((c->cmd->required & OPT(o)) && !c->set[o]) {
            out_error("%s: --%s is required (see esctl %s --help)", c->cmd->name,
                      esctl_opts[o].name, c->cmd->name);
            return EXIT_ERROR;
        }
    return EXIT_OK;
}

/*
 * Where a command runs: through esd when it has a daemon side (status
 * without a job directory, ping), in-process with --local or when it only
 * reads a job directory; a command that changes a job needs --local until
 * esd offers it.
 */
static int
dispatch(struct call *c)
{
    const struct cmd_def *cmd = c->cmd;
    bool daemon_side = cmd->remote && (!cmd->local || !c->set[O_JOB_DIR]);

    if (c->set[O_LOCAL]) {
        if (!cmd->local) {
            out_error("%s has no local mode: it asks esd", cmd->name);
            return EXIT_ERROR;
        }
        return cmd->local(c);
    }
    if (daemon_side)
        return cmd->remote(c);
    if (cmd->reads_only)
        return cmd->local(c);
    out_error("%s: this esctl runs it only in-process: pass --local to work on the job "
              "directory directly",
              cmd->name);
    return EXIT_UNREACHABLE;
}

int
main(int argc, char **argv)
{
    struct call c;
    int i = 1, r;

    memset(&c, 0, sizeof(c));
    json_init();
    /* Global options before the command. */
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (!strcmp(argv[i], "--json"))
            c.set[O_JSON] = true;
        else if (!strcmp(argv[i], "--local"))
            c.set[O_LOCAL] = true;
        else if (!strcmp(argv[i], "--socket") && i + 1 < argc)
            c.str[O_SOCKET] = argv[++i], c.set[O_SOCKET] = true;
        else if (!strncmp(argv[i], "--socket=", 9))
            c.str[O_SOCKET] = argv[i] + 9, c.set[O_SOCKET] = true;
        else if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return EXIT_OK;
        } else if (!strcmp(argv[i], "--version")) {
            printf("esctl %s\n", ESD_VERSION);
            return EXIT_OK;
        } else {
            out_error("unknown option '%s'", argv[i]);
            usage(stderr);
            return EXIT_ERROR;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return EXIT_ERROR;
    }
    if (!strcmp(argv[i], "help") || !strcmp(argv[i], "-h")) {
        const struct cmd_def *cmd = i + 1 < argc ? find_cmd(argv[i + 1]) : NULL;
        if (cmd)
            cmd_help(cmd);
        else
            usage(stdout);
        return EXIT_OK;
    }
    if (!(c.cmd = find_cmd(argv[i]))) {
        out_error("unknown command '%s'", argv[i]);
        usage(stderr);
        return EXIT_ERROR;
    }
    r = parse_args(&c, argc, argv, i + 1);
    if (r == EXIT_OK) {
        c.json = c.set[O_JSON];
        c.tty_out = isatty(STDOUT_FILENO);
        c.tty_err = isatty(STDERR_FILENO);
        c.color = c.tty_out && !getenv("NO_COLOR");
        r = dispatch(&c);
    }
    for (int o = 0; o < O__COUNT; o++)
        strv_free(&c.multi[o]);
    return r;
}
