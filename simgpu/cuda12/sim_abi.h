/*
 * sim_abi.h (CUDA 12) - everything the simulator's fake libraries know that
 * depends on the CUDA major version, for PyTorch's CUDA 12 builds (torch
 * 2.6.0 is cu124; 2.7 to 2.10 are cu126/cu128 on PyPI): version numbers,
 * the layouts of the structures whose fields changed between releases,
 * and the entry points whose names or arguments differ from CUDA 13's.
 * Together with the export lists next to this file (<soname>.syms) it is
 * the only version-specific part of simgpu/; build.py puts this directory
 * on the include path.
 *
 * Field names and layouts follow NVIDIA's CUDA 12.8 headers
 * (driver_types.h of the nvidia-cuda-runtime-cu12 12.8.90 wheel; the
 * layouts that are the same in CUDA 12 and 13 are in cudart/rt_api.h and
 * cublas/blas_api.h; cudaDeviceProp has the same size and
 * fields in 12.4, whose reserved words were split in three);
 * tests/sim/test_build.py compiles a layout check against the headers of
 * the installed CUDA 12 wheels when they are present. A torch built for
 * 12.4 or 12.6 runs on these: every name it imports is in the 12.8 lists.
 */
#ifndef GPUMEM_SIM_ABI_H
#define GPUMEM_SIM_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_min.h" /* struct CUuuid_st (simgpu/driver) */

#define SIM_CUDA_MAJOR 12
/* cudaRuntimeGetVersion (CUDART_VERSION of the 12.8 runtime). */
#define SIM_CUDART_VERSION 12080
/* cuBLAS / cuBLASLt of the nvidia-cublas-cu12 12.8.4 wheel torch 2.10.0
 * pins: major*10000 + minor*100 + patch, and libraryPropertyType answers. */
#define SIM_CUBLAS_VER_MAJOR 12
#define SIM_CUBLAS_VER_MINOR 8
#define SIM_CUBLAS_VER_PATCH 4
#define SIM_CUBLAS_VERSION (SIM_CUBLAS_VER_MAJOR * 10000 + SIM_CUBLAS_VER_MINOR * 100 + SIM_CUBLAS_VER_PATCH)
/* cuDNN of the nvidia-cudnn-cu12 wheel torch 2.10.0 pins (9.10.2; torch
 * 2.6.0 was built against 9.1 and accepts any later minor release), and
 * its CUDNN_MAX_DEVICE_VERSION (sm_120). */
#define SIM_CUDNN_MINOR 10
#define SIM_CUDNN_PATCHLEVEL 2
#define SIM_CUDNN_MAX_DEVICE_VERSION 1200
/* NCCL of the nvidia-nccl-cu12 wheel torch 2.10.0 pins. */
#define SIM_NCCL_MINOR 27
#define SIM_NCCL_PATCH 5

/* ---- runtime structures (driver_types.h of CUDA 12.8) ---- */

/* The layout cudaGetDeviceProperties_v2 fills (CUDA 12's header maps
 * cudaGetDeviceProperties onto it; the unversioned name keeps CUDA 11's
 * layout and stays a stub). */
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
    int clockRate;
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int deviceOverlap;
    int multiProcessorCount;
    int kernelExecTimeoutEnabled;
    int integrated;
    int canMapHostMemory;
    int computeMode;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture1DLinear;
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
    int memoryClockRate;
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
    int singleToDoublePrecisionPerfRatio;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    int cooperativeMultiDeviceLaunch;
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
    int reserved[63];
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
};

#endif /* GPUMEM_SIM_ABI_H */
