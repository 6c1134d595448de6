// Outputs and temporaries: the one place that decides where an output may be
// written, creates temporaries, publishes them onto their final names and
// removes them on every failure path (doc/cli.md "Outputs").
//
// Used by OutFile (compress, export, folder copies), TensorWriter, the
// folder passes, compress/decompress_checkpoint, rebase and the checkpoint
// engine's manifest and bandwidth-probe files.
//
// Temporaries are named "<dir>/.<base>.tmp-<tag>-<pid>-<random>" beside the
// final path (same file system, so publishing is a rename): hidden, never
// ending in .tzip or .safetensors, unpredictable (64 random bits), created
// with O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC (folders with mkdir, which never
// follows a link) and mode 0600/0700 until published. Every temporary is in
// a process-wide registry; creating, publishing and removing one happens
// under one lock, so that remove_temporaries() (a signal watchdog) always
// sees a consistent set and nothing is created after it ran.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tensorzip/container.hpp"

namespace tz::container::detail {

// Throws Error(kInterrupted) if request_cancel() was called.
void check_cancel();

// Held while temporaries are created, published or removed.
std::unique_lock<std::recursive_mutex> output_lock();

std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);
void fsync_dir_of(const std::string& path);
// Removes a file, or a folder and everything in it (links are removed, never followed).
void remove_tree(const std::string& path);

// A fresh temporary name beside final_path (not created).
std::string make_temp_name(const std::string& final_path);
// True for a name made by make_temp_name (any process, any version of this
// library: ".<name>.tmp-..."), so that folder walks and listings skip them.
bool is_temp_name(const std::string& file_name);

// A registered temporary: removed (file or whole folder) by the destructor
// unless release()d. Created under output_lock() after check_cancel().
class Temporary {
 public:
  // Reserves a name only (nothing created): a path some other writer will
  // publish onto (compress_checkpoint stages, rebase's export).
  static Temporary reserve(const std::string& final_path);
  // Creates an empty file, mode 0600; *fd receives the open descriptor (O_RDWR).
  static Temporary create_file(const std::string& final_path, int* fd);
  // Creates an empty folder, mode 0700.
  static Temporary create_dir(const std::string& final_path);

  Temporary() = default;
  Temporary(Temporary&& o) noexcept;
  Temporary& operator=(Temporary&& o) noexcept;
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary();

  const std::string& path() const { return path_; }
  bool active() const { return !path_.empty(); }
  // Forget the name (it was published or taken over); no longer removed.
  void release();
  // Removes it now (idempotent).
  void remove();

 private:
  // Creates a registered temporary: create(name) returns 0 or an errno.
  static Temporary make(const std::string& final_path, const std::function<int(const std::string&)>& create);
  std::string path_;
  int slot_ = -1;
};

// Renames the already-written temporary `tmp` (file or folder) onto
// final_path, then fsyncs the folder. Refuses to replace anything but what
// an output may replace (check_replaceable): an existing final is kExists
// unless force; with force a regular file is replaced atomically (rename),
// a folder atomically exchanged (renameat2 RENAME_EXCHANGE; the old one is
// then removed). Checks check_cancel() first: nothing is published after a
// signal.
void publish(const std::string& tmp, const std::string& final_path, bool force, bool is_dir);
// The same for a file that is one of several outputs published together
// (compress_checkpoint, decompress_checkpoint: all or nothing): a regular
// file it replaces (force) is kept, exchanged with the new file in one step
// (renameat2 RENAME_EXCHANGE; without it, kept under a hard link and renamed
// over), so its name never goes missing. Returns true when a file was
// replaced: `stage` then names that file, to be removed once every output is
// in place, or put back by restore_replaced(). `together`: the other outputs
// of the call (check_not_a_reference).
bool publish_keeping_replaced(Temporary& stage, const std::string& final_path, bool force,
                              const std::vector<std::string>& together);
// Undoes publish_keeping_replaced() that returned true: the replaced file
// (held by `stage`) returns to final_path; the new one is then `stage`'s.
void restore_replaced(Temporary& stage, const std::string& final_path);

// What an existing output path is, for a file output.
enum class FileTarget {
  kNew,      // nothing there: create
  kReplace,  // a regular file, and force: replace it (temporary + rename)
  kStream,   // a FIFO or a character device that is not a terminal (/dev/null):
             // written through in order, never renamed over
};
// Decides for a file output. Refuses (one-line Error naming the path):
// an existing file without force (kExists); a folder; a symbolic link
// (to anything but a FIFO or a character device: the link and the file
// behind it are left alone, even with force); a terminal; a block device,
// a socket.
// `together`: the other outputs of the same call (see check_not_a_reference).
FileTarget check_file_target(const std::string& final_path, bool force,
                             const std::vector<std::string>& together = {});
// An existing file that another .tzip file in its folder records as its
// reference is not replaced, even with force: that file could never be
// decoded again. kExists, naming the dependent file and how to proceed.
// Files in `together` (outputs replaced by the same call) do not count.
void check_not_a_reference(const std::string& final_path, const std::vector<std::string>& together = {});

// Refuses an output that is an input, contains it (an existing folder
// holding it) or lies inside it (an input folder), resolved by device and
// inode along the real parent chain, never by comparing strings.
void check_output_vs_input(const std::string& input, const std::string& output);
void check_output_vs_inputs(const std::vector<std::string>& inputs, const std::string& output);

// Permission bits (and owner where allowed) and times an output takes on.
struct OutputAttrs {
  bool from_source = false;  // false: mode 0666 & ~umask, times = now
  mode_t mode = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  struct timespec atime {}, mtime {};
};
// The attributes of `source` (an input file or folder), or the defaults.
OutputAttrs attrs_of(const std::string& source);
// Applies them to an open file (before publishing). Mode and times are
// errors if they fail; the owner is best effort (as zstd does).
void apply_attrs(int fd, const OutputAttrs& a, const std::string& name_for_errors);
// The same for a folder path (call once its content is complete).
void apply_dir_attrs(const std::string& dir, const OutputAttrs& a);

// Temporaries left beside final_path by a process that no longer runs (the
// tag in the name says "this machine, this boot, this pid namespace", and
// that pid is gone) are removed: they are what a kill -9 leaves. Called
// before an output is written. A temporary of another machine (a shared
// file system) or of a running process is left alone.
void remove_stale_temporaries(const std::string& final_path);

}  // namespace tz::container::detail
