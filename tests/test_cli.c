/* test_cli.c */
#include "harness.h"
