/*
 * classify: a test tool. Reads Data-Juicer operator names from stdin, one a
 * line, and prints "<name> <safe|whole|unknown>" for each: the decision
 * recipe_verdict makes with no caller lists (the built-in exceptions and the
 * name rule). tests/integration/real_registry.sh compares these verdicts
 * with the reference's on the real operator registry. Blank lines are
 * skipped; a trailing "\r" is dropped. Exits 0, or 2 on a read error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe.h"

int
main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;

    while ((n = getline(&line, &cap, stdin)) >= 0) {
        int rc;

        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0)
            continue;
        rc = recipe_verdict(line, NULL);
        printf("%s %s\n", line, rc == 0 ? "safe" : rc == -EPERM ? "whole" : "unknown");
    }
    free(line);
    if (ferror(stdin)) {
        fprintf(stderr, "classify: cannot read stdin: %s\n", strerror(errno));
        return 2;
    }
    return fflush(stdout) == 0 ? 0 : 2;
}
