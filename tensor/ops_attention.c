/* ops_attention.c */
#include "tensor_impl.h"
