// Length-invariant CPU kernels for a target's forward: every output element is computed by one fixed sequence of
// instructions that depends only on its own inputs (one row of x and one row of the weight for a linear layer; one
// query and the keys its mask allows, in key order, for attention), never on the number of rows in the call, the
// row's place among them, what the other rows hold, or keys past the query's causal limit. So a token's logits are
// bitwise the same in a 1-token decoding step, a k-token verify, a draft tree or a padded batch.
//
// Reduction order, by construction:
//   linear:    16 fp32 lanes (fp32: FMA; bf16: dot products of bf16 pairs, AVX512-BF16) accumulated over the
//              input features in increasing chunks of one vector, the tail masked with zeros, then one fixed
//              horizontal sum, then the bias. Tiling over rows and outputs only changes which outputs share loads.
//   attention: the keys a query may see (its mask row; causal when there is no mask), in key order: scores by the
//              linear layer's dot product, the max, exp and sum over those scores in chunks of 16 lanes, then the
//              weighted sum of values in key order, divided by the sum.
// Compiled for AVX-512 (F, BW, VL, DQ) with function target attributes, so the module loads on any x86-64 CPU;
// Python calls a kernel only where the CPU has its instructions (bf16 linear layers need AVX512-BF16).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx512bf16")))

namespace {

AVX512 inline float hsum(__m512 v) {  // one fixed tree: 16 -> 8 -> 4 -> 2 -> 1 lanes
  __m256 lo = _mm512_castps512_ps256(v);
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

AVX512 inline __m512 load_bf16_as_f32(const uint16_t* p, __mmask16 m) {
  __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AVX512 inline __m512 load_f32(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

inline uint16_t f32_to_bf16(float f) { return c10::BFloat16(f).x; }  // round to nearest even

// ---- linear, fp32: out[m][n] = sum_k x[m][k] w[n][k] for MR rows × NR weight rows
template <int MR, int NR>
AVX512 inline void tile_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* out,
                            int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mk = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
    __m512 xv[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) xv[m] = load_f32(x + m * ldx + k, mk);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      __m512 wv = load_f32(w + n * ldw + k, mk);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[m][n] = _mm512_fmadd_ps(xv[m], wv, acc[m][n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) out[m * ldo + n] = hsum(acc[m][n]);
}

// ---- linear, bf16 with AVX512-BF16: dot products of bf16 pairs into fp32 lanes, 32 inputs a chunk
template <int MR, int NR>
AVX512_BF16 inline void tile_bf16(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, int64_t K,
                                  float* out, int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mk = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1ull << (K - k)) - 1);
    __m512i xv[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) xv[m] = _mm512_maskz_loadu_epi16(mk, x + m * ldx + k);
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) {
      __m512i wv = _mm512_maskz_loadu_epi16(mk, w + n * ldw + k);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m)
        acc[m][n] = _mm512_dpbf16_ps(acc[m][n], (__m512bh)xv[m], (__m512bh)wv);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NR; ++n) out[m * ldo + n] = hsum(acc[m][n]);
}

// One block of NB weight rows against all M rows: row tiles of 4 (3, 2, 1 at the end) × NR outputs. Which tile
// computes an output never changes its arithmetic.
template <typename T, int NR, void (*Tile1)(const T*, int64_t, const T*, int64_t, int64_t, float*, int64_t),
          void (*Tile2)(const T*, int64_t, const T*, int64_t, int64_t, float*, int64_t),
          void (*Tile4)(const T*, int64_t, const T*, int64_t, int64_t, float*, int64_t)>
inline void rows_block(const T* x, int64_t M, int64_t K, const T* w, float* out /*[M][NR]*/) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) Tile4(x + m * K, K, w, K, K, out + m * NR, NR);
  for (; m + 2 <= M; m += 2) Tile2(x + m * K, K, w, K, K, out + m * NR, NR);
  for (; m < M; ++m) Tile1(x + m * K, K, w, K, K, out + m * NR, NR);
}

