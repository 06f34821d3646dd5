/* test_compare.c */
#include "harness.h"
