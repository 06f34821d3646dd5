/* test_optim.c — placeholder until its issue-3 work lands. */
#include "harness.h"