template <typename T>
void finish(const float* block, int64_t M, int64_t N, int64_t n0, int64_t nr, const float* bias, T* y);

template <>
void finish<float>(const float* block, int64_t M, int64_t N, int64_t n0, int64_t nr, const float* bias, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < nr; ++n) y[m * N + n0 + n] = block[m * nr + n] + (bias ? bias[n0 + n] : 0.0f);
}

template <>
void finish<uint16_t>(const float* block, int64_t M, int64_t N, int64_t n0, int64_t nr, const float* bias,
                      uint16_t* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < nr; ++n) y[m * N + n0 + n] = f32_to_bf16(block[m * nr + n] + (bias ? bias[n0 + n] : 0.0f));
}

constexpr int NR = 4;  // outputs a tile computes at once (4 rows × 4 outputs: 16 accumulators)

template <typename T, bool BF16>
void linear_impl(const T* x, const T* w, const float* bias, T* y, int64_t M, int64_t K, int64_t N) {
  const int64_t blocks = (N + NR - 1) / NR;
  // grain: at least ~64 KiB of weights a task, so small layers do not pay for threads they cannot use
  const int64_t grain = std::max<int64_t>(1, (64 * 1024) / std::max<int64_t>(1, NR * K * (int64_t)sizeof(T)));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> block(M * NR);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * NR;
      const int64_t nr = std::min<int64_t>(NR, N - n0);
      const T* wb = w + n0 * K;
      // Ask for the whole block's weights at once: the loads below then find them in flight or in cache, instead
      // of waiting on NR interleaved streams the hardware prefetcher follows poorly (about 1.7x the read rate at
      // 1-4 rows). Prefetching changes no arithmetic.
      const char* wbytes = reinterpret_cast<const char*>(wb);
      for (int64_t off = 0; off < nr * K * (int64_t)sizeof(T); off += 64) _mm_prefetch(wbytes + off, _MM_HINT_T0);
      if (nr == NR) {
        if constexpr (BF16)
          rows_block<T, NR, tile_bf16<1, NR>, tile_bf16<2, NR>, tile_bf16<4, NR>>(x, M, K, wb, block.data());
        else
          rows_block<T, NR, tile_f32<1, NR>, tile_f32<2, NR>, tile_f32<4, NR>>(x, M, K, wb, block.data());
      } else {  // the last outputs, one at a time (the same arithmetic per output)
        for (int64_t n = 0; n < nr; ++n) {
          float col[1];
          for (int64_t m = 0; m < M; ++m) {
            if constexpr (BF16) tile_bf16<1, 1>(x + m * K, K, wb + n * K, K, K, col, 1);
            else tile_f32<1, 1>(x + m * K, K, wb + n * K, K, K, col, 1);
            block[m * nr + n] = col[0];
          }
        }
      }
      finish<T>(block.data(), M, N, n0, nr, bias, y);
    }
  });
}

}  // namespace

torch::Tensor linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "invariant linear: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "invariant linear: x and weight dtypes differ");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous(), "invariant linear: a contiguous 2-D weight");
  const int64_t K = weight.size(1), N = weight.size(0);
  TORCH_CHECK(x.size(-1) == K, "invariant linear: x has ", x.size(-1), " features, the weight ", K);
  auto x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = N;
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor b32;
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    b32 = bias->to(torch::kFloat32).contiguous();
    bp = b32.data_ptr<float>();
  }
  if (M > 0) {
    if (x.scalar_type() == torch::kFloat32) {
      linear_impl<float, false>(x2.data_ptr<float>(), weight.data_ptr<float>(), bp, y.data_ptr<float>(), M, K, N);
    } else if (x.scalar_type() == torch::kBFloat16) {
      linear_impl<uint16_t, true>(reinterpret_cast<const uint16_t*>(x2.data_ptr<at::BFloat16>()),
                                  reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), bp,
                                  reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), M, K, N);
    } else {
      TORCH_CHECK(false, "invariant linear: float32 or bfloat16 only, got ", x.scalar_type());
    }
  }
  return y.view(out_sizes);
}

