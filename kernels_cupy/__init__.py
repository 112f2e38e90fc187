"""CuPy RawKernel twins of :mod:`dflash_ref.ops`.

``kernels_cupy.<family>.<op>`` has the same name, signature and meaning as
``dflash_ref.ops.<family>.<op>``, takes CuPy float32 arrays and returns CuPy arrays. The CUDA
sources live in ``kernels_cupy/cuda/<family>.cu``; :mod:`kernels_cupy._build` loads and
compile-checks them. Importing this package needs CuPy but no GPU.
"""
