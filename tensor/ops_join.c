/* ops_join.c */
#include "tensor_impl.h"
