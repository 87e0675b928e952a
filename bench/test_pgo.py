"""Which compilations data-plane/pgo/rustc-wrapper gives the data plane's profile (bench/README.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

WRAPPER = Path(__file__).resolve().parent.parent / "data-plane" / "pgo" / "rustc-wrapper"

# How cargo calls rustc for a dependency of a release build, and for one of a dev build.
RELEASE = ["--crate-name", "tokio", "--edition=2021", "src/lib.rs", "-C", "opt-level=3", "-C", "lto"]
DEV = ["--crate-name", "tokio", "--edition=2021", "src/lib.rs", "-C", "opt-level=1"]
# What cargo sets for an integration test's `env!`: a name that is no shell identifier.
BIN_VARIABLE = "CARGO_BIN_EXE_sluice-dp"


class RustcWrapper(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-test-pgo-"))
        self.addCleanup(shutil.rmtree, self.dir)
        # The wrapper looks for the profile beside itself: a copy of it, with a profile or without.
        self.wrapper = self.dir / "rustc-wrapper"
        shutil.copy2(WRAPPER, self.wrapper)
        self.profile = self.dir / "sluice-dp.profdata"
        self.profile.write_bytes(b"counts")
        # A rustc that prints the arguments it was given, one per line, then the one variable below.
        self.rustc = self.dir / "rustc"
        self.rustc.write_text(f"#!{sys.executable}\nimport os, sys\nprint(*sys.argv[1:], sep='\\n')\n"
                              f"print('{BIN_VARIABLE}=' + os.environ.get('{BIN_VARIABLE}', 'unset'))\n")
        self.rustc.chmod(0o755)

    def compile(self, args: list[str], **env: str) -> list[str]:
        """The arguments rustc was given, checking that cargo's variables reached it."""
        out = subprocess.run([str(self.wrapper), str(self.rustc), *args], capture_output=True, text=True,
                             check=True, env={**os.environ, BIN_VARIABLE: "/bin/dp", **env})
        *given, variable = out.stdout.splitlines()
        self.assertEqual(variable, f"{BIN_VARIABLE}=/bin/dp", "a variable cargo set did not reach rustc")
        return given

    def test_a_release_compilation_gets_the_profile_beside_the_wrapper_by_its_absolute_path(self) -> None:
        self.assertEqual(self.compile(RELEASE), [*RELEASE, f"-Cprofile-use={self.profile}"])

    def test_opt_level_3_from_rustflags_counts_too(self) -> None:
        args = ["--crate-name", "x", "src/lib.rs", "-Copt-level=3"]
        self.assertEqual(self.compile(args), [*args, f"-Cprofile-use={self.profile}"])

    def test_dev_builds_and_build_scripts_are_left_as_cargo_wrote_them(self) -> None:
        self.assertEqual(self.compile(DEV), DEV)
        script = ["--crate-name", "build_script_build", "build.rs", "-C", "opt-level=0"]
        self.assertEqual(self.compile(script), script)
        self.assertEqual(self.compile(["-vV"]), ["-vV"])

    def test_a_build_that_names_a_profile_itself_keeps_only_its_own(self) -> None:
        instrumented = [*RELEASE, "-Cprofile-generate=/tmp/counts"]
        self.assertEqual(self.compile(instrumented), instrumented)
        other = [*RELEASE, "-C", "profile-use=/elsewhere.profdata"]
        self.assertEqual(self.compile(other), other)

    def test_sluice_pgo_off_or_no_profile_leaves_the_release_build_without_one(self) -> None:
        self.assertEqual(self.compile(RELEASE, SLUICE_PGO="off"), RELEASE)
        self.profile.unlink()
        self.assertEqual(self.compile(RELEASE), RELEASE)

    def test_arguments_with_spaces_reach_rustc_whole(self) -> None:
        args = ["--cfg", 'feature="a b"', "-C", "opt-level=3"]
        self.assertEqual(self.compile(args), [*args, f"-Cprofile-use={self.profile}"])


if __name__ == "__main__":
    unittest.main()


def load_pgo():
    """bench/pgo as a module (it has no .py suffix)."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("bench_pgo", str(Path(__file__).resolve().parent / "pgo"))
    spec = importlib.util.spec_from_loader("bench_pgo", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class Recording(unittest.TestCase):
    """What bench/pgo merges: the instrumented data plane's counts, nothing the build wrote."""

    def test_counts_written_while_building_are_not_merged(self) -> None:
        from unittest import mock
        pgo = load_pgo()
        work = Path(tempfile.mkdtemp(prefix="sluice-test-pgo-"))
        self.addCleanup(shutil.rmtree, work)
        counts, merged = work / "counts", []

        def build(into: Path) -> None:
            # A build script or proc macro compiled to count, run by cargo.
            (into / "default_build_script_0.profraw").write_bytes(b"build")

        def run(argv, **_kwargs):
            if argv[1:2] == ["merge"]:
                merged.extend(Path(a).name for a in argv if a.endswith(".profraw"))
            else:  # the traffic: the data plane writes its counts
                (counts / "default_dp_0.profraw").write_bytes(b"dp")
            return subprocess.CompletedProcess(argv, 0, "", "")

        (work / "out.profdata").write_bytes(b"")
        patches = [mock.patch.object(pgo, "build", build),
                   mock.patch.object(pgo, "bins_with_instrumented", lambda: work / "bins"),
                   mock.patch.object(pgo, "count_http2", lambda bins, requests: run(["h2load"])),
                   mock.patch.object(pgo, "llvm_profdata", lambda: Path("llvm-profdata")),
                   mock.patch.object(pgo, "REPO", work),
                   mock.patch.object(pgo, "PROFILE", work / "out.profdata"),
                   mock.patch.object(pgo.subprocess, "run", run),
                   mock.patch.object(pgo.shutil, "which", lambda tool: f"/usr/bin/{tool}"),
                   mock.patch.object(sys, "argv", ["bench/pgo", "--counts", str(counts)])]
        for patch in patches:
            patch.start()
            self.addCleanup(patch.stop)
        self.assertEqual(pgo.main(), 0)
        self.assertEqual(merged, ["default_dp_0.profraw"])
