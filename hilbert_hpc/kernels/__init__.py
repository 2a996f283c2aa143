"""GPU kernels: CUDA sources in this folder, described once each in the registry and chosen once per case.

* :mod:`~hilbert_hpc.kernels.registry`: one :class:`~hilbert_hpc.kernels.registry.KernelFamily` per kernel
  family (source, template spelling, configuration, shared memory, compute capabilities, defaults,
  alternatives) and ``instantiations()``, everything CI compiles;
* :mod:`~hilbert_hpc.kernels.selection`: ``choose(dtype, head_dim, cc, override)``, the one decision of which
  kernel runs, ``choose_backward`` the same for the gradients, and their result ``KernelChoice``;
* :mod:`~hilbert_hpc.kernels.launch`: the launch geometry of local patterns and packed ring blocks;
* :mod:`~hilbert_hpc.kernels.fp32` and :mod:`~hilbert_hpc.kernels.sixteen_bit`: the providers that launch a
  choice's kernels on float32 and on 16-bit (bfloat16, float16) arrays; :mod:`~hilbert_hpc.kernels.providers`
  picks between them; :mod:`~hilbert_hpc.kernels.backward`: the provider of the backward kernels;
* :mod:`~hilbert_hpc.kernels.program` and :mod:`~hilbert_hpc.kernels.compile`: sources to cubins through the
  one NVRTC entry with its disk cache, loaded on the GPU; :mod:`~hilbert_hpc.kernels.check`: the CPU compile
  check; :mod:`~hilbert_hpc.kernels.tma`: tma16's tensor maps.

``docs/kernels.md`` describes every family, the selection and the compile cache.
"""
