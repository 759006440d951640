"""``python -m whichgpu`` runs the command-line interface."""

from whichgpu.cli import main

raise SystemExit(main())
