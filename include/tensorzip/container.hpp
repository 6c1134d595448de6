// tensorzip container: .tzip files (doc/container.md), safetensors import and
// byte-identical export, Hugging Face model folders.
//
// C++ API. Every failure throws tz::container::Error, whose kind() tells the
// class of problem (bad input, I/O, ...) and whose what() is one line naming
// the file and the problem. Nothing here keeps the whole file in memory:
// writers stream chunk by chunk, readers pread what they need.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tensorzip/tensorzip.h"

namespace tz::container {

// Container format version written by this library (doc/container.md).
// Files without predicted tensors are written as 1.0 (readable by every
// version-1 reader); files with predicted tensors (section 12) as 2.0, which
// version-1 readers refuse with "format version 2.0 is newer than this reader".
constexpr uint16_t kTzipVersionMajor = 1;
constexpr uint16_t kTzipVersionMinor = 0;
constexpr uint16_t kTzipVersionMajorPredicted = 2;
constexpr uint16_t kTzipMaxReadMajor = 2;  // highest major version this library reads

enum class ErrorKind {
  kUsage = 1,         // bad argument or option
  kBadInput = 2,      // not the expected format, corrupt, checksum mismatch, differs
  kIO = 3,            // cannot open/read/write/rename: missing, permission, disk full
  kExists = 4,        // output exists and overwriting was not allowed
  kInternal = 5,      // out of memory, unexpected failure
  kInterrupted = 6,   // request_cancel() was called (e.g. from a SIGINT handler)
};

// `s` with every control character written as \xNN: C0 (newline, escape,
// ...), DEL, and the C1 range (U+0080..U+009F, e.g. the one-byte CSI) as
// UTF-8 or as a stray byte. Safe to print on a terminal, and one line.
// Tensor names, metadata and paths come from files: every message and
// listing that shows them goes through this.
inline std::string printable(std::string_view s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  auto esc = [&](unsigned char c) { out += {'\\', 'x', hex[c >> 4], hex[c & 15]}; };
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = (unsigned char)s[i];
    if (c < 0x20 || c == 0x7f) {
      esc(c);
    } else if (c == 0xc2 && i + 1 < s.size() && (unsigned char)s[i + 1] >= 0x80 && (unsigned char)s[i + 1] <= 0x9f) {
      esc(c);
      esc((unsigned char)s[++i]);
    } else if (c >= 0x80 && c <= 0x9f && (i == 0 || (unsigned char)s[i - 1] < 0x80)) {
      esc(c);  // a stray C1 byte (not inside a UTF-8 sequence)
    } else {
      out += (char)c;
    }
  }
  return out;
}

class Error : public std::runtime_error {
 public:
  // The message is stored through printable(): one line, whatever names it holds.
  Error(ErrorKind kind, const std::string& msg, int sys_errno = 0)
      : std::runtime_error(printable(msg)), kind_(kind), errno_(sys_errno) {}
  ErrorKind kind() const { return kind_; }
  // The errno behind a kIO error where one is known (e.g. ENOSPC), else 0.
  int sys_errno() const { return errno_; }

 private:
  ErrorKind kind_;
  int errno_ = 0;
};

// Called with (bytes done, bytes total) of uncompressed data, one call at a
// time and in order, from one of the threads doing the work (the calling
// thread or another one of the `threads`).
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

