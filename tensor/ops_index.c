/* ops_index.c */
#include "tensor_impl.h"
