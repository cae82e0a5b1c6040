/*
 * esctl: argument parsing, usage and help from the command table of
 * common/cmds.c, then dispatch_run(). Options follow the reference's names
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
#include "suggest.h"

static void
usage(FILE *f)
{
    int width = 0;

    for (size_t i = 0; i < CMD__COUNT; i++)
        if ((int)strlen(cmd_table[i].name) > width)
            width = (int)strlen(cmd_table[i].name);
    fprintf(f, "usage: esctl [--json] [--local] [--socket PATH] [--color WHEN] <command> "
               "[options]\n"
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
        printf("  %-28s %s%s", left, d->help, cmd->required & OPT(o) ? " (required)" : "");
        if (d->alias)
            printf(" (alias --%s)", d->alias);
        putchar('\n');
    }
}

static bool
name_is(const char *known, const char *name, size_t len)
{
    return known && strlen(known) == len && strncmp(known, name, len) == 0;
}

/* The option called name[0..len): one of mask by its name, else one of
 * mask by its alias (logs --shard-id is logs --shard), else any by its
 * name (for the error); -1 if there is none. */
static int
find_opt(uint64_t mask, const char *name, size_t len)
{
    for (int o = 0; o < O__COUNT; o++)
        if ((mask & OPT(o)) && name_is(cmd_opts[o].name, name, len))
            return o;
    for (int o = 0; o < O__COUNT; o++)
        if ((mask & OPT(o)) && name_is(cmd_opts[o].alias, name, len))
            return o;
    for (int o = 0; o < O__COUNT; o++)
        if (name_is(cmd_opts[o].name, name, len))
            return o;
    return -1;
}

/* The option of mask closest to the mistyped name[0..len), or NULL. */
static const char *
closest_opt(uint64_t mask, const char *name, size_t len)
{
    struct suggest s;

    suggest_init(&s, name, len);
    for (int o = 0; o < O__COUNT; o++)
        if (mask & OPT(o))
            suggest_add(&s, cmd_opts[o].name);
    return suggest_result(&s);
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
        /* -o, the one short option: --output, as merge and report name it */
        if (strcmp(a, "-o") == 0 && (c->cmd->opts & OPT(O_OUTPUT)))
            a = "--output";
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
        o = find_opt(c->cmd->opts | OPT_GLOBAL, a + 2, len);
        if (o < 0 || !((c->cmd->opts | OPT_GLOBAL) & OPT(o))) {
            const char *near = closest_opt(c->cmd->opts | OPT_GLOBAL, a + 2, len);

            if (near)
                out_error("%s: unknown option '%.*s'; did you mean '--%s'?", c->cmd->name,
                          (int)len + 2, a, near);
            else
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
            out_error("%s: --%s is required (see esctl %s --help)", c->cmd->name, cmd_opts[o].name,
                      c->cmd->name);
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
        const char *a = argv[i], *eq = strchr(a + 2, '='), *value = NULL;
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        int o = find_opt(OPT_GLOBAL, a + 2, len);

        if (!strcmp(a, "--help")) {
            usage(stdout);
            *ret_exit = EXIT_OK;
            return -1;
        }
        if (!strcmp(a, "--version")) {
            printf("esctl %s\n", ESD_VERSION);
            *ret_exit = EXIT_OK;
            return -1;
        }
        if (o < 0 || !(OPT_GLOBAL & OPT(o))) {
            struct suggest s;

            suggest_init(&s, a + 2, len);
            for (o = 0; o < O__COUNT; o++)
                if (OPT_GLOBAL & OPT(o))
                    suggest_add(&s, cmd_opts[o].name);
            suggest_add(&s, "help");
            suggest_add(&s, "version");
            if (suggest_result(&s)) {
                out_error("unknown option '%.*s'; did you mean '--%s'?", (int)len + 2, a,
                          suggest_result(&s));
            } else {
                out_error("unknown option '%s'", a);
                usage(stderr);
            }
            *ret_exit = EXIT_ERROR;
            return -1;
        }
        if (cmd_opts[o].kind == K_FLAG && eq) {
            out_error("--%s takes no value", cmd_opts[o].name);
            *ret_exit = EXIT_ERROR;
            return -1;
        }
        if (cmd_opts[o].kind != K_FLAG)
            value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (cmd_opts[o].kind != K_FLAG && !value) {
            out_error("--%s needs a value", cmd_opts[o].name);
            *ret_exit = EXIT_ERROR;
            return -1;
        }
        if (set_opt(c, o, value) != EXIT_OK) {
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

/*
 * Colour on stdout: --color always or never, else (auto) on a terminal
 * whose TERM is not "dumb", unless NO_COLOR is set to a non-empty value
 * (no-color.org: an empty NO_COLOR does not count; the command line
 * overrides it). Returns EXIT_OK or EXIT_ERROR with a message.
 */
static int
decide_color(struct call *c)
{
    const char *when = c->set[O_COLOR] ? c->str[O_COLOR] : "auto";
    const char *no_color = getenv("NO_COLOR"), *term = getenv("TERM");

    if (!strcmp(when, "always")) {
        c->color = true;
    } else if (!strcmp(when, "never")) {
        c->color = false;
    } else if (!strcmp(when, "auto")) {
        c->color = c->tty_out && !(no_color && *no_color) && !(term && !strcmp(term, "dumb"));
    } else {
        out_error("--color must be auto, always or never, got '%s'", when);
        return EXIT_ERROR;
    }
    return EXIT_OK;
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
        struct suggest s;

        suggest_init(&s, argv[i], strlen(argv[i]));
        for (size_t k = 0; k < CMD__COUNT; k++)
            suggest_add(&s, cmd_table[k].name);
        suggest_add(&s, "help");
        if (suggest_result(&s)) {
            out_error("unknown command '%s'; did you mean '%s'?", argv[i], suggest_result(&s));
        } else {
            out_error("unknown command '%s'", argv[i]);
            usage(stderr);
        }
        return EXIT_ERROR;
    }
    r = parse_args(&c, argc, argv, i + 1);
    if (r == EXIT_OK) {
        c.json = c.set[O_JSON];
        c.tty_out = isatty(STDOUT_FILENO);
        c.tty_err = isatty(STDERR_FILENO);
        if ((r = decide_color(&c)) == EXIT_OK)
            r = dispatch_run(&c);
    } else if (r < 0) {
        r = EXIT_OK; /* --help */
    }
    for (int o = 0; o < O__COUNT; o++)
        strv_free(&c.multi[o]);
    return r;
}
