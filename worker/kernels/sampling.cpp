// One token per row of logits, drawn in three passes over the row instead of torch's six full-size tensors.
//
// The torch sampler (worker/model/sampler.py) converts the logits to float32, clones them, takes an argmax,
// divides by the temperature, then softmax, cumsum and searchsorted: each a pass that writes a [B, V]
// tensor. At 64 rows of SmolLM2's 49,152-token vocabulary that was 22 ms a step on a 2-core AMX Xeon, about as
// long as the forward pass. Here, per row: the largest logit; exp((x - max) / T) into a per-thread scratch
// row with the sum of each run of eight; then the running sum of runs, and of entries inside the run, to the
// first entry where it reaches u * total. That is inverse-CDF sampling, as the torch path does, from the
// same distribution (float32 sums in another order). A row whose inverse temperature is 0 gets the argmax
// (the first largest entry; a NaN counts as largest, as torch's argmax).
//
// Truncation, each optional and per row, in vLLM's order, as the torch path (worker/model/sampler.py): min_p
// (0: off) drops the entries less likely than min_p times the most likely one; top_k (0: off) keeps the k
// most likely of the rest; top_p (1: off) then keeps the nucleus of what is left (the most likely entries,
// each kept while the mass before it is at most p of the kept mass). None sorts the row: the entries are bucketed by
// float exponent (256 buckets, in order, as positive floats order by their bits), counted (top-k) or their
// mass summed (top-p), and only the bucket where the count or the running mass from the top passes its
// bound is sorted; min-p is a plain threshold. The entries below the last kept value are zeroed before the
// draw; entries tied with that value are all kept, where a sort would cut between them. A sort of the
// 49,152-entry row had cost ~1.6 ms on a 2-core AMX Xeon.
//
// Layouts: logits [B, V] float32 or bfloat16, contiguous; inv_temperature [B] float32 (0: greedy); uniforms
// [B] float32 in (0, 1); top_p [B] float32 in (0, 1], top_k [B] int64 (>= 0), min_p [B] float32 in [0, 1],
// each or none; out [B] int64, written.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "vec.h"

namespace {

constexpr float kUnderflow = -87.0f;  // exp below this is under float32's smallest normal: drawn never

// The largest entry of a row; `nan` set when the row holds a NaN (max_ps would pass it over).
template <typename T>
float max_row(const T* x, int64_t n, bool& nan) {
  int64_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  nan = false;
#ifdef LLMSERVE_AVX2
  __m256 mv = _mm256_set1_ps(m), unordered = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = llmserve::load8(x + i);
    mv = _mm256_max_ps(mv, v);
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (float lane : lanes) m = std::max(m, lane);
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    nan |= std::isnan(v);
    m = std::max(m, v);
  }
  return m;
}

// The first largest entry; with a NaN in the row, the first NaN (as torch's argmax).
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  bool nan;
  const float m = max_row(x, n, nan);
  int64_t i = 0;
#ifdef LLMSERVE_AVX2
  if (!nan) {
    for (; i + 8 <= n; i += 8) {
      const int hits = _mm256_movemask_ps(_mm256_cmp_ps(llmserve::load8(x + i), _mm256_set1_ps(m), _CMP_EQ_OQ));
      if (hits) return i + __builtin_ctz(hits);
    }
  }
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    if (nan ? std::isnan(v) : v == m) return i;
  }
  return 0;
}

// exp((x - m) * inv_t) of entries [i, i + 8) into e, entries below the underflow point exactly 0; their sum.
template <typename T>
float exp_run(const T* x, int64_t i, int64_t n, float m, float inv_t, float* e) {
#ifdef LLMSERVE_AVX2
  if (i + 8 <= n) {
    const __m256 z = _mm256_mul_ps(_mm256_sub_ps(llmserve::load8(x + i), _mm256_set1_ps(m)), _mm256_set1_ps(inv_t));
    const __m256 keep = _mm256_cmp_ps(z, _mm256_set1_ps(kUnderflow), _CMP_GE_OQ);
    const __m256 v = _mm256_and_ps(llmserve::exp8(z), keep);
    _mm256_storeu_ps(e + i, v);
    return llmserve::hsum(v);
  }
#endif
  float sum = 0.f;
  for (int64_t j = i; j < std::min(i + 8, n); ++j) {
    const float z = (static_cast<float>(x[j]) - m) * inv_t;
    e[j] = z >= kUnderflow ? std::exp(z) : 0.f;
    sum += e[j];
  }
  return sum;
}

// Positive floats order as their bit patterns, so the exponent byte buckets them in order.
inline int exponent_bucket(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<int>(bits >> 23);
}

