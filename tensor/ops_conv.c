/* ops_conv.c */
#include "tensor_impl.h"
