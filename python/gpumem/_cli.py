"""The gpumem-replay command: runs the executable that ships in the package."""

import os
import sys

from . import replay_path


def main():
    path = replay_path()
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
