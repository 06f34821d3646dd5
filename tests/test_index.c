/* test_index.c */
#include "harness.h"
