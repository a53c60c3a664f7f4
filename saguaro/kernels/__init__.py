"""saguaro's own CPU kernels (``cpu_kernels.c``): quantized and dense linear layers, RMSNorm,
SwiGLU and paged attention whose result for a row never depends on what shares its call, and
the counter-based noise of sampling (its hash, and coupled sampling's perturbed argmax)."""