struct WriteOptions {
  int level = 0;              // tz_params.level
  unsigned block_elems = 0;   // 0: codec default for the dtype
  unsigned threads = 0;       // threads in all, the calling one included (reads, coding, writes); 0: all hardware threads
  uint64_t chunk_bytes = 4u << 20;  // raw bytes per frame: power of two, 1 MiB..64 MiB
  bool force = false;         // replace an existing output (a regular file; doc/cli.md "Outputs")
  // >= 0: write the (single-file) output to this open descriptor instead of
  // a file (e.g. a pipe on stdout): in order, no temporary, not closed; the
  // output path then only names it in messages.
  int output_fd = -1;
  std::map<std::string, std::string> user_metadata;  // stored in the .tzip header only
  ProgressFn progress;
  // Checkpoint-aware coding (doc/container.md section 12).
  bool predict = true;        // discover cast tensors (BF16/F16 = RNE cast of an FP32 tensor) and use
                              // them where a sample says they pay; false: plain per-tensor coding
  bool cross_file = true;     // compress_checkpoint: casts may use an FP32 tensor of another input
                              // (that output then needs the other one); false: each output alone
  std::string ref;            // previous checkpoint's .tzip: tensors of the same name, dtype and
                              // shape are stored as XOR residuals where that pays (delta)
  double min_gain = 0.03;     // a prediction must cut the sampled order-0 cost by this fraction
  std::string ref_original;   // optional: the safetensors file `ref` decodes to (e.g. the verified
                              // export of the previous checkpoint, or the file it was compressed
                              // from). Delta predictors are then read from it instead of decoding
                              // `ref` (fast path). Its safetensors header and size are checked,
                              // and every byte read from it is checked against `ref`'s stored
                              // block checksums (CRC32C, no decoding; a predicted reference
                              // tensor is decoded): kUsage "differs from" if it is not ref's content.
};

struct ReadOptions {
  unsigned threads = 0;  // threads in all, the calling one included; 0: all hardware threads
  // Explicit locations of referenced .tzip files (delta or cross-file cast
  // sources), matched to the recorded references by whole-file checksum;
  // references not given here are looked up by their recorded relative path.
  std::vector<std::string> refs;
  // Optional, paired with refs by position (same size): the safetensors
  // content of refs[i] (the file it was made from, or its verified export).
  // Predictors are then read from it instead of decoding refs[i] (fast
  // path, Reader::add_reference_original). Its header and size are checked,
  // and every predictor range read from it is checked against refs[i]'s
  // stored block checksums (Reader::check_bytes; kUsage if it differs).
  std::vector<std::string> ref_originals;
  // Follow recorded reference paths that are not contained (absolute, or
  // climbing above the file's folder tree; doc/container.md 12.3).
  bool any_reference_location = false;
  bool force = false;         // replace an existing output (a regular file, or a folder of the same output)
  int output_fd = -1;         // as WriteOptions::output_fd (export of one file)
  ProgressFn progress;
};

// The rules of a writer's options, in one place: every writer (compress_file,
// TensorWriter, the checkpoint engine), the C API, the CLI and Python check
// them here. level: -1 (store), 0 (default), 1, 2 or 3 (the codec's
// encode_level_valid); block_elems: 0 (the codec default for the dtype) or a
// power of two in [4096, 1048576] (the codec's block size rule);
// chunk_bytes: raw bytes per frame, a power of two in [1 MiB, 64 MiB].
// Throws Error(kUsage) naming the rule, prefixed with `what` + ": " when
// `what` is not empty (the file, and tensor, it is about).
void check_write_options(int level, uint64_t block_elems, uint64_t chunk_bytes, const std::string& what = "");
// The same checks, one option each.
void check_level(int level, const std::string& what = "");
void check_block_elems(uint64_t block_elems, const std::string& what = "");
void check_chunk_bytes(uint64_t chunk_bytes, const std::string& what = "");
bool chunk_bytes_valid(uint64_t chunk_bytes);

// safetensors dtype string -> the codec dtype a writer uses for it (BF16, F16,
// F32, F8_E4M3, F8_E5M2 map to their own; the FNUZ FP8 types and F8_E8M0 to an
// FP8 codec, C64 to F32, every other known dtype to TZ_DTYPE_BYTES: doc/container.md
// section 5). Returns false for an unknown dtype string.
bool codec_dtype_for(const std::string& st_dtype, tz_dtype* out);
// Bits per element of a safetensors dtype (0 if unknown).
unsigned dtype_bits(const std::string& st_dtype);

