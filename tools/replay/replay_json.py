"""Reads what several `gpumem-replay --json` runs appended to one file: each run prints one JSON
array of records; the arrays follow each other. Used by fidelity.sh and parity.sh."""
import json


def read_runs(path):
    """The records of every array in `path`, in order."""
    text = open(path).read()
    runs = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        obj, i = dec.raw_decode(text, i)
        runs.extend(obj)
    return runs
