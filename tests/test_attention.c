/* test_attention.c */
#include "harness.h"
