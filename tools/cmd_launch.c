/* cmd_launch.c — placeholder; being written for issue 4. */
#include <stdio.h>
#include "commands.h"
int cmd_launch(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember launch: not built yet\n");
    return 1;
}
