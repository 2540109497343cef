// metrics.cpp: Prometheus text exposition of Metrics (metrics.h).
#include "server/metrics.h"

namespace k3::server {

void Metrics::observe_ttft(double s) {
  static const double le[5] = {0.1, 0.5, 1, 5, 30};
  for (int i = 0; i < 5; ++i)
    if (s <= le[i]) ttft_le[i]++;
  ttft_le[5]++;
  ttft_count++;
  ttft_sum = ttft_sum + s;
}

std::string Metrics::prometheus() const {
  std::string o;
  auto line = [&](const char* name, const char* type, const char* help, int64_t v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(v) + "\n";
  };
  line("k3_requests_total", "counter", "Completion requests received.", requests);
  line("k3_request_errors_total", "counter", "Requests answered with an error.", errors);
  line("k3_request_disconnects_total", "counter", "Requests cancelled because the client went away.",
       disconnects);
  line("k3_request_timeouts_total", "counter", "Requests ended by the per-request timeout.", timeouts);
  line("k3_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", prompt_tokens);
  line("k3_generation_tokens_total", "counter", "Generated tokens.", generated_tokens);
  line("k3_cache_hit_tokens_total", "counter", "Prompt tokens restored from the prefix cache.",
       cached_tokens);
  line("k3_requests_running", "gauge", "Requests being computed.", running);
  line("k3_requests_waiting", "gauge", "Requests in the queue.", waiting);
  line("k3_pool_pages_used", "gauge", "Cache pages held by running requests.", pages_used);
  line("k3_pool_pages_cached", "gauge", "Cache pages kept for prefix reuse (evictable).", pages_cached);
  line("k3_pool_pages_total", "gauge", "Cache pages in the pool.", pages_total);
  o += "# HELP k3_time_to_first_token_seconds Time from submission to the first generated token.\n"
       "# TYPE k3_time_to_first_token_seconds histogram\n";
  const char* le[6] = {"0.1", "0.5", "1", "5", "30", "+Inf"};
  for (int i = 0; i < 6; ++i)
    o += std::string("k3_time_to_first_token_seconds_bucket{le=\"") + le[i] + "\"} " +
         std::to_string(ttft_le[i]) + "\n";
  o += "k3_time_to_first_token_seconds_sum " + std::to_string(ttft_sum.load()) + "\n";
  o += "k3_time_to_first_token_seconds_count " + std::to_string(ttft_count.load()) + "\n";
  return o;
}

}  // namespace k3::server
