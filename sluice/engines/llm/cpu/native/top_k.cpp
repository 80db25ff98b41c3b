// The indices of the k largest values of each row of a (M, V) float32 or bfloat16 matrix: the candidates a
// rescored LM head recomputes exactly (layers/quantized.py: RescoredHead). torch.topk sorts its way through a
// whole row of a large vocabulary; most values fall below the k-th best seen so far, so a scan that first
// compares 64 values at a time with that bound touches only a few hundred of them, a fraction of the time.
//
// Guarantees: each row's k indices are its top k under (value descending, index ascending) -- ties at the
// k-th place go to the lower index -- in that order; the result does not depend on the thread count (every
// chunk of a row keeps its own top k under the same order, and the top k of the row is among theirs). A NaN
// ranks as -infinity (torch.topk would rank it first): a NaN logit is a broken model, not a candidate. k <= V.

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 64;        // values compared with the bound at a time
constexpr int64_t kChunk = 1 << 15;   // values per task: a 128k row is four tasks

struct Candidate {
  float value;
  int64_t index;
};

// a ranks before b: larger value, then lower index
inline bool before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// The top k of values [begin, end) of one row into out (up to k of them, fewer if the range is shorter).
template <typename T>
void chunk_top_k(const T* row, int64_t begin, int64_t end, int64_t k, std::vector<Candidate>& out) {
  out.clear();
  int64_t worst = -1;  // position in out of the last-ranked candidate, once out holds k
  float bound = -std::numeric_limits<float>::infinity();
  const auto find_worst = [&] {
    worst = std::max_element(out.begin(), out.end(), before) - out.begin();  // the "largest" ranks last
    bound = out[worst].value;
  };
  const auto consider = [&](int64_t i) {
    const float raw = static_cast<float>(row[i]);
    const float v = raw == raw ? raw : -std::numeric_limits<float>::infinity();  // NaN ranks last
    if (static_cast<int64_t>(out.size()) < k) {
      out.push_back({v, i});
      if (static_cast<int64_t>(out.size()) == k) find_worst();
      return;
    }
    if (v <= bound) return;  // a later index with an equal value ranks after the worst kept
    out[worst] = {v, i};
    find_worst();
  };
  int64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    if (static_cast<int64_t>(out.size()) == k) {
      float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < kBlock; ++j) mx = std::max(mx, static_cast<float>(row[i + j]));
      // nothing in this block beats the bound: every value <= it, or NaN (std::max keeps mx then)
      if (mx <= bound) continue;
    }
    for (int64_t j = 0; j < kBlock; ++j) consider(i + j);
  }
  for (; i < end; ++i) consider(i);
}

template <typename T>
void top_k_impl(const at::Tensor& x, int64_t k, at::Tensor& out) {
  const int64_t rows = x.size(0), width = x.size(1);
  const int64_t chunks = (width + kChunk - 1) / kChunk;
  const T* data = x.data_ptr<T>();
  std::vector<std::vector<Candidate>> found(rows * chunks);
  at::parallel_for(0, rows * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, c = t % chunks;
      chunk_top_k(data + r * width, c * kChunk, std::min(width, (c + 1) * kChunk), k, found[t]);
    }
  });
  int64_t* o = out.data_ptr<int64_t>();
  std::vector<Candidate> all;
  for (int64_t r = 0; r < rows; ++r) {
    all.clear();
    for (int64_t c = 0; c < chunks; ++c) all.insert(all.end(), found[r * chunks + c].begin(), found[r * chunks + c].end());
    std::partial_sort(all.begin(), all.begin() + k, all.end(), before);
    for (int64_t j = 0; j < k; ++j) o[r * k + j] = all[j].index;
  }
}

}  // namespace

// (M, V) float32 or bfloat16 -> (M, k) int64: see the top.
at::Tensor top_k_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "top_k_rows: x must be (M, V) float32 or bfloat16");
  TORCH_CHECK(k >= 1 && k <= x.size(1), "top_k_rows: k must be in 1..V");
  const at::Tensor xc = x.contiguous();
  auto out = at::empty({x.size(0), k}, x.options().dtype(at::kLong));
  if (x.scalar_type() == at::kFloat)
    top_k_impl<float>(xc, k, out);
  else
    top_k_impl<c10::BFloat16>(xc, k, out);
  return out;
}