// One compressed frame of a segment: a chunk of at most chunk_bytes raw bytes.
struct FrameRef {
  uint64_t offset = 0;    // in the .tzip file
  uint64_t size = 0;      // compressed bytes
  uint64_t raw_size = 0;  // decompressed bytes
  uint64_t xxh64 = 0;     // of the compressed bytes
};

// How a predicted tensor's stored frames relate to its values (section 12):
// value = residual XOR prediction.
enum class PredictKind {
  kNone = 0,
  kCast = 1,   // prediction = RNE cast of the FP32 tensor `source` (this file, or references[ref])
  kDelta = 2,  // prediction = the tensor of the same name in references[ref]
};
struct Prediction {
  PredictKind kind = PredictKind::kNone;
  int ref = -1;        // index into the file's references; -1: this file (cast only)
  std::string source;  // cast: name of the FP32 source tensor; delta: empty (same name)
};
// Another .tzip file a predicted tensor needs: its path relative to the
// folder of the file that records it, and its whole-file checksum (trailer
// file_xxh64), which identifies it exactly.
struct Reference {
  std::string file;
  uint64_t xxh64 = 0;
  // The referenced file's header_xxh64 (trailer): what the reader checks
  // against the header bytes it verified, so the identity rests on checked
  // data (doc/container.md 12.3). Absent in files of earlier writers.
  bool has_header_xxh64 = false;
  uint64_t header_xxh64 = 0;
};

// A tensor, or a gap (bytes of the safetensors data section that no tensor
// covers; name empty, dtype "").
struct TensorEntry {
  std::string name;
  std::string dtype;             // safetensors dtype string, e.g. "BF16"
  std::vector<uint64_t> shape;
  uint64_t data_begin = 0;       // offsets in the original data section
  uint64_t data_end = 0;
  tz_dtype codec_dtype = TZ_DTYPE_BYTES;
  int level = 0;
  unsigned block_elems = 0;      // effective elements per block
  std::vector<FrameRef> frames;
  bool is_gap = false;
  Prediction predict;            // kind kNone: frames hold the values themselves

  uint64_t raw_size() const { return data_end - data_begin; }
  uint64_t compressed_size() const;
  uint64_t block_bytes() const;  // raw bytes per codec block
  uint64_t n_blocks() const;     // codec blocks over the whole tensor
};

// Parsed safetensors header (strictly validated).
struct SafetensorsInfo {
  uint64_t file_size = 0;
  uint64_t header_len = 0;                 // the 8-byte length value
  std::string header_bytes;                // verbatim
  uint64_t data_start = 0;                 // 8 + header_len
  uint64_t data_size = 0;
  std::map<std::string, std::string> metadata;  // __metadata__
  std::vector<TensorEntry> tensors;        // sorted by data_begin
  std::vector<TensorEntry> gaps;           // uncovered byte ranges, sorted
};

// Validates a safetensors header given the file size. `what` names the file
// in messages. Throws Error(kBadInput) on any violation.
SafetensorsInfo parse_safetensors_header(const uint8_t* header, size_t header_len, uint64_t file_size,
                                         const std::string& what);
// Opens and validates a safetensors file (reads only its header).
SafetensorsInfo read_safetensors_info(const std::string& path);

// Header caps (doc/container.md, "Limits").
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxTensors = 1u << 20;

// Statistics of a whole-file pass: bytes of the original safetensors file
// and of the .tzip file.
struct PassStats {
  uint64_t raw_bytes = 0;
  uint64_t file_bytes = 0;
};

// Compresses a safetensors file into a .tzip file. Output rules (every
// function here that writes a file or folder; doc/cli.md "Outputs"): the
// output is written to a temporary beside `out`, fsync'd and renamed; it
// takes on the input's permission bits and times; an existing `out` is
// kExists unless force, and force replaces only a regular file (a folder
// output: a folder holding only what the new output holds); a FIFO or a
// character device (/dev/null) is written through, a symbolic link, a
// terminal or any other kind of file is refused (kUsage); an output that
// is, contains or lies inside an input is refused (kUsage).
PassStats compress_file(const std::string& in, const std::string& out, const WriteOptions& opt);

