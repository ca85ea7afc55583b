// What aotc-runner leaves behind when it is stopped: nothing. torch's AOTIModelPackageLoader unpacks
// model.pt2 into a folder of its own under $TMPDIR (aotinductor_XXXXXX) and removes it in its
// destructor, which a process ended by SIGTERM or Ctrl-C never runs. So the runner points TMPDIR at
// a private folder it made, and removes that folder when it ends, whichever way: at exit, and from
// a thread that waits for SIGTERM, SIGINT and SIGHUP (blocked in every other thread; one the runner
// was started ignoring, as under `nohup`, stays ignored), removes it and ends the process with exit
// code 130, as aotc does when interrupted. Only SIGKILL (and a crash) can still leave the folder: it
// is named aotc-runtime-<pid>-XXXXXX, as the Python runtime names its own
// (aotc_runtime/extraction.py), and either runtime's next load removes those of processes that are gone.
#pragma once

#include <string>

namespace aotc::runner {

class PrivateTemp {
 public:
  // Block the signals (before any thread starts, so every thread inherits the mask), make the
  // folder under $TMPDIR (else /tmp), point TMPDIR at it and start the waiting thread.
  // Throws aotc::Error (exit 2) when the folder cannot be made.
  PrivateTemp();
  ~PrivateTemp();  // removes the folder
  PrivateTemp(const PrivateTemp&) = delete;
  PrivateTemp& operator=(const PrivateTemp&) = delete;
};

// While an output file is being written: an interrupt then also removes its temporary file
// (write_npz writes PATH.tmp and renames it), so no half-written file is left.
class WritingOutput {
 public:
  explicit WritingOutput(const std::string& path);
  ~WritingOutput();
};

}  // namespace aotc::runner
