/* ops_matmul.c */
#include "tensor_impl.h"
