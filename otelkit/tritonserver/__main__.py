"""``python -m otelkit.tritonserver ARGS``: the ``tritonserver`` bundled with nvidia-pytriton,
run with the environment and backend directory it needs (a CPU tritonserver for a job script
or a try-out; a site runs its own build). ``ARGS`` go to it as they are."""

from __future__ import annotations

import os
import sys

from otelkit.tritonserver._install import triton_install


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    install = triton_install()
    if not any(a.startswith("--backend-directory") for a in args):
        args.append(f"--backend-directory={install.backend_directory}")
    binary = str(install.binary)
    os.execve(binary, [binary, *args], install.environ())


if __name__ == "__main__":
    main()
