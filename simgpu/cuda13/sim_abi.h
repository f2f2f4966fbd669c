/*
 * sim_abi.h (CUDA 13) - everything the simulator's fake libraries know that
 * depends on the CUDA major version: version numbers, and the layouts of the
 * structures whose fields changed between releases. Together with the
 * export lists next to this file (<soname>.syms) it is the only
 * version-specific part of simgpu/; build.py puts this directory on the
 * include path. cuda12/ is its sibling for CUDA 12; code that differs
 * between the two tests SIM_CUDA_MAJOR.
 *
 * Field names and layouts follow NVIDIA's CUDA 13.0 headers
 * (driver_types.h); the layouts that are the same in CUDA 12 and 13 are in
 * cudart/rt_api.h and cublas/blas_api.h. tests/sim/test_build.py compiles
 * a layout check against the headers of the installed nvidia wheels when
 * they are present.
 */
#ifndef GPUMEM_SIM_ABI_H
#define GPUMEM_SIM_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_min.h" /* struct CUuuid_st (simgpu/driver) */

#define SIM_CUDA_MAJOR 13
/* cudaRuntimeGetVersion (CUDART_VERSION of the 13.0 runtime). */
#define SIM_CUDART_VERSION 13000
/* cuBLAS / cuBLASLt of the nvidia-cublas 13.1 wheel torch 2.14.1 pins:
 * major*10000 + minor*100 + patch, and libraryPropertyType answers. */
#define SIM_CUBLAS_VER_MAJOR 13
#define SIM_CUBLAS_VER_MINOR 1
#define SIM_CUBLAS_VER_PATCH 1
#define SIM_CUBLAS_VERSION (SIM_CUBLAS_VER_MAJOR * 10000 + SIM_CUBLAS_VER_MINOR * 100 + SIM_CUBLAS_VER_PATCH)
/* cuDNN of the nvidia-cudnn-cu13 wheel torch 2.14.1 pins (9.24.0), and its
 * CUDNN_MAX_DEVICE_VERSION (sm_121). */
#define SIM_CUDNN_MINOR 24
#define SIM_CUDNN_PATCHLEVEL 0
#define SIM_CUDNN_MAX_DEVICE_VERSION 1210
/* NCCL of the nvidia-nccl-cu13 wheel torch 2.14.1 pins. */
#define SIM_NCCL_MINOR 30
#define SIM_NCCL_PATCH 7

/* ---- runtime structures (driver_types.h of CUDA 13.0) ---- */

struct cudaDeviceProp {
    char name[256];
    struct CUuuid_st uuid; /* cudaUUID_t */
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseCudaArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int deviceNumaConfig;
    int deviceNumaId;
    int mpsEnabled;
    int hostNumaId;
    unsigned int gpuPciDeviceID;
    unsigned int gpuPciSubsystemID;
    int hostNumaMultinodeIpcSupported;
    int reserved[56];
};

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
    long reserved[8];
};

#endif /* GPUMEM_SIM_ABI_H */
