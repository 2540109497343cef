// sampler.cpp: the sampling chain of sampler.h. Candidates are (z, id) pairs; "better" means larger z,
// then smaller id, so every cut (top-k, top-p, argmax) is deterministic on ties.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

namespace k3 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Index of the largest finite-or-inf value; NaN never wins; ties -> lowest index.
int32_t argmax(std::span<const float> z) {
  int32_t best = 0;
  for (size_t i = 1; i < z.size(); ++i)
    if (z[i] > z[size_t(best)] || std::isnan(z[size_t(best)])) best = int32_t(i);
  return best;
}

// log(sum_i exp(z_i)) in double, ignoring NaN.
double log_sum_exp(std::span<const float> z) {
  float m = kNegInf;
  for (float v : z)
    if (v > m) m = v;
  if (m == kNegInf) return double(kNegInf);
  double s = 0;
  for (float v : z)
    if (!std::isnan(v)) s += std::exp(double(v) - double(m));
  return double(m) + std::log(s);
}

}  // namespace

Status validate(const SamplerParams& p, int32_t n_vocab) {
  auto bad = [](const std::string& m) { return error(Code::invalid_argument, m); };
  if (!(p.temperature >= 0.f) || !std::isfinite(p.temperature)) return bad("temperature must be >= 0");
  if (p.top_k < 0) return bad("top_k must be >= 0 (0 = off)");
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) return bad("top_p must be in (0, 1]");
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) return bad("min_p must be in [0, 1]");
  if (!(p.repeat_penalty > 0.f) || !std::isfinite(p.repeat_penalty)) return bad("repeat_penalty must be > 0");
  if (p.repeat_last_n < -1) return bad("repeat_last_n must be >= -1 (-1 = whole history)");
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    return bad("presence/frequency penalties must be finite");
  if (p.n_top_logprobs < 0 || p.n_top_logprobs > 20) return bad("top logprobs must be in [0, 20]");
  for (const auto& [id, b] : p.logit_bias) {
    if (id < 0 || id >= n_vocab)
      return bad("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                 std::to_string(n_vocab) + ")");
    if (std::isnan(b) || b == std::numeric_limits<float>::infinity())
      return bad("logit_bias for token " + std::to_string(id) + " must be a number or -inf");
  }
  return ok_status();
}

Sampler::Sampler(SamplerParams params) : params_(std::move(params)), rng_(params_.seed) {}

double Sampler::next_uniform() {
  return double(rng_() >> 11) * 0x1.0p-53;
}

void Sampler::apply_bias_and_penalties(std::span<float> z, std::span<const int32_t> history) const {
  const int64_t n_vocab = int64_t(z.size());
  for (const auto& [id, b] : params_.logit_bias)
    if (id >= 0 && id < n_vocab) z[size_t(id)] += b;

  const SamplerParams& p = params_;
  const bool any = p.repeat_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f;
  if (!any || p.repeat_last_n == 0 || history.empty()) return;
  const size_t n = p.repeat_last_n < 0 ? history.size() : std::min(history.size(), size_t(p.repeat_last_n));
  std::unordered_map<int32_t, int> count;
  for (int32_t id : history.subspan(history.size() - n))
    if (id >= 0 && id < n_vocab) ++count[id];
  for (const auto& [id, c] : count) {
    float& v = z[size_t(id)];
    v = v > 0.f ? v / p.repeat_penalty : v * p.repeat_penalty;
    v -= float(c) * p.frequency_penalty + p.presence_penalty;
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, SampleResult* out) {
  K3_ASSERT(!logits.empty());
  const SamplerParams& p = params_;
  z_.assign(logits.begin(), logits.end());
  for (float& v : z_)
    if (std::isnan(v)) v = kNegInf;
  apply_bias_and_penalties(z_, history);

  int32_t chosen = argmax(z_);
  if (p.temperature > 0.f && z_[size_t(chosen)] != kNegInf) {
    cand_.clear();
    for (size_t i = 0; i < z_.size(); ++i)
      if (z_[i] != kNegInf) cand_.emplace_back(z_[i], int32_t(i));

    // top-k: the k best, sorted.
    size_t sorted = 0;  // cand_[0, sorted) is in `better` order
    if (p.top_k > 0) {
      if (size_t(p.top_k) < cand_.size()) {
        std::nth_element(cand_.begin(), cand_.begin() + p.top_k, cand_.end(), better);
        cand_.resize(size_t(p.top_k));
      }
      std::sort(cand_.begin(), cand_.end(), better);
      sorted = cand_.size();
    }
    const float z_max = z_[size_t(chosen)];  // the best candidate always survives every cut

    if (p.top_p < 1.f) {
      // Sort only as far as needed: the best m candidates, m growing x8 until their mass reaches top_p
      // (the kept prefix is the same as with a full sort).
      double total = 0;
      for (const auto& c : cand_) total += std::exp(double(c.first) - z_max);
      size_t keep = cand_.size();
      for (size_t m = std::min<size_t>(64, cand_.size());; m = std::min(cand_.size(), m * 8)) {
        if (m > sorted) {
          if (m * 4 > cand_.size()) m = cand_.size();  // a full sort is cheaper than a heap this deep
          if (m == cand_.size())
            std::sort(cand_.begin(), cand_.end(), better);
          else
            std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(m), cand_.end(), better);
          sorted = m;
        }
        double cum = 0;
        size_t i = 0;
        for (; i < m; ++i) {
          cum += std::exp(double(cand_[i].first) - z_max) / total;
          if (cum >= double(p.top_p)) break;
        }
        if (i < m) {
          keep = i + 1;
          break;
        }
        if (m == cand_.size()) break;
      }
      cand_.resize(keep);
    }
    if (p.min_p > 0.f) {
      // p_i >= min_p * p_max  <=>  z_i >= z_max + log(min_p)
      const double z_min = double(z_max) + std::log(double(p.min_p));
      std::erase_if(cand_, [&](const auto& c) { return double(c.first) < z_min; });
    }

    const double inv_t = 1.0 / double(p.temperature);
    double total = 0;
    for (const auto& c : cand_) total += std::exp((double(c.first) - z_max) * inv_t);
    const double u = next_uniform() * total;
    double cum = 0;
    chosen = cand_.back().second;  // rounding fallback: the last candidate
    for (const auto& c : cand_) {
      cum += std::exp((double(c.first) - z_max) * inv_t);
      if (cum > u) {
        chosen = c.second;
        break;
      }
    }
  }

  if (out) {
    out->id = chosen;
    out->logprob = token_logprob(logits, chosen);
    out->top = p.n_top_logprobs > 0 ? top_logprobs(logits, p.n_top_logprobs) : std::vector<TokenLogprob>{};
  }
  return chosen;
}

float token_logprob(std::span<const float> logits, int32_t id) {
  K3_ASSERT(id >= 0 && size_t(id) < logits.size());
  return float(double(logits[size_t(id)]) - log_sum_exp(logits));
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k) {
  std::vector<std::pair<float, int32_t>> c;
  c.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    c.emplace_back(std::isnan(logits[i]) ? kNegInf : logits[i], int32_t(i));
  const size_t n = std::min(c.size(), size_t(std::max(k, 0)));
  std::partial_sort(c.begin(), c.begin() + ptrdiff_t(n), c.end(), better);
  const double lse = log_sum_exp(logits);
  std::vector<TokenLogprob> top(n);
  for (size_t i = 0; i < n; ++i) top[i] = {c[i].second, float(double(c[i].first) - lse)};
  return top;
}

}  // namespace k3
