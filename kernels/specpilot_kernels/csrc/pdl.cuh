// Programmatic dependent launch (sm_90+), shared by every op's kernels (cuda_extension.py puts this folder on each
// extension's include path). A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start
// while the kernel before it in the stream finishes; both calls are no-ops before sm_90 and when the launch did not
// ask for the overlap.
#pragma once

// Blocks until the kernel before this one in the stream has completed and its writes are visible: call it before
// reading anything that kernel may write.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream start its prologue once every block of this one has called it (or exited).
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
