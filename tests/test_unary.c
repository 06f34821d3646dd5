/* test_unary.c */
#include "harness.h"
