/* test_matmul.c */
#include "harness.h"
