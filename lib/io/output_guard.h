#pragma once
/// Inputs are never written: a run lists what it reads (episode directories and files, the checkpoint, the
/// config, the tokenizer, list files) and every place it will write, and is refused before anything runs when
/// an output would land inside an input directory or replace an input file. Paths are compared by what they
/// are, not how they are spelled: symlinks and `..` are resolved, and directories and files are identified by
/// device and inode, so a bind mount or a hard link of an input is recognized too.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace dzr::io {

class InputSet {
  public:
    /// A directory whose files the run reads (nothing may be created inside it). `what` names it in errors
    /// ("episode ep_001", "checkpoint"). A missing path is ignored.
    void add_dir(const std::filesystem::path& dir, std::string what);
    /// A file the run reads (it must not be replaced).
    void add_file(const std::filesystem::path& file, std::string what);

    /// Throws dzr::Error naming both paths when `dir`, or a directory above it, is an input directory
    /// (creating `dir` and writing files into it would change that input).
    void check_output_dir(const std::filesystem::path& dir) const;
    /// Throws when `file` (existing or not) would replace an input file, or lies inside an input directory.
    void check_output_file(const std::filesystem::path& file) const;

  private:
    struct Entry {
        std::filesystem::path path;
        std::string what;
        uint64_t dev = 0, ino = 0;
    };
    std::vector<Entry> dirs_, files_;
};

/// A name read from a file (an episode in plan.json, a shard in an index) that may be used as one path
/// component: not empty, not "." or "..", no '/', '\\' or NUL.
bool is_plain_name(std::string_view name);

/// Creates `dir` (and its parents), writes a probe file into it and removes it again. Throws dzr::Error
/// naming the directory and the system's reason (not writable, read-only file system, a file of that name,
/// ...).
void probe_writable_dir(const std::filesystem::path& dir);

}  // namespace dzr::io
