/* ops_dropout.c */
#include "tensor_impl.h"
