/* test_conv.c */
#include "harness.h"
