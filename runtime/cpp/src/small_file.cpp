#include "small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace aotc {

SmallFile read_small_file(const std::string& path, size_t limit) {
  SmallFile file;
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    file.status = errno == ENOENT ? SmallFile::Status::missing : SmallFile::Status::unreadable;
    file.error = errno;
    return file;
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    file.status = SmallFile::Status::not_regular;
    ::close(fd);
    return file;
  }
  // One byte past the limit tells a file that is too large without reading all of it.
  std::string bytes;
  char block[1 << 16];
  while (bytes.size() <= limit) {
    ssize_t n = ::read(fd, block, sizeof block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      file.status = SmallFile::Status::unreadable;
      file.error = errno;
      ::close(fd);
      return file;
    }
    if (n == 0) break;
    bytes.append(block, static_cast<size_t>(n));
  }
  ::close(fd);
  if (bytes.size() > limit) {
    file.status = SmallFile::Status::too_large;
    return file;
  }
  file.status = SmallFile::Status::ok;
  file.bytes = std::move(bytes);
  return file;
}

}  // namespace aotc