// The positive entries of at least `lowest` that fall in exponent bucket b, into `bucket`.
void collect_bucket(const float* e, int64_t n, float lowest, int b, std::vector<float>& bucket) {
  bucket.clear();
  for (int64_t i = 0; i < n; ++i)
    if (e[i] > 0.f && e[i] >= lowest && exponent_bucket(e[i]) == b) bucket.push_back(e[i]);
}

// The smallest value the nucleus keeps, among the entries of at least `lowest` (what top-k left): entries
// taken largest first while the mass before each is at most `budget` (p times their total); 0: all kept.
float nucleus_floor(const float* e, int64_t n, float lowest, float budget, std::vector<float>& bucket) {
  float mass[256] = {};
  for (int64_t i = 0; i < n; ++i)
    if (e[i] > 0.f && e[i] >= lowest) mass[exponent_bucket(e[i])] += e[i];
  float before = 0.f, floor = 0.f;
  for (int b = 255; b >= 0; --b) {
    if (mass[b] == 0.f) continue;
    if (before + mass[b] <= budget) {  // the whole bucket is kept, and the next entry's mass before it too
      before += mass[b];
      continue;
    }
    collect_bucket(e, n, lowest, b, bucket);
    std::sort(bucket.begin(), bucket.end(), std::greater<float>());
    for (float v : bucket) {
      if (before > budget) break;
      floor = v;
      before += v;
    }
    return floor;
  }
  return 0.f;  // every entry kept
}

// The k-th largest positive entry (k >= 1); 0 where the row has fewer than k positive entries (all kept).
float kth_largest(const float* e, int64_t n, int64_t k, std::vector<float>& bucket) {
  int64_t count[256] = {};
  for (int64_t i = 0; i < n; ++i)
    if (e[i] > 0.f) ++count[exponent_bucket(e[i])];
  int64_t above = 0;
  for (int b = 255; b >= 0; --b) {
    if (above + count[b] < k) {
      above += count[b];
      continue;
    }
    collect_bucket(e, n, 0.f, b, bucket);
    const auto kth = bucket.begin() + (k - above - 1);
    std::nth_element(bucket.begin(), kth, bucket.end(), std::greater<float>());
    return *kth;
  }
  return 0.f;  // fewer than k positive entries: all kept
}

struct Truncation {
  int64_t top_k = 0;  // 0: off
  float top_p = 1.f;  // 1: off
  float min_p = 0.f;  // 0: off

  bool any() const { return top_k > 0 || top_p < 1.f || min_p > 0.f; }
};

// The smallest value a row keeps after min-p, top-k and top-p, in that order (0: all kept). e's largest
// entry is exactly 1 (exp of 0), so min-p's bound is min_p itself; the k-th largest entry overall is the k-th
// of what min-p kept, or below min_p when it kept fewer (then all of those are kept).
float kept_floor(const float* e, int64_t n, float total, const Truncation& t, std::vector<float>& bucket) {
  float floor = t.min_p;
  if (t.top_k > 0 && t.top_k < n) floor = std::max(floor, kth_largest(e, n, t.top_k, bucket));
  if (t.top_p < 1.f) {
    float kept = total;
    if (floor > 0.f) {
      kept = 0.f;
      for (int64_t i = 0; i < n; ++i) kept += e[i] >= floor ? e[i] : 0.f;
    }
    floor = std::max(floor, nucleus_floor(e, n, floor, t.top_p * kept, bucket));
  }
  return floor;
}

// Inverse CDF over one row: the total is the sum of the runs' sums in order, and the walk adds the same
// run sums in the same order, so it reaches u * total (< total) inside some run; inside that run, entry by
// entry, rounding may leave it just short: then the run's last positive entry is taken.
template <typename T>
int64_t draw_row(const T* x, int64_t n, float inv_t, float u, const Truncation& truncation, std::vector<float>& e,
                 std::vector<float>& runs, std::vector<float>& bucket) {
  bool nan;
  const float m = max_row(x, n, nan);
  if (nan || m == -std::numeric_limits<float>::infinity()) return argmax_row(x, n);
  const int64_t num_runs = (n + 7) / 8;
  e.resize(n);
  runs.resize(num_runs);
  float total = 0.f;
  for (int64_t r = 0; r < num_runs; ++r) total += (runs[r] = exp_run(x, 8 * r, n, m, inv_t, e.data()));
  const float floor = truncation.any() ? kept_floor(e.data(), n, total, truncation, bucket) : 0.f;
  if (floor > 0.f) {  // below the floor: zero, and the runs summed again
    total = 0.f;
    for (int64_t r = 0; r < num_runs; ++r) {
      float sum = 0.f;
      for (int64_t i = 8 * r; i < std::min(8 * r + 8, n); ++i) sum += (e[i] = e[i] >= floor ? e[i] : 0.f);
      total += (runs[r] = sum);
    }
  }
  const float target = u * total;
  float running = 0.f;
  int64_t r = 0;
  for (; r < num_runs - 1 && running + runs[r] < target; ++r) running += runs[r];
  int64_t last_positive = -1;
  for (int64_t i = 8 * r; i < std::min(8 * r + 8, n); ++i) {
    if (e[i] <= 0.f) continue;
    last_positive = i;
    running += e[i];
    if (running >= target) return i;
  }
  return last_positive >= 0 ? last_positive : argmax_row(x, n);
}

