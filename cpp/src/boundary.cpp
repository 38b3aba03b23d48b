#include "boundary.hpp"

#include <algorithm>
#include <cmath>

namespace seer {

std::vector<int64_t> find_boundaries(const std::vector<double>& profile, int64_t batch, int64_t n,
                                     const SeerConfig& seer) {
  std::vector<int64_t> kept(batch, n);
  const int64_t w = seer.window;
  const double sign = seer.direction == "down" ? -1.0 : 1.0;
  for (int64_t b = 0; b < batch; ++b) {
    const double* s = profile.data() + b * n;
    for (int64_t i = 1; i + w <= n; ++i) {  // window at i against s[i - 1]
      double low = sign * s[i], high = low;
      for (int64_t k = 1; k < w; ++k) {
        low = std::min(low, sign * s[i + k]);
        high = std::max(high, sign * s[i + k]);
      }
      const double jump = low - sign * s[i - 1];
      if (jump >= seer.tau_jump && high - low <= seer.gamma * jump) {
        kept[b] = std::min(n, i + 1 + seer.margin);
        break;
      }
    }
  }
  return kept;
}

std::vector<int64_t> find_end_by_probability(const std::vector<double>& profile, int64_t batch, int64_t n,
                                             const SeerConfig& seer) {
  std::vector<int64_t> kept(batch, n);
  for (int64_t b = 0; b < batch; ++b) {
    const double* p = profile.data() + b * n;
    int64_t first = n;  // smallest i with every p[j > = i] above the threshold
    for (int64_t i = n - 1; i >= 0 && p[i] > seer.threshold; --i) first = i;
    if (first < n) kept[b] = std::min(n, first + 1 + seer.margin);
  }
  return kept;
}

std::vector<int64_t> detect(const std::vector<double>& profile, int64_t batch, int64_t n, const SeerConfig& seer) {
  for (double v : profile)
    if (!std::isfinite(v))
      throw Error(Error::Kind::Runtime, "the step-zero profile holds NaN or inf; the step-zero graph or its inputs "
                                        "are broken (re-export with seer-export)");
  return seer.detector == "threshold" ? find_end_by_probability(profile, batch, n, seer)
                                      : find_boundaries(profile, batch, n, seer);
}

}  // namespace seer
