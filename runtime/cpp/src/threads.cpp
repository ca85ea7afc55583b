// The default thread count (aotc/threads.h), computed as runtime/aotc_runtime/threads.py computes
// it; tests/test_threads.py checks that the two agree.
#include "aotc/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "small_file.h"

namespace aotc {
namespace {

constexpr size_t kSmallFile = 4096;  // sysfs, cgroup and /proc files read here are a line or a few

std::optional<std::string> read_text(const std::string& path) {
  SmallFile file = read_small_file(path, kSmallFile);
  if (!file.ok()) return std::nullopt;
  return file.bytes;
}

std::string trimmed(const std::string& text) {
  size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return "";
  return text.substr(start, text.find_last_not_of(" \t\r\n") - start + 1);
}

// Digits only, at least 1 (and no overflow): Python's _whole_number.
std::optional<long long> whole_number(const std::string& raw) {
  std::string text = trimmed(raw);
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  long long value = std::stoll(text);
  if (value < 1) return std::nullopt;
  return value;
}

// The CPUs of the affinity mask, else 0 .. sysconf(_SC_NPROCESSORS_ONLN) - 1.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  if (cpus.empty()) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (int cpu = 0; cpu < std::max(1L, online); ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

// CPUs that sysfs lists as one core count once; without topology for every CPU, each CPU counts.
int physical_cores(const std::vector<int>& cpus, const std::string& cpu_dir) {
  std::set<std::string> cores;
  for (int cpu : cpus) {
    std::string topology = cpu_dir + "/cpu" + std::to_string(cpu) + "/topology/";
    std::optional<std::string> siblings = read_text(topology + "core_cpus_list");
    if (!siblings || trimmed(*siblings).empty()) siblings = read_text(topology + "thread_siblings_list");
    if (!siblings || trimmed(*siblings).empty()) return static_cast<int>(cpus.size());
    cores.insert(trimmed(*siblings));
  }
  return static_cast<int>(cores.size());
}

// The cgroup's folder under `mount` and each parent up to the mount ("." and ".." dropped).
std::vector<std::string> folders_up(const std::string& mount, const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream stream(path);
  for (std::string part; std::getline(stream, part, '/');)
    if (!part.empty() && part != "." && part != "..") parts.push_back(part);
  std::vector<std::string> folders;
  for (size_t depth = parts.size() + 1; depth-- > 0;) {
    std::string folder = mount;
    for (size_t i = 0; i < depth; ++i) folder += "/" + parts[i];
    folders.push_back(folder);
  }
  return folders;
}

std::optional<double> ratio(std::optional<long long> quota, std::optional<long long> period) {
  if (!quota || !period) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

// v2 `cpu.max`: "QUOTA PERIOD" in microseconds, or "max PERIOD" for none.
std::optional<double> v2_limit(const std::string& cpu_max) {
  std::optional<std::string> text = read_text(cpu_max);
  if (!text) return std::nullopt;
  std::stringstream stream(*text);
  std::string quota, period, extra;
  if (!(stream >> quota >> period) || (stream >> extra) || quota == "max") return std::nullopt;
  return ratio(whole_number(quota), whole_number(period));
}

// v1: `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`.
std::optional<double> v1_limit(const std::string& folder) {
  std::optional<std::string> quota = read_text(folder + "/cpu.cfs_quota_us");
  std::optional<std::string> period = read_text(folder + "/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return ratio(whole_number(*quota), whole_number(*period));
}

// The smallest quota along the process's cgroup path (a parent's limit holds for its children).
std::optional<int> cgroup_cpu_quota() {
  std::optional<std::string> text = read_text("/proc/self/cgroup");
  if (!text) return std::nullopt;
  std::optional<double> smallest;
  auto consider = [&](std::optional<double> limit) {
    if (limit && (!smallest || *limit < *smallest)) smallest = limit;
  };
  std::stringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    size_t first = line.find(':');
    size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (controllers.empty()) {  // cgroup v2: one hierarchy
      for (const auto& folder : folders_up("/sys/fs/cgroup", path)) consider(v2_limit(folder + "/cpu.max"));
      continue;
    }
    std::stringstream names(controllers);
    bool cpu = false;
    for (std::string name; std::getline(names, name, ',');) cpu = cpu || name == "cpu";
    if (!cpu) continue;
    for (const char* mount : {"cpu", "cpu,cpuacct", "cpuacct,cpu"})
      for (const auto& folder : folders_up(std::string("/sys/fs/cgroup/") + mount, path)) consider(v1_limit(folder));
  }
  if (!smallest) return std::nullopt;
  return std::max(1, static_cast<int>(std::ceil(*smallest)));
}

// The CPUs other work keeps busy: /proc/loadavg's 1-minute load average, rounded; 0 when unreadable.
int busy_cpus() {
  std::optional<std::string> text = read_text("/proc/loadavg");
  if (!text) return 0;
  std::stringstream fields(*text);
  double load = -1;
  if (!(fields >> load) || !(load >= 0 && load < kMaxThreads)) return 0;
  return static_cast<int>(load + 0.5);
}

}  // namespace

int default_threads() {
  int count = physical_cores(allowed_cpus(), "/sys/devices/system/cpu");
  std::optional<int> quota = cgroup_cpu_quota();
  if (quota) count = std::min(count, *quota);
  int busy = busy_cpus();
  if (busy > 0) count = std::min(count, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) - busy);
  return std::max(1, count);
}

int chosen_threads(int requested) {
  if (requested > 0) return requested;
  const char* from_env = std::getenv("OMP_NUM_THREADS");
  if (from_env) {
    std::optional<long long> value = whole_number(from_env);
    if (value && *value <= kMaxThreads) return static_cast<int>(*value);
  }
  return default_threads();
}

int set_threads(int requested) {
  int threads = chosen_threads(requested);
  at::set_num_threads(threads);
  try {
    // process-wide and settable once, before any inter-op work: the runner sets it first thing
    at::set_num_interop_threads(threads);
  } catch (const std::exception&) {
  }
  return at::get_num_threads();
}

}  // namespace aotc