// Compresses the safetensors files of one checkpoint (e.g. a BF16 model file
// and an FP32 optimizer file) into one .tzip each, with cast prediction
// across files: a BF16/F16 tensor of one file may be predicted from an FP32
// tensor of another, recorded as a reference to that file's .tzip (relative
// path + checksum). Files holding no BF16/F16 tensors are written first so
// they can serve as sources. refs[i] (optional, empty or same size as ins):
// previous checkpoint's .tzip for ins[i] (delta); ref_originals[i]
// (optional): its safetensors content (WriteOptions::ref_original, per
// input; opt.ref and opt.ref_original must be empty). Returns totals.
//
// All or nothing: the outputs are written under temporary names and renamed
// into place together at the end. On any failure (bad input, I/O error such
// as a full disk, request_cancel()) every temporary and every output already
// renamed by this call is removed, and files an output replaced (force) are
// restored. Without force, an existing output is refused before any work.
PassStats compress_checkpoint(const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                              const WriteOptions& opt, const std::vector<std::string>& refs = {},
                              const std::vector<std::string>& ref_originals = {});

// Restores the .tzip files of one checkpoint (outs[i] from ins[i]). Files
// that others reference are restored first; their restored bytes (verified
// by the export pass) then serve as predictors, so e.g. FP32 master weights
// are decoded once, not once more for the BF16 file cast from them.
PassStats decompress_checkpoint(const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                                const ReadOptions& opt);

// Writes a standalone copy of a .tzip file: every reference (delta or
// cross-file cast) resolved, casts within the file kept.
PassStats rebase(const std::string& in, const std::string& out, const WriteOptions& opt,
                 const ReadOptions& ropt = {});

namespace detail {
struct ReaderAccess;  // the references module's access (src/container/file_refs.hpp)
struct WriterAccess;  // compress_file's access to the writer (src/container/writer/writer_impl.hpp)
}
namespace refs {
class Chain;
}

class Reader {
 public:
  // Opens a .tzip file: reads the preamble, trailer and header only.
  explicit Reader(const std::string& path, unsigned threads = 0);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const;
  uint64_t file_size() const;
  uint16_t version_minor() const;
  const std::vector<TensorEntry>& tensors() const;  // sorted by data offset, gaps excluded
  const std::vector<TensorEntry>& gaps() const;
  const std::map<std::string, std::string>& metadata() const;       // safetensors __metadata__
  const std::map<std::string, std::string>& user_metadata() const;  // WriteOptions::user_metadata
  const std::string& safetensors_header() const;    // verbatim, may be empty
  uint64_t data_size() const;                       // original data section size
  uint64_t original_size() const;                   // size of the exported safetensors file
  uint64_t chunk_bytes() const;
  const std::string& created_by() const;
  uint16_t version_major() const;
  uint64_t file_checksum() const;                   // trailer file_xxh64 (what references record)
  uint64_t header_checksum() const;                 // trailer header_xxh64, checked against the header bytes
  const std::vector<Reference>& references() const; // other .tzip files predicted tensors need
  // Uses `path` for whichever recorded reference has that file's checksum.
  // Throws kBadInput if it matches none ("is not a reference of this file").
  void add_reference_path(const std::string& path);
  // Locations for a whole reference chain: each path is used for whichever
  // reference of this file, or of a reference of it (recursively), has that
  // file's checksum. check_references() then throws kBadInput for a path
  // that matched no reference anywhere in the chain.
  void add_reference_paths(const std::vector<std::string>& paths);
  // Declares `safetensors_path` to be the (already verified) export of the
  // referenced .tzip `tzip_path` (matched by checksum): predictors are then
  // read from it instead of decoding the reference again. Used by
  // decompress_checkpoint (the caller vouches for the data; header and size
  // are checked: kUsage if they differ). ReadOptions::ref_originals uses it
  // and also checks every range read against the reference's checksums.
  void add_reference_original(const std::string& tzip_path, const std::string& safetensors_path);
  // Opens every reference (recursively) and checks its checksum; throws a
  // one-line error naming this file and the missing or wrong reference.
  void check_references();
  // Also follows recorded reference paths that are not contained (absolute,
  // or climbing above this file's folder tree; doc/container.md 12.3) for
  // this file and the references it opens. Off by default.
  void allow_references_anywhere(bool allow);

