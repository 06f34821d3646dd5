/* test_autograd.c */
#include "harness.h"
