// CallerRegistry / CallerStream: streams, jobs and bytes per caller against the limits,
// callers independent of each other, and handles that release what they hold.
#include "service/security/caller_limits.h"

#include <gtest/gtest.h>

namespace centroidkv::service {
namespace {

TEST(CallerLimitsTest, StreamLimitIsPerCaller) {
  CallerRegistry registry(CallerLimits{2, 0, 0});
  auto a1 = registry.OpenStream("a");
  auto a2 = registry.OpenStream("a");
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = registry.OpenStream("a");
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("max_caller_streams"), std::string::npos);
  EXPECT_TRUE(registry.OpenStream("b").ok());
  (*a1)->EndStream();
  EXPECT_TRUE(registry.OpenStream("a").ok());
}

TEST(CallerLimitsTest, JobsAndBytesAreCountedUntilReleased) {
  CallerRegistry registry(CallerLimits{0, 2, 1000});
  auto a = registry.OpenStream("a");
  auto b = registry.OpenStream("b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE((*a)->AdmitJob(600).ok());
  absl::Status over_bytes = (*a)->AdmitJob(500);
  EXPECT_EQ(over_bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over_bytes.message().find("max_caller_bytes"), std::string::npos);
  EXPECT_TRUE((*a)->AdmitJob(400).ok());
  absl::Status over_jobs = (*a)->AdmitJob(1);
  EXPECT_NE(over_jobs.message().find("max_caller_jobs"), std::string::npos);
  EXPECT_TRUE((*b)->AdmitJob(1000).ok()) << "b has its own account";
  EXPECT_EQ(registry.usage("a").jobs, 2);
  EXPECT_EQ(registry.usage("a").bytes, 1000u);
  (*a)->ReleaseJob(0);  // a reply for a job never admitted: nothing
  EXPECT_EQ(registry.usage("a").jobs, 2);
  (*a)->ReleaseJob(600);
  EXPECT_EQ(registry.usage("a").jobs, 1);
  EXPECT_EQ(registry.usage("a").bytes, 400u);
  EXPECT_TRUE((*a)->AdmitJob(600).ok());
}

TEST(CallerLimitsTest, DestroyedHandleReleasesEverythingItHeld) {
  CallerRegistry registry(CallerLimits{1, 1, 0});
  {
    auto a = registry.OpenStream("a");
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE((*a)->AdmitJob(10).ok());
    (*a)->EndStream();  // the stream ended, its job still computes
    EXPECT_EQ(registry.usage("a").streams, 0);
    EXPECT_EQ(registry.usage("a").jobs, 1);
  }
  EXPECT_EQ(registry.usage("a").jobs, 0);
  EXPECT_EQ(registry.usage("a").bytes, 0u);
  auto again = registry.OpenStream("a");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->AdmitJob(10).ok());
}

}  // namespace
}  // namespace centroidkv::service
