"""``python -m whichgpu`` runs the command-line interface."""

from whichgpu.cli import main

if __name__ == "__main__":  # not when a spawned child process (vLLM's engine) imports it
    raise SystemExit(main())
