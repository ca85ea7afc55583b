#include "runner_cleanup.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "aotc/error.h"

namespace aotc::runner {
namespace {

constexpr int kInterrupted = 130;  // aotc's exit code for an interrupt (Ctrl-C or SIGTERM)
const std::string kPrefix = "aotc-runtime-";

std::mutex state_lock;
std::string folder;        // the private temporary folder, "" once removed
std::string output_tmp;    // the output's temporary file while it is being written

void remove_folder() {
  std::lock_guard<std::mutex> hold(state_lock);
  if (folder.empty()) return;
  std::error_code ignored;
  // Other threads may be writing into it (torch unpacking a model) or deleting from it (the main
  // thread's teardown, when a signal and the end of --serve's input come together: its loader
  // removes its own copy while remove_all walks the folder, which then stops at the first entry
  // that vanished under it). Pass again until the folder is gone, for up to a second.
  for (int pass = 0; pass < 100 && std::filesystem::exists(folder, ignored); ++pass) {
    if (pass > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::filesystem::remove_all(folder, ignored);
  }
  folder.clear();
}

// The signals that would end the process, less those it was started ignoring (`nohup` ignores
// SIGHUP, a shell's background job SIGINT): on Linux a blocked signal is never discarded, so
// waiting for an ignored one would turn it back into a way to stop the runner.
sigset_t stopping_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction now {};
    if (sigaction(signal, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
    sigaddset(&set, signal);
  }
  return set;
}

// Runs in a thread of its own, so it may call anything (a signal handler could call almost nothing).
void wait_for_signal(sigset_t set) {
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  {
    std::lock_guard<std::mutex> hold(state_lock);
    if (!output_tmp.empty()) std::remove(output_tmp.c_str());
  }
  remove_folder();
  static const char message[] = "interrupted; nothing was written\n";
  ssize_t ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
  (void)ignored;
  _exit(kInterrupted);  // not exit(): the main thread may be inside torch, whose static destructors must not run under it
}

// The folders of runtimes that are gone (SIGKILL, a power cut), this user's only, named as both
// runtimes name them (aotc-runtime-<pid>-*, aotc_runtime/extraction.py): removed before a load,
// so killed processes do not leave a copy of a model per run.
void remove_orphans(const std::string& parent) {
  std::error_code error;
  for (std::filesystem::directory_iterator it(parent, error), end; !error && it != end; it.increment(error)) {
    std::string name = it->path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    std::string digits = name.substr(kPrefix.size(), name.find('-', kPrefix.size()) - kPrefix.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or another user's: not ours to judge
    struct stat info {};
    // A real folder of this user only: never follow a link planted in a shared /tmp.
    if (::lstat(it->path().c_str(), &info) != 0 || !S_ISDIR(info.st_mode) || info.st_uid != ::getuid()) continue;
    std::error_code ignored;
    std::filesystem::remove_all(it->path(), ignored);
  }
}

}  // namespace

PrivateTemp::PrivateTemp() {
  sigset_t set = stopping_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const char* base = std::getenv("TMPDIR");
  std::string parent = base && *base ? base : "/tmp";
  remove_orphans(parent);
  std::string pattern = (std::filesystem::path(parent) / (kPrefix + std::to_string(::getpid()) + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) {
    throw usage_error("cannot make a temporary folder under " + parent + " (" + std::strerror(errno) +
                      "); set TMPDIR to a writable folder");
  }
  {
    std::lock_guard<std::mutex> hold(state_lock);
    folder = pattern;
  }
  // torch unpacks model.pt2 under std::filesystem::temp_directory_path(), which reads TMPDIR.
  setenv("TMPDIR", pattern.c_str(), 1);
  std::thread(wait_for_signal, set).detach();
}

PrivateTemp::~PrivateTemp() { remove_folder(); }

WritingOutput::WritingOutput(const std::string& path) {
  std::lock_guard<std::mutex> hold(state_lock);
  output_tmp = path + ".tmp";
}

WritingOutput::~WritingOutput() {
  std::lock_guard<std::mutex> hold(state_lock);
  output_tmp.clear();
}

}  // namespace aotc::runner
