// ReplicaPool: target translation, the round_robin channel with health checking, and the
// pool's counters. The balancing and retrying itself is BalancedStream's.
#include "centroidkv/client/replica_pool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "centroidkv/common/status_macros.h"
#include "client/balanced_stream.h"
#include "client/channel.h"

namespace centroidkv::client {
namespace {

// round_robin places each call on the next READY subchannel; the health check (the
// server's standard health service, per service name) takes a draining replica
// (NOT_SERVING) out of the rotation before it stops listening.
constexpr char kServiceConfig[] =
    R"({"loadBalancingConfig":[{"round_robin":{}}],)"
    R"("healthCheckConfig":{"serviceName":"centroidkv.v1.CentroidKV"}})";

enum class Family { kNone, kIpv4, kIpv6, kUnix };

const char* SchemeOf(Family family) {
  switch (family) {
    case Family::kIpv4:
      return "ipv4:";
    case Family::kIpv6:
      return "ipv6:";
    default:
      return "unix:";
  }
}

// The addresses one entry of a list names, all of one family.
absl::Status AddEntry(absl::string_view entry, Family* family, std::vector<std::string>* out) {
  auto add = [&](Family of, std::string address) -> absl::Status {
    if (*family != Family::kNone && *family != of) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target: '", entry, "' is of another address family than the entries before it"));
    }
    *family = of;
    out->push_back(std::move(address));
    return absl::OkStatus();
  };
  if (absl::StartsWith(entry, "dns:")) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: a dns: target names its own replica set; it cannot be one "
                     "entry of a list ('", entry, "')"));
  }
  if (absl::ConsumePrefix(&entry, "unix:")) {
    absl::ConsumePrefix(&entry, "//");  // unix:///abs/path -> /abs/path
    if (entry.empty()) return absl::InvalidArgumentError("target: empty unix socket path");
    return add(Family::kUnix, std::string(entry));
  }
  if (absl::ConsumePrefix(&entry, "ipv4:")) return add(Family::kIpv4, std::string(entry));
  if (absl::ConsumePrefix(&entry, "ipv6:")) return add(Family::kIpv6, std::string(entry));
  // HOST:PORT or [V6]:PORT.
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos || colon == 0 || colon + 1 == entry.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: '", entry, "' is not HOST:PORT, ipv4:, ipv6: or unix:"));
  }
  std::string host(entry.substr(0, colon));
  const std::string port(entry.substr(colon + 1));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return add(Family::kIpv4, absl::StrCat(host, ":", port));
  }
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return add(Family::kIpv6, absl::StrCat("[", host, "]:", port));
  }
  // A host name: resolved once, here (a dns: target is re-resolved by gRPC instead).
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: cannot resolve '", host, "': ", gai_strerror(error)));
  }
  std::vector<std::string> v4s, v6s;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, text,
                sizeof(text));
      v4s.push_back(absl::StrCat(text, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      v6s.push_back(absl::StrCat("[", text, "]:", port));
    }
  }
  freeaddrinfo(found);
  // IPv4 when the name has any (one list is one family), each address once.
  const bool use_v4 = !v4s.empty();
  std::vector<std::string>& chosen = use_v4 ? v4s : v6s;
  std::sort(chosen.begin(), chosen.end());
  chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  for (std::string& address : chosen) {
    CKV_RETURN_IF_ERROR(add(use_v4 ? Family::kIpv4 : Family::kIpv6, std::move(address)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ReplicaTarget> ParseReplicaTarget(const std::string& target) {
  const std::vector<absl::string_view> entries = absl::StrSplit(target, ',');
  if (target.empty()) return absl::InvalidArgumentError("target: empty");
  if (entries.size() == 1) {
    // One gRPC target: dns: decides its own count; anything else names one address.
    return ReplicaTarget{target, absl::StartsWith(target, "dns:") ? 0 : 1};
  }
  // gRPC's own list form ("ipv4:A:P,B:P"): a scheme on the first entry only.
  const bool grpc_list =
      (absl::StartsWith(target, "ipv4:") || absl::StartsWith(target, "ipv6:") ||
       absl::StartsWith(target, "unix:")) &&
      std::none_of(entries.begin() + 1, entries.end(), [](absl::string_view entry) {
        return absl::StrContains(entry, "://") || absl::StartsWith(entry, "ipv") ||
               absl::StartsWith(entry, "unix:") || absl::StartsWith(entry, "dns:");
      });
  if (grpc_list && !absl::StartsWith(target, "unix:")) {
    return ReplicaTarget{target, static_cast<int32_t>(entries.size())};
  }
  Family family = Family::kNone;
  std::vector<std::string> addresses;
  for (size_t i = 0; i < entries.size(); ++i) {
    absl::string_view entry = absl::StripAsciiWhitespace(entries[i]);
    if (entry.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("target: entry ", i + 1, " of '", target, "' is empty"));
    }
    // The rest of a gRPC unix list ("unix:/a,/b") keeps the first entry's scheme.
    const std::string scoped =
        grpc_list && i > 0 ? absl::StrCat("unix:", entry) : std::string(entry);
    CKV_RETURN_IF_ERROR(AddEntry(scoped, &family, &addresses));
  }
  return ReplicaTarget{absl::StrCat(SchemeOf(family), absl::StrJoin(addresses, ",")),
                       static_cast<int32_t>(addresses.size())};
}

bool NamesReplicaSet(const std::string& target) {
  return absl::StrContains(target, ',') || absl::StartsWith(target, "dns:");
}

absl::StatusOr<std::unique_ptr<ReplicaPool>> ReplicaPool::Connect(const PoolOptions& options) {
  const RetryPolicy& retry = options.retry;
  if (options.streams < 0 || options.jobs_per_stream < 1 || options.stream_job_limit < 0 ||
      retry.max_attempts < 1 || retry.initial_backoff.count() < 0 ||
      retry.max_backoff < retry.initial_backoff || retry.multiplier < 1.0 ||
      retry.jitter < 0.0 || retry.jitter > 1.0 || options.job_deadline.count() < 0 ||
      (options.keepalive_time.count() != 0 &&
       options.keepalive_time < std::chrono::seconds(10))) {
    return absl::InvalidArgumentError(
        "pool options: need streams >= 0, jobs_per_stream >= 1, stream_job_limit >= 0, "
        "max_attempts >= 1, 0 <= initial_backoff <= max_backoff, multiplier >= 1, "
        "jitter in [0, 1], job_deadline >= 0, keepalive_time 0 or >= 10 s");
  }
  CKV_ASSIGN_OR_RETURN(const ReplicaTarget target, ParseReplicaTarget(options.client.target));
  auto core = std::make_shared<Core>();
  core->options = options;
  if (core->options.streams == 0) {
    core->options.streams = target.addresses > 0 ? 2 * target.addresses : 8;
  }
  CKV_ASSIGN_OR_RETURN(core->channel,
                       OpenChannel(options.client, target.grpc_target, kServiceConfig,
                                   options.keepalive_time));
  core->stub = v1::CentroidKV::NewStub(core->channel);
  return std::unique_ptr<ReplicaPool>(new ReplicaPool(std::move(core)));
}

ReplicaPool::ReplicaPool(std::shared_ptr<Core> core) : core_(std::move(core)) {}
ReplicaPool::~ReplicaPool() = default;

absl::StatusOr<ServerInfo> ReplicaPool::GetInfo() { return FetchServerInfo(*core_->stub); }

std::unique_ptr<CompressStream> ReplicaPool::OpenStream() {
  // Sized once, before any stream copies the options (BalancedStream reads them at birth).
  std::call_once(core_->options_sized, [this] {
    core_->options.client = core_->slab_sizing.Sized(*core_->stub, core_->options.client);
  });
  return std::make_unique<BalancedStream>(core_);
}

PoolStats ReplicaPool::stats() const {
  std::lock_guard<std::mutex> lock(core_->stats_mu);
  return core_->stats;
}

const PoolOptions& ReplicaPool::options() const { return core_->options; }

absl::StatusOr<std::unique_ptr<Client>> ConnectTarget(const ClientOptions& options) {
  if (!NamesReplicaSet(options.target)) return Client::Connect(options);
  PoolOptions pool;
  pool.client = options;
  CKV_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaPool> connected, ReplicaPool::Connect(pool));
  return std::unique_ptr<Client>(std::move(connected));
}

}  // namespace centroidkv::client
