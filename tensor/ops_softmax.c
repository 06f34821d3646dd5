/* ops_softmax.c */
#include "tensor_impl.h"