// ---------------------------------------------------------------------------------------------------- attention
namespace {

// exp(x) for x <= 0 (scores minus their max): 2^n · p(r), r = x - n·ln2 in [-ln2/2, ln2/2], a degree-6
// polynomial (relative error ~2e-7); the same lane arithmetic for every element.
AVX512 inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

template <typename T>
AVX512 inline __m512 load_row(const T* p, __mmask16 m);
template <>
AVX512 inline __m512 load_row<float>(const float* p, __mmask16 m) { return load_f32(p, m); }
template <>
AVX512 inline __m512 load_row<uint16_t>(const uint16_t* p, __mmask16 m) { return load_bf16_as_f32(p, m); }

template <typename T>
inline void store_row(T* p, const float* v, int64_t D);
template <>
inline void store_row<float>(float* p, const float* v, int64_t D) { std::copy(v, v + D, p); }
template <>
inline void store_row<uint16_t>(uint16_t* p, const float* v, int64_t D) {
  for (int64_t d = 0; d < D; ++d) p[d] = f32_to_bf16(v[d]);
}

constexpr int64_t MAX_DV = 16;  // head dim up to 256 (16 vectors)
constexpr int64_t ROWS = 8;  // queries of one key/value head a task takes together (sharing each key's loads)

AVX512 inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

// The horizontal sums of 16 vectors at once, bitwise those of `hsum`: each step adds the same lane pairs as
// `hsum` does (i and i + 8, then i and i + 4 of those 8, i and i + 2, i and i + 1), and IEEE addition commutes.
AVX512 inline __m512 hsum16_tree(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int t = 0; t < 8; ++t)
    b[t] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * t], a[2 * t + 1], 0xEE));
  for (int u = 0; u < 4; ++u)
    c[u] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * u], b[2 * u + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * u], b[2 * u + 1], 0xDD));
  for (int w = 0; w < 2; ++w)
    d[w] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * w], c[2 * w + 1], 0x44),
                         _mm512_shuffle_ps(c[2 * w], c[2 * w + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xDD));
}

// hsum16_tree leaves vector t's sum in some lane; this puts it in lane t (a permutation found once by summing
// marker vectors through the same tree; no arithmetic).
AVX512 __m512i hsum16_order() {
  __m512 marker[16];
  for (int t = 0; t < 16; ++t) marker[t] = _mm512_maskz_mov_ps(1, _mm512_set1_ps((float)(t + 1)));
  alignas(64) float lane_of[16];
  _mm512_store_ps(lane_of, hsum16_tree(marker));
  alignas(64) int idx[16];
  for (int l = 0; l < 16; ++l) idx[(int)lane_of[l] - 1] = l;
  return _mm512_load_si512(idx);
}

AVX512 inline __m512 hsum16(const __m512* a) {
  static const __m512i order = hsum16_order();
  return _mm512_permutexvar_ps(order, hsum16_tree(a));
}

// A query's n visible scores (packed, in key order) -> exp(score - max) in place; returns their sum: 16 lanes
// (lane = rank mod 16) added in rank order, then the `hsum` tree.
AVX512 inline float exp_and_sum(float* sc, int64_t n, float max) {
  const __m512 mx = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = lanes(n - t);
    __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + t), mx)));
    _mm512_mask_storeu_ps(sc + t, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return hsum(sum);
}

