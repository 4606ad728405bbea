#!/usr/bin/env python3
"""Runs PyTorch's own test/test_cuda.py on the CUDA simulator, once with PyTorch's allocator and
once per gpumem policy (libgpumem_torch.so loaded), and compares the outcomes test by test.

    python tools/pytorch_tests/run_test_cuda.py PATH/TO/test_cuda.py --build build \
        [--policies classic,expandable,stitch] [-k EXPR] [--tests FILE] [--repeat N] \
        [--timeout S] [--jobs N] [--json OUT]

PyTorch's sources are not part of gpumem: pass the path of a test_cuda.py that matches the torch
being tested (tools/pytorch_tests/README.md says how to get one). Every configuration runs the
tests one after another in a worker process that records each test's start and end in a file; a
test that kills the worker (abort, segfault) or outlives --timeout is recorded as a crash or a
timeout, and a new worker continues with the next test. The table at the end counts the outcomes
per configuration and lists the regressions: tests that pass with PyTorch's allocator and not with
gpumem. The simulator runs no kernel and keeps no device contents (a copy from the device leaves
the host buffer as it was), so a test that compares computed values passes or fails by the host
heap's leftovers: --repeat N runs every configuration N times (a new worker each time) and counts
each test's passes, and a test is a regression only when it passes with PyTorch's allocator in
most runs and fails under a policy in every run (see classify); --env MALLOC_PERTURB_=165 makes
those leftovers one byte. The exit status is 1 when there are regressions (0 with
--allow-regressions).
"""

import argparse
import concurrent.futures
import ctypes
import gc
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest

OUTCOMES = ("pass", "fail", "error", "skip", "crash", "timeout")
PASSING = ("pass",)
VMM_POLICIES = ("expandable", "stitch")  # their segments are expandable, as PyTorch's can be


# --- the worker: runs inside the process that has torch (and maybe gpumem) loaded ---------------


def _compat_shim(expandable):
    """Names the test file imports that moved between torch releases (the stored test_cuda.py
    may be a little newer than the installed torch): defined from what the installed torch has.
    The file's EXPANDABLE_SEGMENTS (read from PYTORCH_CUDA_ALLOC_CONF) says which segment layout
    its checks expect: gpumem's VMM policies have expandable segments whatever that says."""
    from torch.testing._internal import common_utils

    if expandable:
        common_utils.EXPANDABLE_SEGMENTS = True

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        import torch

        common_utils.TEST_CUDAMALLOCASYNC = (
            torch.cuda.is_available() and torch.cuda.get_allocator_backend() == "cudaMallocAsync"
        )


