/* test_dropout.c */
#include "harness.h"
