/* test_softmax.c */
#include "harness.h"
