/* cmd_demo.c — `ember demo` (placeholder until the demo is written). */
#include <stdio.h>

#include "commands.h"

int cmd_demo(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "demo: not built yet\n");
    return 1;
}
