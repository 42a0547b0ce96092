"""Developer tools: the fused kernel's static model and compile tables, the GPU check, the rehearsal.

Not installed with ``plsh_dist`` and never imported by it; see README.md.
"""
