"""Build (once) and start Apicurio Registry on loopback: see README.md beside this file."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runstream.settings import cache_dir

HERE = Path(__file__).parent
VERSION = "2.4.2.Final"
APP = f"io.apicurio:apicurio-registry-app:{VERSION}"
#: The registry's own module does not index its beans for a build that depends on it.
INDEX = (
    "\nquarkus.index-dependency.registry.group-id=io.apicurio"
    "\nquarkus.index-dependency.registry.artifact-id=apicurio-registry-app\n"
)
MVN = ("mvn", "-B", "-q", "-Dcheckstyle.skip", "-Dlicense.skip", "-Denforcer.skip")


def _mvn(*args: str, cwd: Path) -> None:
    done = subprocess.run([*MVN, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mvn {' '.join(args)} failed:\n{done.stdout[-4000:]}{done.stderr}")


def build() -> Path:
    """The registry's runnable jar, built into the cache directory the first time."""
    home = cache_dir() / "registry" / VERSION
    runner = home / "app" / "target" / f"runstream-test-registry-{VERSION}-runner.jar"
    if runner.exists():
        return runner
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(HERE, home, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    _mvn("install", "-DskipTests", cwd=home / "config-index-deployment")
    _mvn(
        "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
        f"-Dartifact={APP}",
        f"-DoutputDirectory={home}",
        cwd=home,
    )
    jar = home / f"apicurio-registry-app-{VERSION}.jar"
    resources = home / "app" / "src" / "main" / "resources"
    resources.mkdir(parents=True)
    with zipfile.ZipFile(jar) as z:
        properties = z.read("application.properties").decode()
    (resources / "application.properties").write_text(properties + INDEX)
    _mvn("package", "-DskipTests", cwd=home / "app")
    return runner


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(log: Path, timeout: float = 120.0) -> Iterator[str]:
    """A registry on a free loopback port while the block runs: its Confluent API URL."""
    runner = build()
    port = _free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["java", f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1",
             "-jar", str(runner)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/apis/ccompat/v6"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/subjects", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the registry did not start: see {log}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
