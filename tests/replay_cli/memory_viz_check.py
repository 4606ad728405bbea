#!/usr/bin/env python3
"""Rebuilds the memory of a PyTorch memory snapshot at every event the way pytorch.org/memory_viz
does in its "Allocator State History" view, and checks that every position can be drawn.

memory_viz starts from the snapshot's final segments and active blocks, and undoes the device's
trace events from the last one back to the selected one: a free_requested directly followed by the
free_completed of the same address counts as one 'free'; undoing segment_free / segment_unmap adds
the range back (an unmapped range merges with the neighbours of the same stream), undoing
segment_alloc removes the segment that starts at that address, undoing segment_map cuts the range
out of the segment that contains it; undoing alloc removes the block, undoing a free puts it back.
Then every block is drawn inside the segment that contains its address, and the reserved memory
shown is the sum of the segments' sizes.

Checked, at every position: each undone segment event finds what it undoes (the segment it
removes, the segment containing the range it cuts), an added range overlaps no segment, each undone
free_requested finds its block, and every block lies inside one segment. Prints one JSON object:
{"events": N, "reserved": [bytes at event 0, 1, ...], "errors": [...]}; exits 1 when an error was
found (--quiet: prints only the errors).

usage: memory_viz_check.py SNAPSHOT.pickle [--device N] [--quiet]
"""
import bisect
import json
import pickle
import sys


def annotate(events):
    """memory_viz's merging of free_requested + free_completed of one address into 'free'."""
    out = []
    for e in events:
        e = dict(e)
        if (e["action"] == "free_completed" and out and out[-1]["action"] == "free_requested"
                and out[-1]["addr"] == e["addr"]):
            out[-1]["action"] = "free"
            continue
        out.append(e)
    return out


class Segments:
    """Address-sorted, non-overlapping segments: [addr, size, stream]."""

    def __init__(self):
        self.segs = []

    def starts(self):
        return [s[0] for s in self.segs]

    def containing(self, addr, end):
        i = bisect.bisect_right(self.starts(), addr) - 1
        if i >= 0 and self.segs[i][0] <= addr and end <= self.segs[i][0] + self.segs[i][1]:
            return i
        return None

    def overlaps(self, addr, end):
        for s in self.segs:
            if s[0] < end and addr < s[0] + s[1]:
                return True
        return False

    def insert(self, addr, size, stream, merge):
        i = bisect.bisect_left(self.starts(), addr)
        self.segs.insert(i, [addr, size, stream])
        if not merge:
            return
        if i + 1 < len(self.segs):
            nxt = self.segs[i + 1]
            if addr + size == nxt[0] and nxt[2] == stream:
                self.segs[i][1] += nxt[1]
                del self.segs[i + 1]
        if i > 0:
            prev = self.segs[i - 1]
            if prev[0] + prev[1] == addr and prev[2] == stream:
                prev[1] += self.segs[i][1]
                del self.segs[i]

    def total(self):
        return sum(s[1] for s in self.segs)


def check(snapshot, device=0):
    errors = []
    segments = Segments()
    blocks = {}  # addr -> [size, free_requested]
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        segments.insert(seg["address"], seg["total_size"], seg["stream"], False)
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = [b["size"], b["state"] == "active_pending_free"]
            addr += b["size"]
        if addr != seg["address"] + seg["total_size"]:
            errors.append(f"segment 0x{seg['address']:x}: its blocks cover {addr - seg['address']}"
                          f" bytes of {seg['total_size']}")
    traces = snapshot["device_traces"]
    events = annotate(traces[device]) if device < len(traces) else []
    n = len(events)

    def block_inside(addr, size, where):
        if segments.containing(addr, addr + size) is None:
            errors.append(f"{where}: the block 0x{addr:x} ({size} bytes) is in no segment")

    for addr, (size, _) in blocks.items():
        block_inside(addr, size, f"event {n - 1} (final state)")
    reserved = [0] * n
    # State at position i: the final one with events i+1..n-1 undone.
    for i in range(n - 1, -1, -1):
        reserved[i] = segments.total()
        if len(errors) > 20:
            break
        e = events[i]
        a = e["action"]
        where = f"undoing event {i} ({a})"
        if a in ("segment_free", "segment_unmap"):
            if segments.overlaps(e["addr"], e["addr"] + e["size"]):
                errors.append(f"{where}: 0x{e['addr']:x} +{e['size']} overlaps a segment")
            segments.insert(e["addr"], e["size"], e["stream"], a == "segment_unmap")
        elif a in ("segment_alloc", "segment_map"):
            lo, hi = e["addr"], e["addr"] + e["size"]
            if a == "segment_alloc":
                idx = next((k for k, s in enumerate(segments.segs) if s[0] == lo), None)
                if idx is None or segments.segs[idx][1] != e["size"]:
                    errors.append(f"{where}: no segment of {e['size']} bytes at 0x{lo:x}")
                    continue
                del segments.segs[idx]
            else:
                idx = segments.containing(lo, hi)
                if idx is None:
                    errors.append(f"{where}: no segment contains 0x{lo:x} +{e['size']}")
                    continue
                s = segments.segs[idx]
                s_end = s[0] + s[1]
                if s[0] == lo:
                    s[0] += e["size"]
                    s[1] -= e["size"]
                    if s[1] == 0:
                        del segments.segs[idx]
                elif s_end == hi:
                    s[1] -= e["size"]
                else:
                    s[1] = lo - s[0]
                    segments.segs.insert(idx + 1, [hi, s_end - hi, s[2]])
            for addr, (size, _) in blocks.items():
                if addr < hi and lo < addr + size:
                    errors.append(f"{where}: the block 0x{addr:x} ({size} bytes) loses its segment")
        elif a == "alloc":
            if blocks.pop(e["addr"], None) is None:
                errors.append(f"{where}: 0x{e['addr']:x} is not a block")
        elif a == "free_requested":
            if e["addr"] not in blocks:
                errors.append(f"{where}: 0x{e['addr']:x} is not a block")
            else:
                blocks[e["addr"]][1] = False
        elif a in ("free", "free_completed"):
            blocks[e["addr"]] = [e["size"], a == "free_completed"]
            block_inside(e["addr"], e["size"], where)
        elif a in ("oom", "snapshot"):
            pass
        else:
            errors.append(f"event {i}: unknown action {a!r}")
    return {"events": n, "reserved": reserved, "errors": errors}


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    device = 0
    if "--device" in argv:
        device = int(argv[argv.index("--device") + 1])
        args.remove(str(device))
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    with open(args[0], "rb") as f:
        snapshot = pickle.load(f)
    result = check(snapshot, device)
    if "--quiet" in argv:
        for e in result["errors"]:
            print(e)
    else:
        json.dump(result, sys.stdout)
        print()
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