  // Index into tensors(), or -1.
  long find(const std::string& name) const;

  // Reads one whole tensor into dst (capacity >= raw_size()). Reads only its
  // frames (each with the zero padding on both sides, checked, and its xxh64
  // checked before it is decoded), plus the predictor's needed range for a
  // predicted tensor. All read functions are thread-safe. What these random
  // reads cannot see is what only the whole-file checksum covers (its own
  // field, the frames of gaps): read_all, verify and export check that too.
  void read_tensor(size_t index, void* dst, size_t capacity);
  std::vector<uint8_t> read_tensor(const std::string& name);
  // Reads several whole tensors at once, each into its own destination
  // (capacity >= its raw_size()): the frames of all of them are decoded in
  // parallel on `threads` threads (the caller included; 0: all hardware
  // threads), so many small tensors load as fast as one large one. The
  // bytes are those of read_tensor; the first error is thrown.
  struct TensorRead {
    size_t index;
    void* dst;
    size_t capacity;
  };
  void read_tensors(const std::vector<TensorRead>& reads, unsigned threads);
  // Reads codec blocks [first, first+count) of a tensor; returns bytes written.
  // Partial reads (read_blocks, read_range) check the frame's prefix, the
  // blocks' checksums and the padding next to what they read (before the
  // frame; after it when the blocks reach its end), not the frame's xxh64,
  // which covers the whole frame.
  size_t read_blocks(size_t index, uint64_t first, uint64_t count, void* dst, size_t capacity);
  // Reads raw bytes [offset, offset+size) of a tensor (decodes only the blocks it needs).
  void read_range(size_t index, uint64_t offset, uint64_t size, void* dst);
  // Checks that bytes supplied by read(off, len, dst) (offsets inside the
  // tensor) are the tensor's bytes [offset, offset+size): for a tensor stored
  // as itself, without decoding, by the codec's stored per-block checksums
  // (CRC32C) of the blocks covering the range (read() is asked for whole
  // blocks); a predicted tensor is decoded and compared. False on a mismatch.
  // `bytes`, if given, holds [offset, offset+size): when that range is whole
  // blocks it is checked in place and read() is not called.
  bool check_bytes(size_t index, uint64_t offset, uint64_t size,
                   const std::function<void(uint64_t off, uint64_t len, uint8_t* dst)>& read,
                   const uint8_t* bytes = nullptr);

  // Reads the listed whole tensors with the whole-file pass of verify, each
  // into its destination: every frame (gaps too), every padding byte and
  // the whole-file checksum are checked, so it refuses exactly what verify
  // and export refuse (Python's load_file). Unlisted tensors are decoded
  // and discarded. Contents are unspecified after an error.
  PassStats read_all(const std::vector<TensorRead>& reads, const ReadOptions& opt);
  // Writes the original safetensors file to `out` (atomic, byte-identical).
  PassStats export_safetensors(const std::string& out, const ReadOptions& opt);
  // Checks whole-file checksum, header, every frame and block. If `original`
  // is non-empty, also compares the exported bytes with that file.
  PassStats verify(const std::string& original, const ReadOptions& opt);