// Up to ROWS queries of one key/value head against keys [0, L), each seeing those its `allowed` row marks (or,
// with no mask, keys [0, limit]): scores, softmax and the weighted sum of values. Each key's and value's loads are
// shared by the queries; each query's own arithmetic is one fixed sequence that depends only on it and its
// visible keys:
//   score of a key: FMA over dims in chunks of 16 lanes from zero, then the `hsum` tree (16 keys at a time,
//   `hsum16`, whose sum for one key reads that key's lanes only);
//   exp and sum over its visible keys' scores in key order, in chunks of 16 lanes, then `hsum`;
//   output: FMA of each visible key's weight and value, in key order, divided by the sum.
// A query's keys past its own limit are never computed; keys it may not see are never added.
template <typename T>
AVX512 void attend_rows(int64_t R, const float* q /*[R][D] fp32, scaled*/, const bool* const* allowed /*[R]*/,
                        const int64_t* limit /*[R]*/, const T* k, int64_t k_stride, const T* v, int64_t v_stride,
                        int64_t L, int64_t D, int64_t Dv, float* scores /*[R][L + 16]*/, int64_t* keys /*[R][L]*/,
                        float* out /*[R][Dv]*/) {
  const int64_t qv = (D + 15) / 16, vv = (Dv + 15) / 16, ss = L + 16;
  int64_t last[ROWS], n[ROWS];
  float mx[ROWS];
  int64_t reach = -1;  // the last key any of the queries sees
  for (int64_t r = 0; r < R; ++r) {
    last[r] = allowed[r] ? -1 : std::min(limit[r], L - 1);
    if (allowed[r])
      for (int64_t j = L - 1; j >= 0; --j)
        if (allowed[r][j]) { last[r] = j; break; }
    n[r] = 0;
    mx[r] = -INFINITY;
    reach = std::max(reach, last[r]);
  }
  __m512 qr[ROWS][MAX_DV];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < qv; ++c) qr[r][c] = _mm512_maskz_loadu_ps(lanes(D - c * 16), q + r * D + c * 16);
  alignas(64) float block[16];
  __m512 acc[ROWS][16];
  for (int64_t j0 = 0; j0 <= reach; j0 += 16) {
    for (int64_t r = 0; r < R; ++r)
      for (int t = 0; t < 16; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int t = 0; t < 16 && j0 + t <= reach; ++t) {
      const T* key = k + (j0 + t) * k_stride;
      __m512 kc[MAX_DV];
      for (int64_t c = 0; c < qv; ++c) kc[c] = load_row<T>(key + c * 16, lanes(D - c * 16));
      for (int64_t r = 0; r < R; ++r) {
        if (j0 + t > last[r]) continue;
        __m512 a = _mm512_setzero_ps();
        for (int64_t c = 0; c < qv; ++c) a = _mm512_fmadd_ps(qr[r][c], kc[c], a);
        acc[r][t] = a;
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      if (j0 > last[r]) continue;
      _mm512_store_ps(block, hsum16(acc[r]));
      const bool* al = allowed[r];
      for (int t = 0; t < 16 && j0 + t <= last[r]; ++t) {
        if (al && !al[j0 + t]) continue;
        scores[r * ss + n[r]] = block[t];
        keys[r * L + n[r]++] = j0 + t;
        mx[r] = std::max(mx[r], block[t]);
      }
    }
  }
  float total[ROWS];
  for (int64_t r = 0; r < R; ++r) total[r] = exp_and_sum(scores + r * ss, n[r], mx[r]);
  __m512 o[ROWS][MAX_DV];
  int64_t next[ROWS];  // each query's next visible key (an index into its keys)
  for (int64_t r = 0; r < R; ++r) {
    next[r] = 0;
    for (int64_t c = 0; c < vv; ++c) o[r][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j <= reach; ++j) {
    bool seen = false;
    for (int64_t r = 0; r < R; ++r) seen |= next[r] < n[r] && keys[r * L + next[r]] == j;
    if (!seen) continue;
    const T* value = v + j * v_stride;
    __m512 vc[MAX_DV];
    for (int64_t c = 0; c < vv; ++c) vc[c] = load_row<T>(value + c * 16, lanes(Dv - c * 16));
    for (int64_t r = 0; r < R; ++r) {
      if (next[r] >= n[r] || keys[r * L + next[r]] != j) continue;
      const __m512 p = _mm512_set1_ps(scores[r * ss + next[r]++]);
      for (int64_t c = 0; c < vv; ++c) o[r][c] = _mm512_fmadd_ps(p, vc[c], o[r][c]);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* res = out + r * Dv;
    if (last[r] < 0) {  // a query that may see nothing (a padding row): zeros
      std::fill(res, res + Dv, 0.0f);
      continue;
    }
    const __m512 tv = _mm512_set1_ps(total[r]);
    for (int64_t c = 0; c < vv; ++c) _mm512_mask_storeu_ps(res + c * 16, lanes(Dv - c * 16), _mm512_div_ps(o[r][c], tv));
  }
}

// `attend_rows`' arithmetic, bitwise, for RB queries whose query and value vectors (QV and VV vectors of 16 lanes)
// fit in registers together: RB × QV query vectors while scoring, RB × VV output accumulators while summing values.
// Only the bookkeeping differs: the scores of each block of 16 keys are packed per query with one compress (the
// visible keys in order, as `attend_rows`' list), and the value sum runs over the keys any of the queries sees with
// each query's FMA masked off where it may not see the key (a masked FMA leaves its accumulator untouched). So each
// query's sequence of additions is the one `attend_rows` performs.
template <typename T, int RB, int QV, int VV>
AVX512 void attend_group(const float* q /*[RB][D] fp32, scaled*/, const bool* const* allowed /*[RB]*/,
                         const int64_t* limit /*[RB]*/, const T* k, int64_t k_stride, const T* v, int64_t v_stride,
                         int64_t L, int64_t D, int64_t Dv, float* scores /*[RB][L + 32]*/, float* out /*[RB][Dv]*/) {
  const int64_t ss = L + 32;
  int64_t first[RB], last[RB], n[RB];
  int64_t lo = L, reach = -1;  // the keys any of the queries sees lie in [lo, reach]
  for (int r = 0; r < RB; ++r) {
    first[r] = 0;
    last[r] = allowed[r] ? -1 : std::min(limit[r], L - 1);
    if (allowed[r]) {
      for (int64_t j = L - 1; j >= 0; --j)
        if (allowed[r][j]) { last[r] = j; break; }
      while (first[r] < last[r] && !allowed[r][first[r]]) ++first[r];
    }
    n[r] = 0;
    if (last[r] >= first[r]) {
      lo = std::min(lo, first[r]);
      reach = std::max(reach, last[r]);
    }
  }
  __m512 qr[RB][QV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < QV; ++c) qr[r][c] = _mm512_maskz_loadu_ps(lanes(D - c * 16), q + r * D + c * 16);
  __m512 mxv[RB];
  for (int r = 0; r < RB; ++r) mxv[r] = _mm512_set1_ps(-INFINITY);
  alignas(64) __m512 acc[RB][16];
  for (int64_t j0 = lo; j0 <= reach; j0 += 16) {
    const int cnt = (int)std::min<int64_t>(16, reach - j0 + 1);
    for (int t = 0; t < cnt; ++t) {
      const T* key = k + (j0 + t) * k_stride;
      __m512 kc[QV];
      for (int c = 0; c < QV; ++c) kc[c] = load_row<T>(key + c * 16, lanes(D - c * 16));
      for (int r = 0; r < RB; ++r) {
        __m512 a = _mm512_setzero_ps();
        for (int c = 0; c < QV; ++c) a = _mm512_fmadd_ps(qr[r][c], kc[c], a);
        acc[r][t] = a;
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int t = cnt; t < 16; ++t) acc[r][t] = _mm512_setzero_ps();
    for (int r = 0; r < RB; ++r) {
      if (j0 > last[r] || j0 + 15 < first[r]) continue;
      const int64_t from = std::max<int64_t>(first[r] - j0, 0), to = std::min<int64_t>(last[r] - j0 + 1, cnt);
      __mmask16 vis = (__mmask16)(((1u << to) - 1) & ~((1u << from) - 1));
      if (allowed[r]) vis &= _mm_mask_test_epi8_mask(vis, _mm_maskz_loadu_epi8(vis, allowed[r] + j0), _mm_set1_epi8(1));
      if (!vis) continue;
      const __m512 s = hsum16(acc[r]);
      mxv[r] = _mm512_mask_max_ps(mxv[r], vis, mxv[r], s);
      const int taken = __builtin_popcount(vis);
      _mm512_mask_storeu_ps(scores + r * ss + n[r], lanes(taken), _mm512_maskz_compress_ps(vis, s));
      n[r] += taken;
    }
  }
  float total[RB];
  for (int r = 0; r < RB; ++r) total[r] = exp_and_sum(scores + r * ss, n[r], _mm512_reduce_max_ps(mxv[r]));
  __m512 o[RB][VV];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < VV; ++c) o[r][c] = _mm512_setzero_ps();
  bool gaps = false;  // does a query skip keys inside its own [first, last]?
  for (int r = 0; r < RB && !gaps; ++r)
    if (allowed[r] && last[r] >= first[r]) {
      int64_t seen = 0;
      for (int64_t j = first[r]; j <= last[r]; ++j) seen += allowed[r][j];
      gaps = seen != last[r] - first[r] + 1;
    }
  if (!gaps) {
    // every query sees a run of keys, its weights in key order: split [lo, reach] where any run starts or ends, so
    // within a piece each query either adds every key (its weight at its own offset) or none
    int64_t cut[2 * RB + 2];
    int cuts = 0;
    cut[cuts++] = lo;
    cut[cuts++] = reach + 1;
    for (int r = 0; r < RB; ++r)
      if (last[r] >= first[r]) {
        cut[cuts++] = first[r];
        cut[cuts++] = last[r] + 1;
      }
    std::sort(cut, cut + cuts);
    for (int piece = 0; piece + 1 < cuts; ++piece) {
      const int64_t s0 = cut[piece], s1 = cut[piece + 1];
      if (s0 >= s1 || s0 < lo || s1 > reach + 1) continue;
      const float* w[RB];
      __mmask16 m[RB];
      for (int r = 0; r < RB; ++r) {
        const bool in = first[r] <= s0 && s1 - 1 <= last[r];
        m[r] = in ? (__mmask16)0xFFFF : (__mmask16)0;
        w[r] = scores + r * ss + (in ? s0 - first[r] : 0);  // a query not in the piece reads its own row, unused
      }
      for (int64_t j = s0; j < s1; ++j) {
        const T* value = v + j * v_stride;
        __m512 vc[VV];
        for (int c = 0; c < VV; ++c) vc[c] = load_row<T>(value + c * 16, lanes(Dv - c * 16));
        for (int r = 0; r < RB; ++r) {
          const __m512 p = _mm512_set1_ps(w[r][j - s0]);
          for (int c = 0; c < VV; ++c) o[r][c] = _mm512_mask3_fmadd_ps(p, vc[c], o[r][c], m[r]);
        }
      }
    }
  } else {
    int64_t next[RB];  // each query's next weight (an index into its packed scores; the slack past them is unused)
    for (int r = 0; r < RB; ++r) next[r] = 0;
    for (int64_t j = lo; j <= reach; ++j) {
      const T* value = v + j * v_stride;
      __m512 vc[VV];
      for (int c = 0; c < VV; ++c) vc[c] = load_row<T>(value + c * 16, lanes(Dv - c * 16));
      for (int r = 0; r < RB; ++r) {
        const bool seen = j >= first[r] && j <= last[r] && (!allowed[r] || allowed[r][j]);
        const __mmask16 m = (__mmask16)(-(int)seen);
        const __m512 p = _mm512_set1_ps(scores[r * ss + next[r]]);
        for (int c = 0; c < VV; ++c) o[r][c] = _mm512_mask3_fmadd_ps(p, vc[c], o[r][c], m);
        next[r] += seen;
      }
    }
  }
  for (int r = 0; r < RB; ++r) {
    float* res = out + r * Dv;
    if (last[r] < first[r]) {  // a query that may see nothing (a padding row): zeros
      std::fill(res, res + Dv, 0.0f);
      continue;
    }
    const __m512 tv = _mm512_set1_ps(total[r]);
    for (int c = 0; c < VV; ++c) _mm512_mask_storeu_ps(res + c * 16, lanes(Dv - c * 16), _mm512_div_ps(o[r][c], tv));
  }
}

// R queries of one key/value head: groups of the register-blocked kernel where the head dims have one
// (16, 32, 64, 128 or 256 lanes; query and value dims alike), else `attend_rows`. Which kernel runs depends only on
// the model's head dims, never on the number of queries, and both perform the same arithmetic.
template <typename T>
void attend(int64_t R, const float* q, const bool* const* allowed, const int64_t* limit, const T* k, int64_t k_stride,
            const T* v, int64_t v_stride, int64_t L, int64_t D, int64_t Dv, float* scores, int64_t* keys, float* out) {
  const int64_t qv = (D + 15) / 16, vv = (Dv + 15) / 16;
  const int most = qv != vv ? 0 : (qv == 1 || qv == 2 || qv == 4) ? 4 : qv == 8 ? 2 : qv == 16 ? 1 : 0;
  if (most == 0) {
    attend_rows<T>(R, q, allowed, limit, k, k_stride, v, v_stride, L, D, Dv, scores, keys, out);
    return;
  }
  for (int64_t r0 = 0; r0 < R;) {
    const int rb = (int)std::min<int64_t>(most, R - r0);
    const float* qg = q + r0 * D;
    const bool* const* ag = allowed + r0;
    const int64_t* lg = limit + r0;
    float* og = out + r0 * Dv;
#define DOMINO_GROUP(RB_, QV_) \
  attend_group<T, RB_, QV_, QV_>(qg, ag, lg, k, k_stride, v, v_stride, L, D, Dv, scores, og)
    switch (qv * 8 + rb) {
      case 1 * 8 + 1: DOMINO_GROUP(1, 1); break;
      case 1 * 8 + 2: DOMINO_GROUP(2, 1); break;
      case 1 * 8 + 3: DOMINO_GROUP(3, 1); break;
      case 1 * 8 + 4: DOMINO_GROUP(4, 1); break;
      case 2 * 8 + 1: DOMINO_GROUP(1, 2); break;
      case 2 * 8 + 2: DOMINO_GROUP(2, 2); break;
      case 2 * 8 + 3: DOMINO_GROUP(3, 2); break;
      case 2 * 8 + 4: DOMINO_GROUP(4, 2); break;
      case 4 * 8 + 1: DOMINO_GROUP(1, 4); break;
      case 4 * 8 + 2: DOMINO_GROUP(2, 4); break;
      case 4 * 8 + 3: DOMINO_GROUP(3, 4); break;
      case 4 * 8 + 4: DOMINO_GROUP(4, 4); break;
      case 8 * 8 + 1: DOMINO_GROUP(1, 8); break;
      case 8 * 8 + 2: DOMINO_GROUP(2, 8); break;
      default: DOMINO_GROUP(1, 16); break;
    }
#undef DOMINO_GROUP
    r0 += rb;
  }
}

template <typename T>
void attention_impl(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const bool* mask,
                    int64_t mask_b_stride, int64_t mask_q_stride, float scale, torch::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), D = q.size(3);
  const int64_t KVH = k.size(1), L = k.size(2), Dv = v.size(3);
  const int64_t groups = H / KVH, per_head = groups * Q, chunks = (per_head + ROWS - 1) / ROWS;
  const T* qp = reinterpret_cast<const T*>(q.data_ptr());
  const T* kp = reinterpret_cast<const T*>(k.data_ptr());
  const T* vp = reinterpret_cast<const T*>(v.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());  // [B, Q, H, Dv] contiguous
  const auto qs = q.strides(), ks = k.strides(), vs = v.strides();
  // a task: up to ROWS of the groups × Q queries that read one key/value head of one batch row, together
  // (`attend_rows`: they share each key's loads; each query's arithmetic is its own)
  at::parallel_for(0, B * KVH * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(ROWS * (L + 32)), qf(ROWS * D), of(ROWS * Dv);
    std::vector<int64_t> keys(ROWS * L);
    const bool* allowed[ROWS];
    int64_t limit[ROWS], head[ROWS], pos[ROWS];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (KVH * chunks), kvh = (task / chunks) % KVH, first = (task % chunks) * ROWS;
      const int64_t R = std::min<int64_t>(first + ROWS, per_head) - first;
      for (int64_t j = 0; j < R; ++j) {
        const int64_t r = first + j;
        const int64_t h = kvh * groups + r / Q, i = r % Q;  // repeat_kv's order: head h reads kv head h / groups
        head[j] = h;
        pos[j] = i;
        const T* qr = qp + b * qs[0] + h * qs[1] + i * qs[2];
        for (int64_t d = 0; d < D; ++d) {
          float f;
          if constexpr (std::is_same_v<T, float>) f = qr[d];
          else f = c10::detail::f32_from_bits(qr[d]);
          qf[j * D + d] = f * scale;
        }
        allowed[j] = mask ? mask + b * mask_b_stride + i * mask_q_stride : nullptr;
        limit[j] = L - Q + i;  // no mask: causal, aligned to the end of the keys
      }
      attend<T>(R, qf.data(), allowed, limit, kp + b * ks[0] + kvh * ks[1], ks[2], vp + b * vs[0] + kvh * vs[1],
                     vs[2], L, D, Dv, scores.data(), keys.data(), of.data());
      for (int64_t j = 0; j < R; ++j) store_row<T>(op + ((b * Q + pos[j]) * H + head[j]) * Dv, of.data() + j * Dv, Dv);
    }
  });
}

}  // namespace

