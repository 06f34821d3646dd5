/* test_norm.c */
#include "harness.h"