 private:
  friend struct detail::ReaderAccess;
  Reader(const std::string& path, unsigned threads, const refs::Chain& via);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Folders: every *.safetensors file becomes a .tzip, every other regular file
// is copied byte for byte (subfolders kept). Output folder built under a
// temporary name and renamed.
// opt.ref: the previous checkpoint's compressed folder (files of the same
// relative names are references); opt.ref_original: optionally its
// original folder (safetensors files of the same relative names).
void compress_folder(const std::string& in_dir, const std::string& out_dir, const WriteOptions& opt);
void decompress_folder(const std::string& in_dir, const std::string& out_dir, const ReadOptions& opt);
// Verifies every .tzip in a folder (and, with `original_dir`, compares every
// file with the original folder).
void verify_folder(const std::string& dir, const std::string& original_dir, const ReadOptions& opt);

// Asks every running operation to stop at its next chunk boundary with
// Error(kInterrupted); their temporaries are then removed as on any error.
// Async-signal-safe (sets a flag). The flag stays set until clear_cancel().
void request_cancel();
void clear_cancel();

// ---------------------------------------------------------------------------
// Writing a .tzip file from tensors in memory (src/container/writer/tensor_writer.cpp).
//
// Where the writer's bytes go: an I/O back end for one open file. The writer
// calls write() from one thread, in file order; `done` must run once the
// buffer may be reused (the write finished or failed), from any thread.
// write() may block (bounded queue) but should not wait for the disk.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(uint64_t offset, const void* p, size_t n, std::function<void()> done) = 0;
  // Waits for every queued write; returns the first errno seen (0: none).
  virtual int drain() = 0;
  // First errno of a completed write so far (0: none); lets the writer stop early.
  virtual int error() const { return 0; }
  virtual std::string name() const = 0;  // e.g. "pwrite", "io_uring"
};
// Makes the sink for file descriptor `fd` (not owned). `direct`: fd was
// opened with O_DIRECT; every write is then 4096-byte aligned in offset,
// size and buffer address.
using SinkFactory = std::function<std::unique_ptr<Sink>(int fd, bool direct)>;
// Synchronous pwrite from the calling thread (the default). Unless `direct`,
// each 8 MiB written is queued for writeback at once (Linux
// sync_file_range), so that the writer's closing fsync waits less.
std::unique_ptr<Sink> make_pwrite_sink(int fd, bool direct = false);

struct TensorWriterOptions {
  int level = 0;                    // tz_params.level (-1 store, 0 default, 1..3)
  unsigned block_elems = 0;         // 0: codec default for the dtype
  unsigned threads = 0;             // threads in all (coding and in-order writes); 0: all hardware threads
  uint64_t chunk_bytes = 4u << 20;  // raw bytes per frame: power of two, 1 MiB..64 MiB
  unsigned slots = 0;               // frames in flight; 0: threads + 4. Memory ~ slots x chunk
  bool force = false;               // replace an existing output
  std::map<std::string, std::string> metadata;       // safetensors __metadata__ of the export
  std::map<std::string, std::string> user_metadata;  // .tzip header only
  // The export's safetensors header JSON, verbatim (without its 8-byte length). Empty: made
  // from the added tensors. Given (e.g. laid out as safetensors' own writer does, so that the
  // export equals that writer's file byte for byte), it must describe exactly the added tensors
  // (names, dtypes, shapes, data offsets in the order added) with `metadata` as its
  // __metadata__; finish() checks that (kUsage) before writing anything.
  std::string safetensors_header;
  // Cast prediction (doc/container.md section 12): a BF16/F16 host tensor
  // that is the RNE cast of an FP32 host tensor of the same shape added to
  // this writer is stored as the XOR residual against that cast, where a
  // sample says it pays by min_gain (same rule as compress_file).
  bool predict = true;
  double min_gain = 0.03;
  // Delta prediction (doc/container.md section 12): a previous .tzip (e.g.
  // the same rank's file of the previous checkpoint). A host tensor with a
  // tensor of the same name, dtype and shape there (and not cast-predicted)
  // is stored as the XOR residual against it where a sample of one
  // reference block says it pays by min_gain. The file records the
  // reference by its path relative to this file's folder and its checksum;
  // readers need it there (or given explicitly) to restore those tensors.
  // Independent of `predict`. Empty: no deltas.
  std::string ref;
  // With `ref`: its content as a safetensors file (the file it was made from,
  // or its export). The delta predictors are read from it instead of decoding
  // `ref` (faster; the same file is written). Its header and size must match
  // `ref`, and every byte used is checked against `ref`'s stored block
  // checksums (kUsage if it differs). Empty: decode `ref`.
  std::string ref_original;
  // O_DIRECT: frames are gathered into aligned staging buffers of
  // direct_buffer_bytes (a multiple of 4096) and written bypassing the page
  // cache; where the file system refuses O_DIRECT (tmpfs), buffered writes.
  bool direct_io = false;
  uint64_t direct_buffer_bytes = 8u << 20;
  unsigned direct_buffers = 4;
  SinkFactory sink;                 // null: make_pwrite_sink
  std::string created_by;           // empty: "tensorzip <version>"
  ProgressFn progress;              // raw bytes written, from finish()'s thread
};

