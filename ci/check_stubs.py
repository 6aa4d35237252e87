"""The typed stub of te-core's nanobind module, transformer_engine/core/_te_core.pyi:
regenerated from the installed build with nanobind's stubgen and compared with the
checked-in copy (the tests session runs this). `--write` updates the copy after a
binding changed. The stub states every lib.* function's parameter names, types and
defaults, so the positional lib calls of the Python layers can be read and type-checked.
"""

import difflib
import os
import subprocess
import sys
import tempfile

MODULE = "transformer_engine.core._te_core"
STUB = "packages/te-core/python/transformer_engine/core/_te_core.pyi"


def generate() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "_te_core.pyi")
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", MODULE, "-o", out], check=True)
        with open(out) as f:
            return f.read()


def main() -> int:
    fresh = generate()
    if sys.argv[1:] == ["--write"]:
        with open(STUB, "w") as f:
            f.write(fresh)
        print(f"wrote {STUB}")
        return 0
    with open(STUB) as f:
        checked_in = f.read()
    if fresh == checked_in:
        print(f"{STUB} matches the installed build's bindings")
        return 0
    sys.stdout.writelines(difflib.unified_diff(checked_in.splitlines(True), fresh.splitlines(True), STUB, "stubgen"))
    print(f"\n{STUB} is stale: run `python ci/check_stubs.py --write` with the new build installed")
    return 1


if __name__ == "__main__":
    sys.exit(main())
