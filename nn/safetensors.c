/* safetensors.c — placeholder until its issue-3 work lands. */
#include "../tensor/tensor_impl.h"
