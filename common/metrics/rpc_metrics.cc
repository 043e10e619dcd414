#include "common/metrics/rpc_metrics.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"

namespace baton {
namespace {

using grpc::experimental::InterceptionHookPoints;

class Interceptor : public grpc::experimental::Interceptor {
 public:
  Interceptor(RpcMetrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics),
        method_(info->method() != nullptr ? info->method() : ""),
        unary_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds =
          unary_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
                       .count()
                 : -1.0;
      metrics_->Record(method_, methods->GetSendStatus().error_code(), seconds);
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* const metrics_;
  const std::string method_;
  const bool unary_;
  const std::chrono::steady_clock::time_point start_;
};

class Factory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(RpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Interceptor(metrics_, info);
  }

 private:
  RpcMetrics* const metrics_;
};

}  // namespace

RpcMetrics::RpcMetrics(prometheus::Registry& registry, const std::string& prefix)
    : rpcs_(prometheus::BuildCounter()
                .Name(absl::StrCat(prefix, "_rpcs_total"))
                .Help("RPCs handled, by service, method and gRPC status code.")
                .Register(registry)),
      durations_(prometheus::BuildHistogram()
                     .Name(absl::StrCat(prefix, "_rpc_duration_seconds"))
                     .Help("Handling time of unary RPCs.")
                     .Register(registry)) {}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RpcMetrics::Interceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<Factory>(this));
  return v;
}

void RpcMetrics::Record(const std::string& full_method, grpc::StatusCode code, double seconds) {
  // "/baton.v1.JobService/SubmitJob" -> service "baton.v1.JobService", method "SubmitJob".
  std::string service = "unknown", method = full_method;
  const size_t slash = full_method.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    service = full_method.substr(full_method[0] == '/' ? 1 : 0,
                                 slash - (full_method[0] == '/' ? 1 : 0));
    method = full_method.substr(slash + 1);
  }
  const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  rpcs_.Add({{"service", service}, {"method", method}, {"code", code_name}}).Increment();
  if (seconds >= 0) {
    durations_.Add({{"service", service}, {"method", method}}, StepSecondsBuckets())
        .Observe(seconds);
  }
}

}  // namespace baton
