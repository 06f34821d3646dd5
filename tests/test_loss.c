/* test_loss.c */
#include "harness.h"