def _load_module(path):
    import importlib.util

    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)  # sibling test modules
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _iter_tests(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _iter_tests(item)
        else:
            yield item


def _short_id(test):
    # "module.Class.test" -> "Class.test"
    return test.id().split(".", 1)[1]


class _Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.outcome = "pass"
        self.message = ""

    def _set(self, outcome, err=None, text=""):
        order = {"pass": 0, "skip": 1, "fail": 2, "error": 3}
        if order[outcome] >= order[self.outcome]:
            self.outcome = outcome
            if err is not None:
                lines = traceback.format_exception_only(err[0], err[1])
                text = lines[-1].strip() if lines else repr(err[1])
            self.message = text.splitlines()[0][:300] if text else ""

    def addFailure(self, test, err):
        self._set("fail", err)

    def addError(self, test, err):
        self._set("error", err)

    def addSkip(self, test, reason):
        self._set("skip", text=str(reason))

    def addExpectedFailure(self, test, err):
        pass  # PyTorch marks it expected: the test passes

    def addUnexpectedSuccess(self, test):
        self._set("fail", text="unexpected success of a test marked expectedFailure")

    def addSubTest(self, test, subtest, err):
        if err is not None:
            failure = issubclass(err[0], test.failureException)
            self._set("fail" if failure else "error", err)


def worker_main(args):
    sys.argv = [args.worker_file]  # torch's common_utils parses sys.argv when imported
    import torch

    if args.worker_plugin:
        lib = ctypes.CDLL(args.worker_plugin)
        if lib.gpumem_installed() != 1:
            sys.stderr.write("run_test_cuda: the plugin loaded but did not install gpumem\n")
            return 3
    with open(args.worker_file) as f:
        if "torch.testing._internal" in f.read():
            _compat_shim(args.worker_expandable == "1")
    module = _load_module(args.worker_file)
    loader = unittest.TestLoader()
    if args.worker_list:
        ids = [_short_id(t) for t in _iter_tests(loader.loadTestsFromModule(module))]
        with open(args.worker_list, "w") as f:
            json.dump(ids, f)
        return 0
    with open(args.worker_ids) as f:
        ids = json.load(f)
    with open(args.worker_results, "a", buffering=1) as out:
        for test_id in ids:
            out.write(json.dumps({"start": test_id, "time": time.time()}) + "\n")
            out.flush()
            os.fsync(out.fileno())
            started = time.monotonic()
            result = _Result()
            try:
                loader.loadTestsFromName(test_id, module).run(result)
            except Exception as e:  # the test could not even be built
                result._set("error", (type(e), e, None))
            gc.collect()  # destructors a test left behind run inside it
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            out.write(json.dumps({"end": test_id, "outcome": result.outcome,
                                  "message": result.message,
                                  "seconds": round(time.monotonic() - started, 2)}) + "\n")
            out.flush()
            os.fsync(out.fileno())
    return 0


# --- the runner --------------------------------------------------------------------------------


def keyword_filter(expr):
    """pytest's -k: words matched case-insensitively as substrings of "Class.test", combined with
    and / or / not and parentheses."""
    if not expr:
        return lambda name: True
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    code = []
    for tok in tokens:
        if tok in ("(", ")", "and", "or", "not"):
            code.append(tok)
        else:
            code.append(f"({tok.lower()!r} in name)")
    source = " ".join(code)
    compiled = compile(source, "<-k>", "eval")
    return lambda name: bool(eval(compiled, {"__builtins__": {}}, {"name": name.lower()}))


def read_cache_var(build, var):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith(var + ":"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


class Config:
    def __init__(self, name, policy):
        self.name = name
        self.policy = policy  # None: PyTorch's own allocator

    @property
    def uses_gpumem(self):
        return self.policy is not None


class Runner:
    def __init__(self, opts):
        self.opts = opts
        self.lock = threading.Lock()
        self.workdir = tempfile.mkdtemp(prefix="gpumem-test-cuda-")

    def log(self, text):
        with self.lock:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def env(self, config, run=0):
        env = dict(os.environ)
        for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
            env.pop(var, None)
        cudasim = self.opts.cudasim
        env["LD_PRELOAD"] = f"{cudasim}/libcudart.so.13:{cudasim}/libcuda.so.1"
        env["GPUMEM_SIM_MEMORY"] = self.opts.sim_memory
        env["PYTHONUNBUFFERED"] = "1"
        # Extensions the tests compile (load_inline) go to this run's own directory, where the
        # lock of a build cut short by a crash or a timeout is removed (see release_build_locks).
        env["TORCH_EXTENSIONS_DIR"] = self.extensions_dir(config, run)
        if config.uses_gpumem:
            env["GPUMEM_ALLOC_CONF"] = f"policy:{config.policy}"
        for item in self.opts.env:
            key, _, value = item.partition("=")
            env[key] = value
        return env

    def worker_command(self, config, *extra):
        cmd = [self.opts.python, os.path.abspath(__file__), "--worker",
               "--worker-file", self.opts.test_file]
        if config.uses_gpumem:
            cmd += ["--worker-plugin", self.opts.plugin]
        if config.policy in VMM_POLICIES:
            cmd += ["--worker-expandable", "1"]
        return cmd + list(extra)

    def list_tests(self, config):
        out = os.path.join(self.workdir, f"list-{config.name}.json")
        p = subprocess.run(self.worker_command(config, "--worker-list", out),
                           env=self.env(config), capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"run_test_cuda: listing the tests under {config.name} failed "
                             f"(exit {p.returncode}):\n{p.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)

    def tag(self, config, run):
        """The name of one run of a configuration in file names and progress lines."""
        return config.name if self.opts.repeat == 1 else f"{config.name}.run{run + 1}"

    def extensions_dir(self, config, run):
        # one per run: runs of one configuration may be at work at once (--jobs)
        return os.path.join(self.workdir, "torch_extensions", self.tag(config, run))

    def run_config(self, config, ids, run=0):
        """Runs ids in order in as many workers as crashes and timeouts require."""
        results = {}
        remaining = list(ids)
        tag = self.tag(config, run)
        log_path = os.path.join(self.workdir, f"{tag}.log")
        attempt = 0
        done_count = 0
        while remaining:
            attempt += 1
            ids_path = os.path.join(self.workdir, f"{tag}-{attempt}.ids.json")
            res_path = os.path.join(self.workdir, f"{tag}-{attempt}.results")
            with open(ids_path, "w") as f:
                json.dump(remaining, f)
            open(res_path, "w").close()
            with open(log_path, "a") as log:
                log_start = log.tell()
                proc = subprocess.Popen(
                    self.worker_command(config, "--worker-ids", ids_path,
                                        "--worker-results", res_path),
                    env=self.env(config, run), stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
                current, current_start, offset = None, None, 0
                timed_out = False
                while True:
                    rc = proc.poll()
                    with open(res_path) as f:
                        f.seek(offset)
                        chunk = f.read()
                    complete = chunk[: chunk.rfind("\n") + 1]
                    offset += len(complete)
                    for line in complete.splitlines():
                        record = json.loads(line)
                        if "start" in record:
                            current, current_start = record["start"], time.monotonic()
                        else:
                            results[record["end"]] = {k: record[k] for k in
                                                      ("outcome", "message", "seconds")}
                            done_count += 1
                            self.progress(tag, record["end"], record["outcome"], done_count,
                                          len(ids))
                            current = None
                    if rc is not None:
                        break
                    if current and time.monotonic() - current_start > self.opts.timeout:
                        timed_out = True
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                        break
                    time.sleep(0.2)
            rc = proc.returncode
            if rc != 0:
                self.release_build_locks(config, run)
            finished = [i for i in remaining if i in results]
            if current is not None:
                outcome = "timeout" if timed_out else "crash"
                if timed_out:
                    message = f"still running after {self.opts.timeout:g} s"
                else:
                    message = self.crash_message(rc, log_path, log_start)
                results[current] = {"outcome": outcome, "message": message,
                                    "seconds": round(time.monotonic() - current_start, 2)}
                done_count += 1
                self.progress(tag, current, outcome, done_count, len(ids))
                finished.append(current)
            elif rc != 0 and len(finished) < len(remaining):
                # the worker died before starting a test: nothing to attribute it to
                message = self.crash_message(rc, log_path, log_start)
                for test_id in remaining:
                    if test_id not in results:
                        results[test_id] = {"outcome": "error",
                                            "message": f"worker failed to start: {message}",
                                            "seconds": 0}
                break
            remaining = [i for i in remaining if i not in results]
        return results

    def release_build_locks(self, config, run):
        """A worker killed while torch.utils.cpp_extension built leaves the build's lock file, and
        every later build of that extension would wait for it forever."""
        for root, _, files in os.walk(self.extensions_dir(config, run)):
            if "lock" in files:
                os.remove(os.path.join(root, "lock"))

    @staticmethod
    def crash_message(rc, log_path, log_start):
        if rc is not None and rc < 0:
            what = f"killed by {signal.Signals(-rc).name}"
        else:
            what = f"process exited with status {rc}"
        with open(log_path, errors="replace") as f:
            f.seek(log_start)
            tail = [line.strip() for line in f.read().splitlines() if line.strip()]
        interesting = [line for line in tail if re.search(
            r"terminate|abort|error|what\(\)|Fatal|Segmentation|gpumem", line, re.I)]
        detail = (interesting or tail or [""])[-1][:240]
        return f"{what}: {detail}" if detail else what

    def progress(self, tag, test_id, outcome, n, total):
        if outcome in PASSING and not self.opts.verbose:
            if n % 25 == 0 or n == total:
                self.log(f"[{tag}] {n}/{total}")
            return
        self.log(f"[{tag}] {n}/{total} {outcome:7} {test_id}")


SEVERITY = ("regression", "unclear", "flaky")  # the most severe first


def classify(baseline_passes, policy_passes, runs):
    """What a test's passes under a policy, against its passes with PyTorch's allocator (each out
    of runs), say. On the simulator a value check passes or fails by host-heap leftovers, under
    PyTorch's allocator too, so one failing run proves nothing:
      "regression": passes with PyTorch's allocator in most runs and under the policy in none;
      "unclear":    passes with PyTorch's allocator in some runs, not most, under the policy in
                    none (more runs decide);
      "flaky":      passes in some runs with both (under the policy not in all);
      None:         nothing lost (the policy passes every run, or PyTorch's allocator none)."""
    if baseline_passes == 0 or policy_passes == runs:
        return None
    if policy_passes > 0:
        return "flaky"
    return "regression" if 2 * baseline_passes > runs else "unclear"


def summarize(configs, runs, baseline):
    """runs[config name][i][test id]: the outcome record of run i. Returns the outcome counts
    (summed over the runs), each test's passes per configuration, and the tests some policy lost
    in some run, classified (see classify), the regressions among them."""
    counts = {}
    for config in configs:
        c = {o: 0 for o in OUTCOMES}
        for results in runs[config.name]:
            for r in results.values():
                c[r["outcome"]] += 1
        c["total"] = sum(len(results) for results in runs[config.name])
        counts[config.name] = c
    repeat = len(runs[baseline.name])
    tests = sorted(set().union(*(results for results in runs[baseline.name])))
    missing = {"outcome": "missing", "message": "", "seconds": 0}
    passes, classified, regressions = {}, [], []
    for test_id in tests:
        records = {c.name: [results.get(test_id, missing) for results in runs[c.name]]
                   for c in configs}
        passes[test_id] = {name: sum(r["outcome"] in PASSING for r in rs)
                           for name, rs in records.items()}
        lost = {}
        for config in configs:
            if config is baseline:
                continue
            verdict = classify(passes[test_id][baseline.name], passes[test_id][config.name],
                               repeat)
            if verdict:
                failed = [r for r in records[config.name] if r["outcome"] not in PASSING]
                lost[config.name] = dict(failed[0], **{
                    "class": verdict, "passes": passes[test_id][config.name],
                    "outcomes": [r["outcome"] for r in records[config.name]]})
        if not lost:
            continue
        verdict = min((r["class"] for r in lost.values()), key=SEVERITY.index)
        classified.append({"test": test_id, "class": verdict, "passes": passes[test_id],
                           "configs": lost})
        if verdict == "regression":
            regressions.append({"test": test_id, "configs": {
                name: r for name, r in lost.items() if r["class"] == "regression"}})
    return counts, passes, classified, regressions


def print_report(configs, counts, classified, regressions, repeat=1, out=sys.stdout):
    header = f"{'configuration':14}" + "".join(f"{o:>9}" for o in OUTCOMES) + f"{'total':>9}"
    if repeat > 1:
        header += f"   ({repeat} runs each, outcomes summed)"
    out.write(header + "\n")
    for config in configs:
        c = counts[config.name]
        out.write(f"{config.name:14}" + "".join(f"{c[o]:>9}" for o in OUTCOMES)
                  + f"{c['total']:>9}\n")
    if repeat > 1:
        out.write(f"\nPasses of {repeat} runs, tests that passed with PyTorch's allocator and "
                  f"failed under a policy: {len(classified)}\n")
        width = max(len(c.name) for c in configs) + 2
        out.write("".join(f"{c.name:>{width}}" for c in configs) + f"  {'class':12}test\n")
        for entry in sorted(classified, key=lambda e: (SEVERITY.index(e["class"]), e["test"])):
            out.write("".join(f"{entry['passes'][c.name]:>{width}}" for c in configs)
                      + f"  {entry['class']:12}{entry['test']}\n")
        for verdict in SEVERITY:
            n = sum(e["class"] == verdict for e in classified)
            out.write(f"  {verdict}: {n}")
        out.write("\n\nRegressions (pass with PyTorch's allocator in most runs, under a policy in "
                  f"none): {len(regressions)}\n")
    else:
        out.write("\nRegressions (pass with PyTorch's allocator, not with gpumem): "
                  f"{len(regressions)}\n")
    for reg in regressions:
        out.write(f"  {reg['test']}\n")
        for name, r in reg["configs"].items():
            out.write(f"      {name:11} {r['outcome']:8} {r['message']}\n")


def read_test_list(path):
    """--tests: an earlier --json report (its regressions, or with --repeat its classified tests)
    or a file of Class.test names, one a line."""
    with open(path) as f:
        text = f.read()
    try:
        report = json.loads(text)
    except ValueError:
        return [line.strip() for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    return [entry["test"] for entry in report.get("classified", report["regressions"])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", nargs="?", help="PyTorch's test/test_cuda.py")
    parser.add_argument("--build", default="build",
                        help="gpumem build directory (plugin, simulator, Python with torch)")
    parser.add_argument("--plugin", help="libgpumem_torch.so (default: from --build)")
    parser.add_argument("--cudasim", help="the simulator's directory (default: BUILD/cudasim)")
    parser.add_argument("--python", help="Python with torch (default: GPUMEM_TORCH_PYTHON of "
                                         "--build, else this Python)")
    parser.add_argument("--policies", default="classic,expandable,stitch")
    parser.add_argument("-k", dest="keyword", default="",
                        help="pytest-style keyword expression on Class.test")
    parser.add_argument("--tests", metavar="FILE",
                        help="only these tests: Class.test names, one a line, or an earlier "
                             "--json report (its regressions or classified tests)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run every configuration N times, each in new workers, and classify "
                             "the tests lost as regression, unclear or flaky by their passes")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per test")
    parser.add_argument("--jobs", type=int, default=1, help="configurations run at once")
    parser.add_argument("--json", help="write every outcome and the regressions here")
    parser.add_argument("--sim-memory", default="16GiB", help="GPUMEM_SIM_MEMORY")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the test processes")
    parser.add_argument("--allow-regressions", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="a line for every test")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("file", "plugin", "list", "ids", "results", "expandable"):
        parser.add_argument(f"--worker-{name}", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        return worker_main(opts)
    if not opts.test_file:
        parser.error("the path of test_cuda.py is required")
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")
    opts.test_file = os.path.abspath(opts.test_file)
    build = os.path.abspath(opts.build)
    opts.plugin = os.path.abspath(opts.plugin or
                                  os.path.join(build, "tools/torch_plugin/libgpumem_torch.so"))
    opts.cudasim = os.path.abspath(opts.cudasim or os.path.join(build, "cudasim"))
    opts.python = opts.python or read_cache_var(build, "GPUMEM_TORCH_PYTHON") or sys.executable
    for path, what in ((opts.test_file, "test file"), (opts.plugin, "plugin"),
                       (os.path.join(opts.cudasim, "libcudart.so.13"), "simulator")):
        if not os.path.exists(path):
            parser.error(f"{what} not found: {path}")

    configs = [Config("pytorch", None)]
    for policy in filter(None, opts.policies.split(",")):
        configs.append(Config(policy, policy))
    runner = Runner(opts)
    selected = keyword_filter(opts.keyword)
    ids = [i for i in runner.list_tests(configs[0]) if selected(i)]
    if opts.tests:
        wanted = set(read_test_list(opts.tests))
        unknown = sorted(wanted.difference(ids))
        if unknown:
            runner.log(f"run_test_cuda: not in the file (or not selected by -k): {unknown}")
        ids = [i for i in ids if i in wanted]
    runner.log(f"run_test_cuda: {len(ids)} tests x {len(configs)} configurations"
               + (f" x {opts.repeat} runs" if opts.repeat > 1 else "")
               + f" (logs in {runner.workdir})")
    started = time.monotonic()
    runs = {c.name: [None] * opts.repeat for c in configs}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        futures = {pool.submit(runner.run_config, c, ids, run): (c, run)
                   for run in range(opts.repeat) for c in configs}
        for future in concurrent.futures.as_completed(futures):
            config, run = futures[future]
            runs[config.name][run] = future.result()
    counts, passes, classified, regressions = summarize(configs, runs, configs[0])
    if opts.json:
        version = "import torch; print(torch.__version__, torch.version.git_version)"
        torch_info = subprocess.run([opts.python, "-c", version], capture_output=True,
                                    text=True).stdout.split()
        with open(opts.test_file, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        report = {"test_file": opts.test_file, "test_file_sha256": digest, "torch": torch_info,
                  "keyword": opts.keyword, "tests": ids if opts.tests else None,
                  "repeat": opts.repeat, "counts": counts, "regressions": regressions,
                  "classified": classified, "passes": passes,
                  # the first run's outcomes (every run's under "runs" with --repeat)
                  "results": {name: rs[0] for name, rs in runs.items()}}
        if opts.repeat > 1:
            report["runs"] = runs
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1)
    print_report(configs, counts, classified, regressions, opts.repeat)
    runner.log(f"run_test_cuda: {time.monotonic() - started:.0f} s")
    return 1 if regressions and not opts.allow_regressions else 0


if __name__ == "__main__":
    sys.exit(main())
