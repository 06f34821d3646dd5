/* test_loader.c — placeholder until its issue-3 work lands. */
#include "harness.h"