// One pre-encoded frame: a tz_compress frame of one chunk of a tensor.
struct EncodedFrame {
  const void* data = nullptr;
  size_t size = 0;
};

struct TensorWriterStats {
  uint64_t raw_bytes = 0;
  uint64_t file_bytes = 0;
  double encode_seconds = 0;        // codec time summed over the workers
  double seconds = 0;               // finish() wall time
  std::string io;                   // sink name, plus "+O_DIRECT" when direct writes were used
  bool direct = false;              // O_DIRECT writes used (requested and not refused)
  size_t predicted = 0;             // tensors stored as cast residuals
  size_t deltas = 0;                // tensors stored as delta residuals (TensorWriterOptions::ref)
  uint64_t file_xxh64 = 0;          // trailer checksum
};

// Writes a .tzip file of named tensors. Nothing is written to the final path
// before finish(): the file is built under a temporary name in the same
// folder (created by the constructor), fsync'd and renamed. The output rules
// of compress_file hold (an existing file only with force, links refused),
// except that the output must be a regular file (frames are written at
// their offsets): a FIFO or a device is refused (kUsage). abort(), the
// destructor of an unfinished writer, and any error remove the temporary.
// The file exports (Reader::export_safetensors) to a safetensors file holding
// exactly the added tensors, in the order added.
class TensorWriter {
 public:
  explicit TensorWriter(const std::string& path, const TensorWriterOptions& opt = {});
  ~TensorWriter();
  TensorWriter(const TensorWriter&) = delete;
  TensorWriter& operator=(const TensorWriter&) = delete;

  // A tensor in host memory, encoded by the writer's thread pool in
  // chunk_bytes chunks. `data` must stay valid and unchanged until finish()
  // returns. dtype: a safetensors dtype string; size must match shape.
  void add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
           const void* data, uint64_t size);
  // A tensor given as pre-encoded frames (e.g. from the GPU codec): frame k
  // holds raw bytes [k*chunk_bytes, min(size, (k+1)*chunk_bytes)) coded as
  // codec dtype codec_dtype_for(dtype) with `block_elems` elements per block
  // (0: codec default) at `level`. Checked against those: raw size, dtype,
  // block size. The frames must stay valid until finish() returns.
  void add_frames(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                  uint64_t size, std::vector<EncodedFrame> frames, int level, unsigned block_elems = 0);
  // Like add_frames, but frame k is produced on demand by encode(k, dst,
  // capacity) -> frame size (or an error code of tensorzip.h), called from
  // the writer's worker threads (different k concurrently); capacity is
  // tz_compress_bound(chunk_bytes). Memory stays bounded by the slots.
  using EncodeFn = std::function<size_t(uint64_t chunk, uint8_t* dst, size_t capacity)>;
  void add_encoder(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                   uint64_t size, EncodeFn encode, int level, unsigned block_elems = 0);

  // Encodes, writes, fsyncs and renames onto the path. Call once.
  TensorWriterStats finish();
  // Drops the output (idempotent; nothing to do after finish()).
  void abort();

  const std::string& path() const;
  uint64_t chunk_bytes() const;
  // After finish(): the tensors as stored (frames with offsets and hashes,
  // predictions), in the order added.
  const std::vector<TensorEntry>& tensors() const;

 private:
  friend struct detail::WriterAccess;
  TensorWriter();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tz::container