template <typename T>
void sample_rows_typed(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                       const float* top_p, const int64_t* top_k, const float* min_p, const at::Tensor& out) {
  const int64_t rows = logits.size(0), n = logits.size(1);
  const T* base = logits.data_ptr<T>();
  const float* inv_t = inv_temperature.data_ptr<float>();
  const float* u = uniforms.data_ptr<float>();
  int64_t* tokens = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e, runs, bucket;
    for (int64_t row = begin; row < end; ++row) {
      const T* x = base + row * n;
      Truncation truncation;
      if (top_k != nullptr) truncation.top_k = top_k[row];
      if (top_p != nullptr) truncation.top_p = top_p[row];
      if (min_p != nullptr) truncation.min_p = min_p[row];
      tokens[row] = inv_t[row] > 0.f ? draw_row(x, n, inv_t[row], u[row], truncation, e, runs, bucket) : argmax_row(x, n);
    }
  });
}

}  // namespace

namespace llmserve {

void sample_rows(const at::Tensor& logits, const at::Tensor& inv_temperature, const at::Tensor& uniforms,
                 const at::Tensor& out, const std::optional<at::Tensor>& top_p, const std::optional<at::Tensor>& top_k,
                 const std::optional<at::Tensor>& min_p) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "sample_rows: logits must be a contiguous [B, V] CPU tensor");
  const int64_t rows = logits.size(0);
  TORCH_CHECK(inv_temperature.scalar_type() == at::kFloat && uniforms.scalar_type() == at::kFloat &&
                  inv_temperature.is_contiguous() && uniforms.is_contiguous() && inv_temperature.numel() == rows &&
                  uniforms.numel() == rows,
              "sample_rows: inv_temperature and uniforms must be [B] float32");
  TORCH_CHECK(out.scalar_type() == at::kLong && out.is_contiguous() && out.numel() == rows,
              "sample_rows: out must be [B] int64");
  TORCH_CHECK(!top_p.has_value() || (top_p->scalar_type() == at::kFloat && top_p->is_contiguous() &&
                                      top_p->numel() == rows),
              "sample_rows: top_p must be [B] float32");
  TORCH_CHECK(!top_k.has_value() || (top_k->scalar_type() == at::kLong && top_k->is_contiguous() &&
                                      top_k->numel() == rows),
              "sample_rows: top_k must be [B] int64");
  TORCH_CHECK(!min_p.has_value() || (min_p->scalar_type() == at::kFloat && min_p->is_contiguous() &&
                                      min_p->numel() == rows),
              "sample_rows: min_p must be [B] float32");
  const float* p = top_p.has_value() ? top_p->data_ptr<float>() : nullptr;
  const int64_t* k = top_k.has_value() ? top_k->data_ptr<int64_t>() : nullptr;
  const float* mp = min_p.has_value() ? min_p->data_ptr<float>() : nullptr;
  if (k != nullptr) {
    for (int64_t row = 0; row < rows; ++row) TORCH_CHECK(k[row] >= 0, "sample_rows: top_k must be >= 0");
  }
  if (logits.scalar_type() == at::kFloat) {
    sample_rows_typed<float>(logits, inv_temperature, uniforms, p, k, mp, out);
  } else if (logits.scalar_type() == at::kBFloat16) {
    sample_rows_typed<c10::BFloat16>(logits, inv_temperature, uniforms, p, k, mp, out);
  } else {
    TORCH_CHECK(false, "sample_rows supports float32 and bfloat16 logits, got ", logits.scalar_type());
  }
}

}  // namespace llmserve

TORCH_LIBRARY_FRAGMENT(llmserve, m) {
  m.def(
      "sample_rows(Tensor logits, Tensor inv_temperature, Tensor uniforms, Tensor(a!) out, Tensor? top_p=None, "
      "Tensor? top_k=None, Tensor? min_p=None) -> ()");
}

TORCH_LIBRARY_IMPL(llmserve, CPU, m) { m.impl("sample_rows", &llmserve::sample_rows); }
