/* cmd_config.c — placeholder; being written for issue 4. */
#include <stdio.h>
#include "commands.h"
int cmd_config(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember config: not built yet\n");
    return 1;
}
