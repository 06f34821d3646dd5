/* runtime.c */
#include "tensor_impl.h"
