/* test_join.c */
#include "harness.h"
