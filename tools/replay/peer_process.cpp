// gpumem-replay — running gpumem-replay-peer: starting the child process, collecting its output
// and reading its JSON record back.
#include "peer_process.hpp"

#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpumem/trace/replay.hpp"
#include "json_text.hpp"

extern char** environ;

namespace gpumem_replay {

namespace {

constexpr std::string_view enable_pytorch =
    "to enable it: `bash tools/setup_torch.sh`, then configure gpumem with "
    "-DGPUMEM_TORCH_PYTHON=.venv-torch/bin/python and rebuild";

struct child_output {
  int status = 0;  // the exit status, or 128 + signal
  std::string out;
  std::string err;
};

/// Runs `argv` with `env`, collecting its stdout and stderr.
child_output run_child(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(out_pipe) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  if (::pipe(err_pipe) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::system_error(errno, std::generic_category(), "pipe");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc =
      ::posix_spawn(&pid, argv.front().c_str(), &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::system_error(rc, std::generic_category(), "cannot start " + argv.front());
  }
  child_output result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  char buffer[65536];
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return result;
}

/// The peer's message without its "gpumem-replay-peer: " prefix and trailing newline.
std::string peer_message(std::string err) {
  const std::string prefix = std::string(peer_name) + ": ";
  if (const std::size_t at = err.rfind(prefix); at != std::string::npos) {
    err = err.substr(at + prefix.size());
  }
  while (!err.empty() && (err.back() == '\n' || err.back() == '\r')) err.pop_back();
  return err;
}

/// The peer's record (one JSON object), with typed access to the fields gpumem-replay reads: a
/// record that is not JSON, not an object, or lacks a field or gives it another type is an error
/// naming the field, not a figure quietly taken as 0.
class peer_record {
 public:
  peer_record(const std::string& text, std::string who) : who_(std::move(who)) {
    try {
      fields_ = json::parse(text);
    } catch (const json::parse_error& e) {
      fail(fmt::format("printed no readable JSON record ({})", what_of(e)));
    }
    if (!fields_.is_object()) {
      fail(fmt::format("printed a JSON {}, not the record object", fields_.type_name()));
    }
  }

  const json& fields() const { return fields_; }

  bool flag(const char* key) const {
    const json& v = at(key);
    if (!v.is_boolean()) wrong(key, v, "true or false");
    return v.get<bool>();
  }
  std::string text(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) wrong(key, v, "a string");
    return v.get<std::string>();
  }
  std::uint64_t count(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number_unsigned()) wrong(key, v, "a count (an integer, 0 or more)");
    return v.get<std::uint64_t>();
  }
  double seconds(const char* key) const {
    const json& v = at(key);
    if (!v.is_number() || v.get<double>() < 0) wrong(key, v, "seconds (a number, 0 or more)");
    return v.get<double>();
  }

 private:
  // nlohmann-json's message without its "[json.exception.parse_error.101] " tag.
  static std::string what_of(const json::exception& e) {
    const std::string_view w = e.what();
    const std::size_t tag_end = w.find("] ");
    return std::string(tag_end == std::string_view::npos ? w : w.substr(tag_end + 2));
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(fmt::format("{} {}", who_, why));
  }
  const json& at(const std::string& key) const {
    const auto it = fields_.find(key);
    if (it == fields_.end()) fail(fmt::format("printed a record without \"{}\"", key));
    return *it;
  }
  [[noreturn]] void wrong(const std::string& key, const json& v, const char* expected) const {
    fail(fmt::format("printed \"{}\": {} in its record, expected {}", key, json_line(v), expected));
  }

  std::string who_;
  json fields_;
};

}  // namespace

std::string peer_path() {
  if (const char* env = std::getenv("GPUMEM_REPLAY_PEER"); env != nullptr && *env != '\0') {
    return env;
  }
  std::string self(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0) return std::string(peer_name);
  self.resize(static_cast<std::size_t>(n));
  const std::size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) +
         std::string(peer_name);
}

void check_peer(const options& o, const std::string& path) {
  if (::access(path.c_str(), X_OK) != 0) {
    usage_error(fmt::format(
        "--allocator {} needs {} next to gpumem-replay, not found at {}{}", o.allocator, peer_name,
        path, o.allocator == "pytorch" ? fmt::format("; {}", enable_pytorch) : std::string()));
  }
  const child_output list = run_child({path, "--list"}, {});
  if (list.status != 0) usage_error(fmt::format("{} --list failed: {}", path, list.err));
  if (list.out.find(o.allocator + "\n") == std::string::npos) {
    usage_error(fmt::format(
        "--allocator {}: {} was built without it{}", o.allocator, path,
        o.allocator == "pytorch" ? fmt::format("; {}", enable_pytorch) : std::string()));
  }
}

void run_peer(const options& o, const std::string& path, std::size_t device_memory,
              config_run& run) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v = *e;
    // The configuration is the one given, not the environment's (like gpumem's replays).
    if (v.rfind("GPUMEM_SIM_MEMORY=", 0) == 0 || v.rfind("PYTORCH_CUDA_ALLOC_CONF=", 0) == 0 ||
        v.rfind("PYTORCH_ALLOC_CONF=", 0) == 0) {
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back(fmt::format("GPUMEM_SIM_MEMORY={}", device_memory));
  const child_output child =
      run_child({path, "--allocator", o.allocator, "--trace", o.trace_path, "--config",
                 run.effective, "--snapshot-device", std::to_string(o.snapshot_device)},
                env);
  if (child.status == 2) usage_error(peer_message(child.err));
  if (child.status != 0) {
    throw std::runtime_error(
        fmt::format("{} (--allocator {}, config \"{}\") exited with status {}: {}", peer_name,
                    o.allocator, run.text, child.status, peer_message(child.err)));
  }
  if (!child.err.empty()) std::fputs(child.err.c_str(), stderr);  // the allocator's warnings
  run.peer = true;
  const peer_record record(child.out, fmt::format("{} (--allocator {}, config \"{}\")", peer_name,
                                                  o.allocator, run.text));
  gpumem::replay_result& r = run.result;
  r = gpumem::replay_result{};
  r.policy = record.text("policy");
  r.completed = record.flag("completed");
  if (!r.completed) {
    r.oom_event_index = static_cast<std::size_t>(record.count("oom_event_index"));
    r.oom_message = record.text("oom_message");
    r.oom_request_bytes = record.count("oom_request_bytes");
  }
  r.peak_requested = record.count("peak_requested_bytes");
  r.peak_allocated = record.count("peak_allocated_bytes");
  r.peak_reserved = record.count("peak_reserved_bytes");
  r.events_replayed = static_cast<std::size_t>(record.count("events_replayed"));
  for (gpumem::call_kind k : gpumem::all_call_kinds) {
    r.calls[k] =
        static_cast<std::size_t>(record.count(fmt::format("calls_{}", gpumem::call_kind_name(k))));
  }
  r.wall_seconds = record.seconds("replay_seconds");
  run.peer_fields = record.fields();
}

std::optional<std::size_t> find_min_memory_peer(const options& o, const std::string& path,
                                                const config_run& run,
                                                const gpumem::compiled_trace& c) {
  constexpr std::size_t resolution = std::size_t{1} << 20;
  auto completes = [&](std::size_t bytes) {
    config_run probe;
    probe.text = run.text;
    probe.effective = run.effective;
    run_peer(o, path, bytes, probe);
    return probe.result.completed;
  };
  return gpumem::search_min_device_memory(c.peak_requested, o.min_memory_limit, resolution,
                                          completes);
}

}  // namespace gpumem_replay
