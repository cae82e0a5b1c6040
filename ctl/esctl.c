/* esctl: placeholder main while the command table is written. */
#include <stdio.h>
int
main(void)
{
    fputs("esctl: not built yet\n", stderr);
    return 2;
}