// query (B, H, Q, D), key/value (B, KVH, L, D) with a contiguous last dimension; mask: None (causal, aligned to
// the end of the keys) or boolean (B or 1, 1, Q, L), True where a query may attend. Returns (B, Q, H, Dv).
torch::Tensor attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, c10::optional<torch::Tensor> mask,
                        double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "invariant attention: 4-D query, key and value");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type(),
              "invariant attention: one dtype for query, key and value");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "invariant attention: heads not a multiple of key/value heads");
  TORCH_CHECK(q.size(3) == k.size(3) && q.size(3) <= 16 * MAX_DV && v.size(3) <= 16 * MAX_DV,
              "invariant attention: head dims up to 256");
  if (q.stride(3) != 1) q = q.contiguous();
  if (k.stride(3) != 1) k = k.contiguous();
  if (v.stride(3) != 1) v = v.contiguous();
  const int64_t B = q.size(0), H = q.size(1), Q = q.size(2), L = k.size(2);
  auto out = torch::empty({B, Q, H, v.size(3)}, q.options());
  torch::Tensor m;
  const bool* mp = nullptr;
  int64_t mbs = 0, mqs = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool, "invariant attention: a boolean mask");
    TORCH_CHECK(mask->dim() == 4 && mask->size(1) == 1 && mask->size(2) == Q && mask->size(3) == L,
                "invariant attention: mask of shape (batch, 1, q_len, kv_len)");
    m = mask->contiguous();
    mp = m.data_ptr<bool>();
    mbs = m.size(0) == 1 ? 0 : Q * L;
    mqs = L;
  }
  if (q.scalar_type() == torch::kFloat32)
    attention_impl<float>(q, k, v, mp, mbs, mqs, (float)scale, out);
  else if (q.scalar_type() == torch::kBFloat16)
    attention_impl<uint16_t>(q, k, v, mp, mbs, mqs, (float)scale, out);
  else
    TORCH_CHECK(false, "invariant attention: float32 or bfloat16 only");
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &linear, "length-invariant linear layer (CPU, AVX-512)");
  m.def("attention", &attention, "length-invariant attention (CPU, AVX-512)");
}
