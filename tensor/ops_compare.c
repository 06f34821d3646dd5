/* ops_compare.c */
#include "tensor_impl.h"
