/* nccl.h — the NCCL API as ember's CUDA emulator serves it (meson -Dcuda=sim):
 * the subset of the real header's types, constants and functions that ember
 * calls, with the real names and values (NCCL 2.21), so the same sources
 * compile against either. C and C++.
 *
 * Semantics are NCCL's, run on the CPU across processes through shared
 * memory (tests/cusim/nccl.c), with what NCCL leaves to hang turned into
 * errors: ranks that call different collectives, or the same one on
 * different counts, types, operations or roots, get ncclInvalidUsage on
 * every rank; a peer that died gets ncclRemoteError; a peer that never calls
 * gets ncclSystemError after EMBER_CUSIM_NCCL_TIMEOUT seconds (default 60).
 * ncclGetLastError(comm) says which ranks and which calls. After such an
 * error the communicator is broken: every later call on it fails the same
 * way, and the caller should destroy (or abort) it. */
#ifndef EMBER_CUSIM_NCCL_H
#define EMBER_CUSIM_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 21
#define NCCL_PATCH 5
#define NCCL_SUFFIX ""
/* from 2.9 on: X*10000 + Y*100 + Z */
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* ---- communicators ----------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version);
/* A fresh id; rank 0 makes it and passes it to the others (ember: its store). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
/* Collective over the nranks callers of the same id, each with its own rank;
 * the communicator belongs to the calling thread's current device. Blocks
 * until every rank has arrived. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

const char *ncclGetErrorString(ncclResult_t result);
/* The last error's message, on comm (or on the calling thread when comm is NULL). */
const char *ncclGetLastError(ncclComm_t comm);

/* ---- collectives (stream-ordered; buffers are device memory) ------------------- */

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
/* recvbuff: nranks x sendcount, rank-ordered */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
/* sendbuff: nranks x recvcount; rank r gets the reduction of block r */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* ---- point to point ------------------------------------------------------------ */

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);

/* ---- groups: calls between Start and End run together at End ---------------------- */
/* Collectives in call order, then every send and receive together (so a
 * send/recv pair in one group cannot deadlock); several communicators in one
 * group run on one thread each. ncclCommInitRank is not deferred: it runs at
 * once even inside a group. */

ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif
#endif
