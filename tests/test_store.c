/* test_store.c — placeholder; being written for issue 4. */
#include "harness.h"
