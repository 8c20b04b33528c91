"""Experiment: per_token_requant's e4m3 -> e2m1 kernel made persistent, with a warp that streams each CTA's units of
256 chunks into a ring of shared-memory stages by cp.async.bulk (mbarrier full/empty), and 128 consumer threads that
run the generated kernel's own per-chunk code on them. Reads the lowered .cu, writes pipe-<name>.cu."""
import re
import sys
from pathlib import Path

src = Path(sys.argv[1]).read_text()
out = Path(sys.argv[2])

sig_start = src.index('extern "C" __global__ void per_token_requant_kernel(')
header = src[:sig_start]
decl_line = src[sig_start:src.index('\n', sig_start)]
params = decl_line[decl_line.index('(') + 1:decl_line.rindex(')')]
body_start = src.index('{', src.index('__launch_bounds__', sig_start)) + 1
body = src[body_start:src.rindex('}')]

k_loop = body.index('  #pragma unroll\n  for (int k = 0;')
k1_loop = body.index('  #pragma unroll\n  for (int k_1 = 0;')
decls = body[:k_loop]
load_loop = body[k_loop:k1_loop]
encode_loop = body[k1_loop:]

# The load loop without the data loads (the ring holds them), its chunk index from the unit.
load_loop = re.sub(r'      for \(int e = 0; e < 2; \+\+e\) \{\n.*?load_global_128.*?\n.*?\n      \}\n', '', load_loop, flags=re.DOTALL)
assert 'load_global_128' not in load_loop, load_loop
load_loop = load_loop.replace('((int)blockIdx.x) * 256', 'unit * 256')
assert 'unit * 256' in load_loop

pipe = header + r'''
#ifndef STAGES
#define STAGES 4
#endif
#ifndef CTAS
#define CTAS 4
#endif
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n WAIT%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT%=;\n}"
               :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];" : "=l"(state) : "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
  unsigned long long state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;" : "=l"(state) : "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

#ifdef ELECTED
#define BLOCK_THREADS 128
#else
#define BLOCK_THREADS 160
#endif
extern "C" __global__ void __launch_bounds__(BLOCK_THREADS, CTAS) requant_pipe(''' + params + r''', int num_units) {
  __shared__ __align__(128) uint4 ring[STAGES][512];
  __shared__ __align__(8) unsigned long long full_bar[STAGES];
  __shared__ __align__(8) unsigned long long empty_bar[STAGES];
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) { mbar_init(&full_bar[s], 1); mbar_init(&empty_bar[s], 128); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  const int total_chunks = num_tokens * chunks_per_row;
  auto issue = [&](int it_) {
    const int unit_ = blockIdx.x + it_ * gridDim.x;
    if (unit_ >= num_units) return;
    const int s_ = it_ % STAGES;
    mbar_wait(&empty_bar[s_], ((it_ / STAGES) & 1) ^ 1);
    const int c0 = unit_ * 256, c1 = min(c0 + 256, total_chunks);
    mbar_expect_tx(&full_bar[s_], (unsigned)(c1 - c0) * 32u);
    for (int c = c0; c < c1;) {
      const int row = c / chunks_per_row, chunk = c - row * chunks_per_row;
      const int n = min(c1 - c, chunks_per_row - chunk);
      bulk_load(reinterpret_cast<char*>(ring[s_]) + (c - c0) * 32, x + (int64_t)row * row_stride + chunk * 32, (unsigned)n * 32u, &full_bar[s_]);
      c += n;
    }
  };
#ifdef ELECTED
  if (threadIdx.x == 0) for (int i = 0; i < STAGES - 1; ++i) issue(i);
#else
  if (threadIdx.x >= 128) {
    if (threadIdx.x == 128) {
      int it = 0;
      for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x, ++it) {
        const int s = it % STAGES;
        mbar_wait(&empty_bar[s], ((it / STAGES) & 1) ^ 1);
        const int c0 = unit * 256, c1 = min(c0 + 256, total_chunks);
        mbar_expect_tx(&full_bar[s], (unsigned)(c1 - c0) * 32u);
        for (int c = c0; c < c1;) {
          const int row = c / chunks_per_row, chunk = c - row * chunks_per_row;
          const int n = min(c1 - c, chunks_per_row - chunk);
          bulk_load(reinterpret_cast<char*>(ring[s]) + (c - c0) * 32, x + (int64_t)row * row_stride + chunk * 32, (unsigned)n * 32u, &full_bar[s]);
          c += n;
        }
      }
    }
    return;
  }
#endif
''' + decls + r'''
  int it = 0;
  for (int unit = blockIdx.x; unit < num_units; unit += gridDim.x, ++it) {
    const int s = it % STAGES;
#ifdef ELECTED
    if (threadIdx.x == 0) issue(it + STAGES - 1);
#endif
''' + load_loop + r'''
    mbar_wait(&full_bar[s], (it / STAGES) & 1);
    #pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (actives[k]) {
        *(uint4*)(zero_words + k * 8) = ring[s][(k * 128 + threadIdx.x) * 2];
        *(uint4*)(zero_words + k * 8 + 4) = ring[s][(k * 128 + threadIdx.x) * 2 + 1];
      }
    }
    mbar_arrive(&empty_bar[s]);
''' + encode_loop + r'''
  }
}
'''
out.write_text(pipe)
