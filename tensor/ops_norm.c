/* ops_norm.c */
#include "tensor_impl.h"
