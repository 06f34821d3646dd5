/* test_module.c — placeholder until its issue-3 work lands. */
#include "harness.h"
