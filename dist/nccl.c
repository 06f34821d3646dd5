/* nccl.c — collectives on CUDA tensors through NCCL (built when NCCL is found). */
#include "dist_impl.h"
