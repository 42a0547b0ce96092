"""The Triton kernels' static cost model from their compiled code, without a GPU.

``kernel_builds`` builds each kernel as the JIT does, ``sass`` reads its SASS, ``sass_model``
costs one tile, ``flash_calibration`` is the plain causal kernel it is calibrated on. The
planner's tile counts stay in the product (:mod:`plsh_dist.plan.kernel_tiles`); this package
reads them, never the other way round.
"""
