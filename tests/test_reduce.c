/* test_reduce.c */
#include "harness.h"
