/* ops_unary.c */
#include "tensor_impl.h"
