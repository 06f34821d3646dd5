/* pg.c — placeholder; being written for issue 4. */
#include "ember/dist.h"
