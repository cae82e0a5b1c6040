/*
 * esctl: argument parsing, usage and help from the command table of
 * common/cmds.c, then call_run(). Options follow the reference's names
 * (--job-dir, --num-shards, …) and accept both "--opt value" and
 * "--opt=value"; the global options may come before the command or among
 * its options.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "esctl.h"
#include "json.h"
#include "proto.h"

static void
usage(FILE *f)
{
    int width = 0;

    for (size_t i = 0; i < CMD__COUNT; i++)
        if ((int)strlen(cmd_table[i].name) > width)
            width = (int)strlen(cmd_table[i].name);
    fprintf(f, "usage: esctl [--json] [--local] [--socket PATH] <command> [options]\n"
               "       esctl <command> --help\n\ncommands:\n");
    for (size_t i = 0; i < CMD__COUNT; i++)
        fprintf(f, "  %-*s  %s\n", width, cmd_table[i].name, cmd_table[i].summary);
    fprintf(f, "\nexit status: 0 ok, 1 incomplete (status; wait: timed out), 2 error or failed\n"
               "shards (wait: failed or cancelled), 3 cannot reach esd, 4 permission denied.\n"
               "See esctl(1).\n");
}

static void
cmd_help(const struct cmd_def *cmd)
{
    printf("usage: esctl %s%s%s\n\n%s\n", cmd->name, *cmd->args ? " " : "", cmd->args,
           cmd->summary);
    if (cmd->opts)
        printf("\noptions:\n");
    for (int o = 0; o < O__COUNT; o++) {
        const struct opt_def *d = &cmd_opts[o];
        char left[64];

        if (!(cmd->opts & OPT(o)))
            continue;
        snprintf(left, sizeof(left), "--%s%s%s", d->name, d->metavar ? " " : "",
                 d->metavar ? d->metavar : "");
        printf("  %-28s %s%s\n", left, d->help, cmd->required & OPT(o) ? " (required)" : "");
    }
}

static int
find_opt(const char *name, size_t len)
{
    for (int o = 0; o < O__COUNT; o++)
        if (strlen(cmd_opts[o].name) == len && strncmp(cmd_opts[o].name, name, len) == 0)
            return o;
    return -1;
}

/* Stores one option value; returns EXIT_OK or EXIT_ERROR with a message. */
static int
set_opt(struct call *c, int o, const char *value)
{
    const struct opt_def *d = &cmd_opts[o];
    const char *cmd = c->cmd ? c->cmd->name : "esctl";
    long long v;

    switch (d->kind) {
    case K_FLAG:
        break;
    case K_STR:
        if (c->set[o]) {
            out_error("%s: --%s given twice", cmd, d->name);
            return EXIT_ERROR;
        }
        if (!*value) {
            out_error("%s: --%s needs a non-empty value", cmd, d->name);
            return EXIT_ERROR;
        }
        c->str[o] = value;
        break;
    case K_STRV:
        if (!*value) {
            out_error("%s: --%s needs a non-empty value", cmd, d->name);
            return EXIT_ERROR;
        }
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

/*
 * Parses argv[i..] as options of c->cmd (global options allowed anywhere).
 * Returns EXIT_OK, EXIT_ERROR with a message, or -1 when --help was shown.
 */
static int
parse_args(struct call *c, int argc, char **argv, int i)
{
    bool positional_done = false;

    for (; i < argc; i++) {
        const char *a = argv[i], *eq, *value = NULL;
        size_t len;
        int o, r;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            cmd_help(c->cmd);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (c->cmd->positional_job && !positional_done && !c->set[O_JOB_DIR] && *a) {
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
        if (o < 0 || !((c->cmd->opts | OPT_GLOBAL) & OPT(o))) {
            out_error("%s: unknown option '%.*s' (see esctl %s --help)", c->cmd->name,
                      (int)len + 2, a, c->cmd->name);
            return EXIT_ERROR;
        }
        if (cmd_opts[o].kind == K_FLAG) {
            if (eq) {
                out_error("%s: --%s takes no value", c->cmd->name, cmd_opts[o].name);
                return EXIT_ERROR;
            }
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            out_error("%s: --%s needs a value", c->cmd->name, cmd_opts[o].name);
            return EXIT_ERROR;
        }
        if (o == O_JOB_DIR && positional_done) {
            out_error("%s: the job directory is given twice (positional and --job-dir)",
                      c->cmd->name);
            return EXIT_ERROR;
        }
        if ((r = set_opt(c, o, value)) != EXIT_OK)
            return r;
    }
    for (int o = 0; o < O__COUNT; o++)
        if ((c->cmd->required & OPT(o)) && !c->set[o]) {
            out_error("%s: --%s is required (see esctl %s --help)", c->cmd->name,
                      cmd_opts[o].name, c->cmd->name);
            return EXIT_ERROR;
        }
    return EXIT_OK;
}

/* The global options before the command; returns the index of the
 * command, or -1 with *ret_exit set when there is nothing to run. */
static int
parse_globals(struct call *c, int argc, char **argv, int *ret_exit)
{
    int i = 1;

    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        const char *a = argv[i];

        if (!strcmp(a, "--json")) {
            c->set[O_JSON] = true;
        } else if (!strcmp(a, "--local")) {
            c->set[O_LOCAL] = true;
        } else if (!strcmp(a, "--socket") || !strncmp(a, "--socket=", 9)) {
            const char *v = a[8] == '=' ? a + 9 : i + 1 < argc ? argv[++i] : NULL;

            if (!v) {
                out_error("--socket needs a value");
                *ret_exit = EXIT_ERROR;
                return -1;
            }
            if (set_opt(c, O_SOCKET, v) != EXIT_OK) {
                *ret_exit = EXIT_ERROR;
                return -1;
            }
        } else if (!strcmp(a, "--help")) {
            usage(stdout);
            *ret_exit = EXIT_OK;
            return -1;
        } else if (!strcmp(a, "--version")) {
            printf("esctl %s\n", ESD_VERSION);
            *ret_exit = EXIT_OK;
            return -1;
        } else {
            out_error("unknown option '%s'", a);
            usage(stderr);
            *ret_exit = EXIT_ERROR;
            return -1;
        }
    }
    if (i >= argc) {
        usage(stderr);
        *ret_exit = EXIT_ERROR;
        return -1;
    }
    return i;
}

int
main(int argc, char **argv)
{
    struct call c;
    int i, r = EXIT_OK;

    memset(&c, 0, sizeof(c));
    json_init();
    if ((i = parse_globals(&c, argc, argv, &r)) < 0)
        return r;
    if (!strcmp(argv[i], "help") || !strcmp(argv[i], "-h")) {
        const struct cmd_def *cmd = i + 1 < argc ? cmd_find(argv[i + 1]) : NULL;

        if (cmd)
            cmd_help(cmd);
        else
            usage(stdout);
        return EXIT_OK;
    }
    if (!(c.cmd = cmd_find(argv[i]))) {
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
        r = call_run(&c);
    } else if (r < 0) {
        r = EXIT_OK; /* --help */
    }
    for (int o = 0; o < O__COUNT; o++)
        strv_free(&c.multi[o]);
    return r;
}
