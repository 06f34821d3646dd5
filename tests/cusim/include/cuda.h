/* cuda.h — the CUDA driver API as ember's CUDA emulator serves it (meson
 * -Dcuda=sim): only virtual memory management (address reservations,
 * physical allocations mapped into them, access), the part ember uses
 * (tensor/cuda_vmm.c, which reaches the functions through
 * cudaGetDriverEntryPointByVersion, as it does under the real toolkit).
 * Types, constants and signatures carry the real header's names and
 * values, so the same sources compile against either. C and C++.
 * Semantics and argument rules are the driver's (tests/cusim/vmm.c), with
 * the emulator's checkers aware of what is mapped. */
#ifndef EMBER_CUSIM_CUDA_H
#define EMBER_CUSIM_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_VERSION 13000

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801
} CUresult;

typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef enum CUmemAllocationHandleType_enum { CU_MEM_HANDLE_TYPE_NONE = 0x0 } CUmemAllocationHandleType;

typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
} CUmemAccess_flags;

typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0x0,
    CU_MEM_LOCATION_TYPE_DEVICE = 0x1
} CUmemLocationType;

typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
} CUmemAllocationType;

typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id; /* a device ordinal for CU_MEM_LOCATION_TYPE_DEVICE */
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* The minimum (and recommended) size and alignment of what is created and
 * mapped: 2 MiB, as an H100 reports, or EMBER_CUSIM_VMM_GRANULARITY (a
 * multiple of the host page size), so tests can map small models in parts. */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
/* size and addr multiples of the host page size, alignment 0 or a power of
 * two, flags 0; addr is a hint. Nothing is mapped: every access faults. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
/* ptr and size exactly a reservation's, with nothing mapped in it. */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
/* Physical memory of size bytes (a multiple of the granularity) on the
 * device prop->location.id; counts against the device's memory. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
/* The memory goes once it is released and no longer mapped. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
/* Maps all of handle (offset 0, size its size: a multiple of the
 * granularity, as ptr) at ptr, inside a reservation, where nothing is
 * mapped yet. Not accessible until cuMemSetAccess. */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
/* [ptr, ptr + size) must be whole mappings (not a part of one). */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
/* [ptr, ptr + size) must be fully mapped; each desc names a device and
 * its access. */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);

#ifdef __cplusplus
}
#endif
#endif
