/* test_view.c */
#include "harness.h"
