/* ops_loss.c */
#include "tensor_impl.h"
