"""`python -m gpu_ops.cli`: the `gpu-ops` command, for a process without the console script on its PATH."""

from gpu_ops.cli import main

if __name__ == "__main__":
    main()
